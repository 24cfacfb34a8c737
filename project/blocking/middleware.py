"""BlockDetectionMiddleware: a blocked response never reaches the spider.

Between HttpCompression (590) and the revisit, rendering and retry middlewares: it sees the
decompressed body, after redirects, before a 429 or 503 is taken for a transient error. A
block (project/blocking/policy.py names its signal) is counted (``blocks/count``,
``blocks/signal/<signal>``, ``blocks/<site>/<signal>``; each response looked at counts
``block_checks/<site>``) and its request tried again through
Redis after a backoff, as the URL it was leased as (not the challenge page it was sent to);
after ``BLOCK_MAX_TRIES`` blocked tries (at once with ``meta["dont_retry"]`` or
``RETRY_ENABLED = False``; ``RETRY_TIMES`` does not count them) it is a dead letter whose reason
is ``blocked: <signal>``, and the spider's errback sees an ``IgnoreRequest``: never a callback.
Without sessions, a blocking status (a 403, a 429 or 503 without Retry-After) is counted and
goes on as before (RETRY_HTTP_CODES, then the spider's errback): there is no other visitor to
try it as. Only the frontier's leases are looked at (robots.txt is not);
``meta["dont_block_check"]`` passes a request through.

With sessions (SESSION_ENABLED, or PROXY_POOL), each request of a site goes through one of
the fleet's sessions (project/blocking/pool.py): its proxy (``meta["proxy"]``, which Scrapy's
HttpProxyMiddleware turns into the proxy's credentials), its cookie jar (instead of Scrapy's
CookiesMiddleware's jar: ``dont_merge_cookies``; project/blocking/last_hop.py keeps it, and
checks the session again after the permit gate) and its user agent (SESSION_USER_AGENTS). A
request that names one (``meta["session"]``, a login flow) goes through that one; one whose
session the fleet retired is a dead letter (``session retired``). When every proxy of the
site is cooling down, a leased request goes back to Redis until the first cool-down ends
(``sessions/waited``), a robots.txt goes without a proxy. A request that sets its own
``meta["proxy"]`` keeps it, and no session.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.misc import build_from_crawler, load_object

from project.blocking.config import BlockConfig
from project.blocking.last_hop import dress, retry_copy
from project.blocking.policy import BlockPolicy
from project.blocking.pool import Session, SessionPool, SessionRetired, pool_of
from project.frontier.meta import (
    BLOCK_TRIES_META_KEY,
    LEASE_META_KEY,
    SESSION_LEFT_META_KEY,
    SESSION_META_KEY,
)
from project.frontier.retry import RetryPolicy
from project.frontier.sites import site_of
from project.utils import mask_url

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["BlockDetectionMiddleware", "BlockedRequest"]

logger = logging.getLogger(__name__)

#: A pair on probation busy: how long a request waits for it here, at most, before it goes
#: back to Redis.
_PROBATION_WAIT = 10.0


class BlockedRequest(IgnoreRequest):
    """A request blocked BLOCK_MAX_TRIES times: dead-lettered, its page never parsed."""


class BlockDetectionMiddleware:
    """Keeps blocked responses from the spider; see the module's text."""

    def __init__(
        self,
        crawler: Crawler,
        config: BlockConfig,
        policy: BlockPolicy,
        sessions: SessionPool | None = None,
    ) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.config = config
        self.policy = policy
        self.sessions = sessions
        self.retry = RetryPolicy.from_crawler(crawler)
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = BlockConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("BLOCK_ENABLED is off")
        policy_class = load_object(config.policy)
        if not (isinstance(policy_class, type) and issubclass(policy_class, BlockPolicy)):
            raise NotConfigured(f"BLOCK_POLICY {config.policy!r} is not a BlockPolicy")
        policy = build_from_crawler(policy_class, crawler)
        middleware = cls(crawler, config, policy, pool_of(crawler))
        if middleware.sessions is not None:
            crawler.signals.connect(middleware._left, signal=signals.request_left_downloader)
        return middleware

    def _left(self, request: Request, spider: object = None) -> None:
        """A request left the downloader (whatever became of it): its session's download is
        over (a redirect's answer never reaches process_response)."""
        session = request.meta.get(SESSION_META_KEY)
        pool = self.sessions
        if (
            pool is not None
            and isinstance(session, Session)
            and not request.meta.get(SESSION_LEFT_META_KEY)
        ):
            request.meta[SESSION_LEFT_META_KEY] = True
            pool.left(session)

    async def process_request(self, request: Request) -> Request | None:
        pool = self.sessions
        if pool is None or isinstance(request.meta.get(SESSION_META_KEY), Session):
            return None  # no sessions, or a redirect of a request that has one
        if request.meta.get("proxy") is not None:
            return None  # the spider's own proxy
        site = site_of(request.url)
        leased = bool(request.meta.get(LEASE_META_KEY))
        pinned = request.meta.get("session")
        pinned = str(pinned)[:100] if pinned is not None else None
        waited = 0.0
        while True:
            try:
                pick = pool.pick(site, pinned)
            except SessionRetired:
                self.stats.inc_value("sessions/pinned_retired")
                if leased:
                    self.retry.give_up(request, f"session retired: {pinned}", "session_retired")
                raise BlockedRequest(f"its session {pinned!r} was retired") from None
            if pick.session is not None or not (pick.wait < 1 and waited < _PROBATION_WAIT):
                break
            await asyncio.sleep(pick.wait)
            waited += pick.wait
        if pick.session is None:
            self.stats.inc_value("sessions/waited")
            if not leased:
                return None  # robots.txt: without a proxy rather than not at all
            copy = retry_copy(request)
            self.retry.again(request, copy, max(1.0, pick.wait), "no proxy available")
            logger.info(
                "No proxy of %s may take a request now (%s): %s waits %.0f s in Redis",
                site, pool.why_waiting(site), mask_url(request.url), max(1.0, pick.wait),
            )  # fmt: skip
            return copy
        dress(request, pool, pick)  # its cookies go on at the last hop (960)
        return None

    def process_exception(self, request: Request, exception: Exception) -> None:
        self._left(request)  # it may never have reached the downloader

    def process_response(self, request: Request, response: Response) -> Request | Response:
        self._left(request)  # an answer from the cache (900) never left the downloader
        pool, session = self.sessions, request.meta.get(SESSION_META_KEY)
        if pool is None or not isinstance(session, Session):
            pool = session = None
        if not request.meta.get(LEASE_META_KEY) or request.meta.get("dont_block_check"):
            if pool is not None and session is not None:
                # a robots.txt tells nothing of the pages: it neither proves nor bans the pair
                pool.ended(session, None)
            return response
        site = site_of(request.url)
        spider = self.crawler.spider
        assert spider is not None
        signal = self.policy.blocked(request, response, site, spider)
        self.stats.inc_value(f"block_checks/{site}")
        if pool is not None and session is not None:
            pool.ended(session, signal is not None)
        if signal is None:
            self.policy.passed(response, site)
            return response
        for key in ("blocks/count", f"blocks/signal/{signal}", f"blocks/{site}/{signal}"):
            self.stats.inc_value(key)
        if self.sessions is None and signal.startswith("status_"):
            # no other visitor to try it as: the answer goes on as Scrapy users expect it
            # (the retries' RETRY_HTTP_CODES, then the spider's errback), counted as a block
            return response
        tries = _tries(request) + 1
        error = f"blocked: {signal}"
        if (
            tries >= self.config.max_tries
            or request.meta.get("dont_retry")
            or not self.retry.config.enabled
        ):
            self.retry.give_up(request, error, "blocked", attempts=tries)
            raise BlockedRequest(f"{error} ({tries} tries)")
        copy = retry_copy(request)
        copy.meta[BLOCK_TRIES_META_KEY] = tries
        self.retry.again(request, copy, self.retry.backoff(tries - 1), error)
        logger.info(
            "Blocked (%s): %s, try %d of %d", signal, mask_url(request.url), tries,
            self.config.max_tries,
        )  # fmt: skip
        return copy


def _tries(request: Request) -> int:
    value = request.meta.get(BLOCK_TRIES_META_KEY)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1000:
        return value
    return 0
