"""robots.txt fetched once per site for the whole fleet, cached in Redis.

Scrapy's own ``RobotsTxtMiddleware`` decides what is allowed. It downloads a
site's ``/robots.txt`` through the downloader middlewares, where
:class:`RobotsCacheMiddleware` answers from ``<prefix>:robots`` when a fresh copy
is there; otherwise one node per fleet (the holder of a redis-py ``Lock``)
downloads it and stores what came back, while the others wait for that copy.
A ``Crawl-delay``, read when Scrapy sends ``robots_parsed``, caps the site's
fleet-wide rate in ``<prefix>:limits``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import LockError, RedisError
from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.responsetypes import responsetypes
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from project.config import read_settings, setting
from project.frontier.config import FrontierConfig, SiteLimits
from project.frontier.keys import FrontierKeys
from project.frontier.meta import ROBOTS_LOCK_META_KEY, ROBOTS_SITE_META_KEY
from project.frontier.sites import SiteResolver, site_of
from project.frontier.spiders import seed_key

if TYPE_CHECKING:
    from typing import Self

    import redis.asyncio
    from redis.asyncio.lock import Lock
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.robotstxt import RobotParser
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

__all__ = ["LOCK_SECONDS", "ExpiringRobotsTxtMiddleware", "RobotsCacheMiddleware", "RobotsConfig"]

logger = logging.getLogger(__name__)

#: Flag of a robots.txt response that came from the fleet's cache.
CACHED_FLAG = "fleet-robots-cache"


#: How long one node may hold a site's robots.txt fetch: other nodes wait at most this long
#: for its copy, then fetch it themselves (a former setting, project.frontier.compat.RETIRED).
LOCK_SECONDS = 30.0


@dataclass(frozen=True)
class RobotsConfig:
    """How long a robots.txt copy serves the fleet, and how long one node may fetch it."""

    max_age: float = setting("FRONTIER_ROBOTSTXT_CACHE_SECONDS", 86400.0)
    lock_seconds: float = LOCK_SECONDS
    #: Longer robots.txt files are cut here, as Google does at 500 KiB.
    max_bytes: int = setting("FRONTIER_ROBOTSTXT_MAX_BYTES", 512000)
    #: Scrapy's ROBOTSTXT_USER_AGENT, else USER_AGENT: whose Crawl-delay applies.
    user_agent: str = ""
    #: FRONTIER_SITE_CONCURRENCY: the cap a site keeps when its Crawl-delay sets its rate.
    concurrency: int = 0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(
            **read_settings(
                cls,
                settings,
                user_agent=settings.get("ROBOTSTXT_USER_AGENT") or settings.get("USER_AGENT"),
                concurrency=SiteLimits.from_settings(settings).concurrency,
            )
        )


def _is_robots_fetch(request: Request) -> bool:
    # What RobotsTxtMiddleware downloads (/robots.txt, marked not to obey itself), or a
    # spider's own GET of it (SitemapSpider reads its Sitemap: lines): the same fleet copy.
    parts = urlparse_cached(request)
    if parts.path != "/robots.txt" or parts.query:
        return False
    return bool(request.meta.get("dont_obey_robotstxt")) or request.method == "GET"


class RobotsCacheMiddleware:
    """Downloader middleware: robots.txt from the fleet's Redis cache, fetched once per fleet."""

    def __init__(self, crawler: Crawler, config: RobotsConfig, frontier: FrontierConfig) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.config = config
        self.redis_url = frontier.redis_url
        self._frontier = frontier
        ip_mode = frontier.site_key == "ip"
        self._resolver = SiteResolver(frontier.site_ip_ttl) if ip_mode else None
        self.stats: StatsCollector = crawler.stats
        self._server: redis.asyncio.Redis | None = None
        self._keys: FrontierKeys | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        if not settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured("ROBOTSTXT_OBEY is off")
        middleware = cls(
            crawler,
            RobotsConfig.from_settings(settings),
            FrontierConfig.from_settings(settings),
        )
        crawler.signals.connect(middleware.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(middleware.robots_parsed, signal=signals.robots_parsed)
        return middleware

    def spider_opened(self, spider: Spider) -> None:
        self._server = self._frontier.client()
        keys = FrontierKeys.from_settings(self.crawler.settings, spider.name)
        # the spider's own redis_key, tagged (Redis Cluster), moves every key into its slot
        self._keys = keys.with_start_urls(seed_key(spider, keys.start_urls))

    async def spider_closed(self, spider: Spider) -> None:
        if self._server is not None:
            await self._server.aclose()

    async def process_request(self, request: Request) -> Response | None:
        """A cached copy, or None after taking the fleet's fetch lock (or giving up on it)."""
        if (
            not _is_robots_fetch(request)
            or self._server is None
            or ROBOTS_SITE_META_KEY in request.meta
        ):
            return None  # not robots.txt, no Redis, or a redirect of a fetch under way
        netloc = urlparse_cached(request).netloc
        request.meta[ROBOTS_SITE_META_KEY] = netloc
        try:
            cached = await self._cached(request, netloc)
            if cached is not None:
                return cached
            assert self._keys is not None
            lock = self._server.lock(
                self._keys.robots_lock(netloc),
                timeout=self.config.lock_seconds,
                blocking_timeout=self.config.lock_seconds,
            )
            # Whoever holds the lock is downloading it: wait, then use their copy.
            if await lock.acquire():
                cached = await self._cached(request, netloc)
                if cached is not None:
                    await _release(lock)
                    return cached
                request.meta[ROBOTS_LOCK_META_KEY] = lock
            # else the holder died or is slow: fetch it ourselves
        except RedisError as exc:
            logger.warning("robots.txt cache unreachable (%s); fetching %s locally", exc, netloc)
        return None

    async def process_response(self, request: Request, response: Response) -> Response:
        """Store a fetched robots.txt for the fleet and release the lock."""
        site = request.meta.get(ROBOTS_SITE_META_KEY)
        if site is None or CACHED_FLAG in response.flags or 300 <= response.status < 400:
            return response  # not ours, from the cache, or a redirect still to be followed
        lock = request.meta.pop(ROBOTS_LOCK_META_KEY, None)
        if len(response.body) > self.config.max_bytes:
            self.stats.inc_value("robotstxt/truncated")
            response = response.replace(body=response.body[: self.config.max_bytes])
        if self._server is not None and self._keys is not None:
            entry = {
                "time": time.time(),
                "status": response.status,
                "body": response.body.decode("utf-8", "replace"),
            }
            try:
                await self._server.hset(self._keys.robots, site, json.dumps(entry))
            except RedisError as exc:
                logger.warning("Cannot share robots.txt of %s (%s)", request.url, exc)
        if lock is not None:
            await _release(lock)
        return response

    async def process_exception(self, request: Request, exception: Exception) -> None:
        """The fetch failed: let another node try."""
        lock = request.meta.pop(ROBOTS_LOCK_META_KEY, None)
        if lock is not None:
            await _release(lock)

    async def _cached(self, request: Request, netloc: str) -> Response | None:
        assert self._server is not None
        assert self._keys is not None
        raw: Any = await self._server.hget(self._keys.robots, netloc)
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
            fresh = time.time() - float(entry["time"]) < self.config.max_age
            status, body = int(entry.get("status", 200)), str(entry["body"]).encode("utf-8")
        except (ValueError, KeyError, TypeError):
            return None  # an unreadable entry is fetched again and replaced
        if not fresh:
            return None
        self.stats.inc_value("robotstxt/shared_hits")
        # text, as the site would serve it: a spider reads response.text
        cls = responsetypes.from_args(url=request.url, body=body)
        return cls(request.url, status=status, body=body, flags=[CACHED_FLAG], request=request)

    async def robots_parsed(self, robotparser: RobotParser, request: Request) -> None:
        """Crawl-delay caps the site's fleet-wide rate at one request per delay."""
        delay = robotparser.crawl_delay(self.config.user_agent)
        if not delay or self._server is None or self._keys is None:
            return
        site = site_of(request.url)
        if self._resolver is not None:
            site = await self._resolver.resolve(site)  # FRONTIER_SITE_KEY = "ip": by address
        rate = 1.0 / float(delay)
        try:
            current: Any = await self._server.hget(self._keys.limits, site)
            default = ("0", str(self.config.concurrency))
            cap, concurrency = current.decode().split() if current else default
            if float(cap) <= 0 or rate < float(cap):
                await self._server.hset(self._keys.limits, site, f"{rate} {concurrency}")
                logger.info(
                    "Crawl-delay %ss of %s: fleet-wide rate capped at %.2f requests/s",
                    delay,
                    site,
                    rate,
                )
        except RedisError as exc:
            logger.warning("Cannot apply Crawl-delay of %s (%s)", site, exc)


class ExpiringRobotsTxtMiddleware(RobotsTxtMiddleware):
    """Scrapy's RobotsTxtMiddleware, whose parsers expire after ``FRONTIER_ROBOTSTXT_CACHE_SECONDS``.

    Scrapy keeps each site's parser for the life of the process; a node that crawls
    for days would never see a site change its robots.txt. Past the age the next
    request of the site fetches it again (from the fleet's copy in Redis, if fresh).
    It relies on one private attribute, the ``_parsers`` dict keyed by netloc
    (checked by tests/test_engine_contract.py on the installed Scrapy).
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._max_age = RobotsConfig.from_settings(crawler.settings).max_age
        self._fetched_at: dict[str, float] = {}

    async def robot_parser(self, request: Request) -> RobotParser | None:
        netloc = urlparse_cached(request).netloc
        now = time.monotonic()
        fetched_at = self._fetched_at.setdefault(netloc, now)
        parsers = self._parsers
        if now - fetched_at > self._max_age and not isinstance(parsers.get(netloc), Deferred):
            parsers.pop(netloc, None)  # a fetch under way (a Deferred) is left to finish
            self._fetched_at[netloc] = now
            self._stats.inc_value("robotstxt/expired")
        return await super().robot_parser(request)


async def _release(lock: Lock) -> None:
    # Expired meanwhile, or Redis away: the lock times out by itself.
    with contextlib.suppress(LockError, RedisError):
        await lock.release()
