"""Scheduler that shares one leased frontier in Redis between many nodes."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import redis.asyncio
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.defer import deferred_from_coro
from scrapy_redis.scheduler import Scheduler

from project.frontier.config import FrontierConfig
from project.frontier.dupefilter import FleetDupeFilter
from project.frontier.keys import FrontierKeys, KeyTemplates
from project.frontier.layout import ensure_layout
from project.frontier.loop import LEASE_META_KEY, FrontierLoop
from project.frontier.queue import LeasedQueue
from project.frontier.sites import site_of
from project.frontier.wire import UnserializableRequestError, encode_request
from project.storage.deadletters import DeadLetterSink
from project.utils import mask_url

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

__all__ = ["FleetScheduler"]

logger = logging.getLogger(__name__)


class FleetScheduler(Scheduler):  # type: ignore[misc]
    """scrapy-redis scheduler with leases, batching and fleet-wide termination.

    The engine-facing methods never touch the network: they hand requests to
    and take leases from a :class:`~project.frontier.loop.FrontierLoop`, whose
    task does all Redis I/O, one Lua round trip per tick.
    """

    def __init__(self, crawler: Crawler, config: FrontierConfig, templates: KeyTemplates) -> None:
        super().__init__(
            server=None,
            persist=True,
            queue_key=templates.queue,
            dupefilter_key=templates.dupefilter,
        )
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.templates = templates
        self.node_id = config.node_id
        self.loop: FrontierLoop | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        return cls(
            crawler, FrontierConfig.from_settings(settings), KeyTemplates.from_settings(settings)
        )

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not hasattr(spider, "request_from_seed"):
            raise NotConfigured(
                f"{type(spider).__name__} must extend project.frontier.spiders.FleetSpider"
                " to be scheduled by FleetScheduler"
            )
        self.spider = spider
        config = self.config
        self.server = redis.asyncio.from_url(
            config.redis_url, socket_timeout=30, socket_connect_timeout=10
        )
        self.keys = FrontierKeys.for_spider(spider.name, self.templates)
        self.queue = LeasedQueue(
            self.server,
            spider,
            self.keys,
            self.node_id,
            int(config.lease_seconds * 1000),
            config.limits,
        )
        self.df = FleetDupeFilter.from_crawler(self.crawler)
        self.loop = FrontierLoop(
            self.crawler, spider, config, self.queue, DeadLetterSink.from_crawler(self.crawler)
        )
        if config.limits.adaptive:
            self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        self.crawler.signals.connect(self._on_spider_idle, signal=signals.spider_idle)
        logger.info(
            "Frontier node %s on %s (queue %s, lease %.0fs)",
            self.node_id,
            mask_url(config.redis_url),
            self.keys.queue,
            config.lease_seconds,
            extra={"spider": spider},
        )
        await ensure_layout(self.server, self.keys)
        # "*" records this fleet's defaults for status readers; the Lua
        # scripts take the defaults from each node's own settings.
        await self.server.hset(self.keys.limits, mapping=config.site_caps())  # type: ignore[arg-type]
        self.loop.start()

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        if self.loop is not None:
            await self.loop.stop()
            self.loop.dead_sink.kick()
            await self.loop.dead_sink.close()
        await self.server.aclose()

    # -- engine interface (no I/O) -----------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        assert self.loop is not None
        # A redirect or retry of a request this node holds: its lease is
        # settled when the original leaves the engine.
        request.meta.pop(LEASE_META_KEY, None)
        try:
            payload = encode_request(request, self.spider, id=os.urandom(6).hex())
        except UnserializableRequestError:
            self.stats.inc_value("frontier/unserializable")
            raise
        # Requests that skip the filter still mark their URL as seen.
        fp = (b"m" if request.dont_filter else b"f") + self.df.fingerprint(request)
        self.loop.buffer(fp, site_of(request.url), request.priority, payload)
        return True

    def next_request(self) -> Request | None:
        return self.loop.pop() if self.loop is not None else None

    def has_pending_requests(self) -> bool:
        return self.loop is not None and self.loop.has_pending()

    def __len__(self) -> int:
        return len(self.loop) if self.loop is not None else 0

    @property
    def held_leases(self) -> int:
        """Requests this node holds: leased but not yet settled."""
        return self.loop.held if self.loop is not None else 0

    def _on_spider_idle(self, spider: Spider) -> None:
        if self.loop is None or not self.loop.finished:
            raise DontCloseSpider

    def _on_response(self, response: Any, request: Request) -> None:
        latency = request.meta.get("download_latency")
        if latency is not None and self.loop is not None:
            self.loop.record_latency(request.url, float(latency))
