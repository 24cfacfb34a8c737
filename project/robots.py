"""robots.txt fetched once per site for the whole fleet, cached in Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio
from protego import Protego
from redis.exceptions import RedisError
from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from scrapy_redis import defaults
from twisted.internet.defer import Deferred

from project.queue import FrontierKeys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.robotstxt import RobotParser

__all__ = ["FleetRobotsTxtMiddleware"]

logger = logging.getLogger(__name__)

_LOCK_SECONDS = 30
_POLL_SECONDS = 0.2


class FleetRobotsTxtMiddleware(RobotsTxtMiddleware):
    """Scrapy's RobotsTxtMiddleware with one fetch per site per fleet.

    The first node to need a site's robots.txt takes a lock in Redis,
    downloads it and stores it in ``<spider>:robots``; the others wait for
    that copy. A ``Crawl-delay`` caps the site's fleet-wide rate
    (``<spider>:limits``) at one request per delay.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._max_age = crawler.settings.getfloat("ROBOTSTXT_CACHE_SECONDS", 86400.0)
        self._server: redis.asyncio.Redis | None = None
        self._keys: FrontierKeys | None = None
        self._robots_key = ""
        crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    def _spider_opened(self, spider: Any) -> None:
        settings = self.crawler.settings
        self._server = redis.asyncio.from_url(settings.get("REDIS_URL"))
        self._keys = FrontierKeys.for_spider(
            spider.name,
            settings.get("SCHEDULER_QUEUE_KEY", defaults.SCHEDULER_QUEUE_KEY),
        )
        self._robots_key = f"{spider.name}:robots"

    async def _spider_closed(self, spider: Any) -> None:
        if self._server is not None:
            await self._server.aclose()

    async def robot_parser(self, request: Request) -> RobotParser | None:
        netloc = urlparse_cached(request).netloc
        if netloc in self._parsers or self._server is None:
            return await super().robot_parser(request)
        # Other requests for this site wait on the Deferred, as in Scrapy's.
        waiting: Deferred[RobotParser | None] = Deferred()
        self._parsers[netloc] = waiting
        try:
            body = await self._shared_body(request, netloc)
        except RedisError as exc:
            logger.warning("robots.txt cache unreachable (%s); fetching %s locally", exc, netloc)
            body = await self._download(request)
        parser = build_from_crawler(self._parserimpl, self.crawler, body)
        self._parsers[netloc] = parser
        waiting.callback(parser)
        await self._apply_crawl_delay(netloc, body)
        return parser

    async def _shared_body(self, request: Request, netloc: str) -> bytes:
        assert self._server is not None
        assert self._keys is not None
        key = self._robots_key
        lock_key = f"{key}:lock:{netloc}"
        deadline = time.monotonic() + _LOCK_SECONDS
        while True:
            cached = await self._server.hget(key, netloc)
            if cached is not None:
                entry = json.loads(cached)
                if time.time() - entry["time"] < self._max_age:
                    self._stats.inc_value("robotstxt/shared_hits")
                    return str(entry["body"]).encode("utf-8")
            if await self._server.set(lock_key, b"1", nx=True, ex=_LOCK_SECONDS):
                break
            if time.monotonic() > deadline:
                break  # the lock holder died: fetch it ourselves
            await asyncio.sleep(_POLL_SECONDS)
        body = await self._download(request)
        entry = {"time": time.time(), "body": body.decode("utf-8", "replace")}
        await self._server.hset(key, netloc, json.dumps(entry))
        await self._server.delete(lock_key)
        return body

    async def _download(self, request: Request) -> bytes:
        url = urlparse_cached(request)
        robots = Request(
            f"{url.scheme}://{url.netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True, "dont_retry": True},
            callback=NO_CALLBACK,
        )
        self._stats.inc_value("robotstxt/request_count")
        try:
            response = await self.crawler.engine.download_async(robots)
        except Exception as exc:  # noqa: BLE001 (any failure means: no rules)
            logger.warning("robots.txt of %s unavailable (%s): allowing all", url.netloc, exc)
            return b""
        self._stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        return response.body if response.status == 200 else b""

    async def _apply_crawl_delay(self, netloc: str, body: bytes) -> None:
        if not body:
            return
        agent = self._robotstxt_useragent or self._default_useragent
        delay = Protego.parse(body.decode("utf-8", "replace")).crawl_delay(agent)
        if not delay:
            return
        assert self._server is not None
        assert self._keys is not None
        site = netloc.lower()
        rate = 1.0 / float(delay)
        current: Any = await self._server.hget(self._keys.limits, site)
        cap, concurrency = current.decode().split() if current else ("0", "0")
        if float(cap) <= 0 or rate < float(cap):
            await self._server.hset(self._keys.limits, site, f"{rate} {concurrency}")
            logger.info(
                "Crawl-delay %ss of %s: fleet-wide rate capped at %.2f requests/s",
                delay,
                site,
                rate,
            )
