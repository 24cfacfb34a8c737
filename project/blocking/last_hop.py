"""SessionLastHopMiddleware: a request's session, checked again just before the wire.

BlockDetectionMiddleware (585) picks a request's session before the request waits for its
node's permit (PermitGateMiddleware, 950); while it waits, a step may retire the session
(another node saw it blocked) or the node may ban its proxy for the site. Here, after the
gate (960), such a request takes another session of the site (``sessions/repicked``), or
goes back to Redis when none may take it now. A request pinned to a session
(``meta["session"]``) whose session retired is a dead letter, as at 585.

It also keeps the session's cookie jar: the jar's cookies go on each request as it leaves,
redirects included (a redirect's copy would carry the Cookie header of the page before), and
every answer's ``Set-Cookie`` goes into the jar here, before RedirectMiddleware (600) turns
a 302 into the next request: the cookie a login POST sets on its redirect is kept. A Cookie
header the spider set itself is left as it is; cookies it gave as ``Request(cookies=...)`` go
into the session's jar as Scrapy's CookiesMiddleware would put them into its own, so the
session sends them from then on, on every node.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured

from project.blocking.pool import Pick, Session, SessionPool, pool_of
from project.frontier.meta import (
    LEASE_META_KEY,
    SESSION_COOKIE_META_KEY,
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

__all__ = ["SessionLastHopMiddleware", "dress", "retry_copy"]

logger = logging.getLogger(__name__)

#: The meta keys of a redirect, dropped from the retry of a request redirected to a block.
_REDIRECT_META = ("redirect_urls", "redirect_reasons", "redirect_times", "redirect_ttl")


class SessionRetiredError(IgnoreRequest):
    """A request's session was retired before it could go: dead-lettered."""


def dress(request: Request, pool: SessionPool, pick: Pick) -> Session:
    """Send *request* as *pick*'s session: its proxy (``None``: the node's own address) and
    its user agent; the cookies go on at the last hop. Counted as a download of it."""
    session = pick.session
    assert session is not None
    request.meta[SESSION_META_KEY] = session
    request.meta["dont_merge_cookies"] = True
    request.meta["proxy"] = pick.proxy.url if pick.proxy is not None and pick.proxy.url else None
    agent = pool.user_agent(session)
    if agent is not None:
        request.headers[b"User-Agent"] = agent
    request.meta.pop(SESSION_LEFT_META_KEY, None)
    pool.started(session)
    return session


def retry_copy(request: Request) -> Request:
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


class SessionLastHopMiddleware:
    """Downloader middleware after the permit gate; see the module's text."""

    def __init__(self, crawler: Crawler, pool: SessionPool) -> None:
        assert crawler.stats is not None
        self.pool = pool
        self.stats = crawler.stats
        self.retry = RetryPolicy.from_crawler(crawler)
        try:
            self.proxies: HttpProxyMiddleware | None = HttpProxyMiddleware.from_crawler(crawler)
        except NotConfigured:
            self.proxies = None
        #: Scrapy's reading of ``Request.cookies`` (a dict or a list of dicts) into a jar
        self._cookies = CookiesMiddleware()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        pool = pool_of(crawler)
        if pool is None:
            raise NotConfigured("no sessions (SESSION_ENABLED off, no PROXY_POOL)")
        return cls(crawler, pool)

    def process_request(self, request: Request) -> Request | None:
        session = request.meta.get(SESSION_META_KEY)
        if not isinstance(session, Session):
            return None
        if not self.pool.usable(session):
            replaced = self._another(request, session)
            if replaced is not None:
                return replaced
            session = request.meta[SESSION_META_KEY]
        if request.meta.get(SESSION_COOKIE_META_KEY) or b"Cookie" not in request.headers:
            if request.cookies and not request.meta.get(SESSION_COOKIE_META_KEY):
                self._take_cookies(request, session)
            request.headers.pop(b"Cookie", None)
            session.jar.add_cookie_header(request)
            request.meta[SESSION_COOKIE_META_KEY] = True
        return None

    def process_response(self, request: Request, response: Response) -> Response:
        session = request.meta.get(SESSION_META_KEY)
        if isinstance(session, Session) and 200 <= response.status < 400:
            session.jar.extract_cookies(response, request)
        return response

    def _take_cookies(self, request: Request, session: Session) -> None:
        """The spider's ``Request(cookies=...)`` into *session*'s jar, once per request."""
        try:
            cookies = self._cookies._get_request_cookies(session.jar, request)
            self._cookies._process_cookies(cookies, jar=session.jar, request=request)
        except (
            AssertionError,
            AttributeError,
            TypeError,
            ValueError,
        ) as exc:  # Scrapy refuses them
            self.stats.inc_value("sessions/cookies_refused")
            logger.warning("cookies of %s not used: %s", mask_url(request.url), exc)

    def _another(self, request: Request, old: Session) -> Request | None:
        """*old* retired or its pair cooling since it was picked: another session of the
        site on *request* (None), or the request's retry through Redis."""
        pool = self.pool
        if not request.meta.get(SESSION_LEFT_META_KEY):
            request.meta[SESSION_LEFT_META_KEY] = True
            pool.left(old)
        leased = bool(request.meta.get(LEASE_META_KEY))
        pinned = request.meta.get("session")
        if pinned is not None:
            self.stats.inc_value("sessions/pinned_retired")
            if leased:
                self.retry.give_up(request, f"session retired: {old.id}", "session_retired")
            raise SessionRetiredError(f"its session {old.id!r} was retired")
        site = site_of(request.url)
        pick = pool.pick(site)
        if pick.session is None:
            self.stats.inc_value("sessions/waited")
            if not leased:
                raise SessionRetiredError("its session was retired and no other may take it")
            copy = retry_copy(request)
            self.retry.again(request, copy, max(1.0, pick.wait), "no proxy available")
            logger.info(
                "The session of %s retired while it waited, and no other may take it now"
                " (%s): it waits %.0f s in Redis",
                mask_url(request.url), pool.why_waiting(site), max(1.0, pick.wait),
            )  # fmt: skip
            return copy
        dress(request, pool, pick)
        if self.proxies is not None:
            self.proxies.process_request(request)
        self.stats.inc_value("sessions/repicked")
        return None
