"""BlockDetectionMiddleware: a blocked response never reaches the spider.

Between HttpCompression (590) and the revisit, rendering and retry middlewares: it sees the
decompressed body, after redirects, before a 429 or 503 is taken for a transient error. A
block (project/blocking/policy.py names its signal) is counted (``blocks/count``,
``blocks/signal/<signal>``, ``blocks/<site>/<signal>``) and its request tried again through
Redis after a backoff, as the URL it was leased as (not the challenge page it was sent to);
after ``BLOCK_MAX_TRIES`` blocked tries (at once with ``meta["dont_retry"]`` or
``RETRY_ENABLED = False``; ``RETRY_TIMES`` does not count them) it is a dead letter whose reason
is ``blocked: <signal>``, and the spider's errback sees an ``IgnoreRequest``: never a callback.
Only the frontier's leases are looked at (robots.txt is not); ``meta["dont_block_check"]``
passes a request through.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.misc import build_from_crawler, load_object

from project.blocking.config import BlockConfig
from project.blocking.policy import BlockPolicy
from project.frontier.meta import BLOCK_TRIES_META_KEY, LEASE_META_KEY
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

#: The meta keys of a redirect, dropped from the retry of a request redirected to a block.
_REDIRECT_META = ("redirect_urls", "redirect_reasons", "redirect_times", "redirect_ttl")


class BlockedRequest(IgnoreRequest):
    """A request blocked BLOCK_MAX_TRIES times: dead-lettered, its page never parsed."""


class BlockDetectionMiddleware:
    """Keeps blocked responses from the spider; see the module's text."""

    def __init__(self, crawler: Crawler, config: BlockConfig, policy: BlockPolicy) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.config = config
        self.policy = policy
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
        return cls(crawler, config, build_from_crawler(policy_class, crawler))

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if not request.meta.get(LEASE_META_KEY) or request.meta.get("dont_block_check"):
            return response
        site = site_of(request.url)
        spider = self.crawler.spider
        assert spider is not None
        signal = self.policy.blocked(request, response, site, spider)
        if signal is None:
            self.policy.passed(response, site)
            return response
        tries = _tries(request) + 1
        for key in ("blocks/count", f"blocks/signal/{signal}", f"blocks/{site}/{signal}"):
            self.stats.inc_value(key)
        error = f"blocked: {signal}"
        if (
            tries >= self.config.max_tries
            or request.meta.get("dont_retry")
            or not self.retry.config.enabled
        ):
            self.retry.give_up(request, error, "blocked", attempts=tries)
            raise BlockedRequest(f"{error} ({tries} tries)")
        copy = _retry_copy(request)
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


def _retry_copy(request: Request) -> Request:
    """*request* again as it was leased: a request redirected to a block is tried again at
    the URL it came from."""
    redirects = request.meta.get("redirect_urls")
    copy = request.copy()
    if isinstance(redirects, list) and redirects and isinstance(redirects[0], str):
        copy = copy.replace(url=redirects[0])
        for key in _REDIRECT_META:
            copy.meta.pop(key, None)
    copy.dont_filter = True
    return copy
