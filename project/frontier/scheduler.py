"""Scheduler that shares one leased frontier in Redis between many nodes."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import redis.asyncio
from redis.exceptions import AuthenticationError, RedisError
from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from scrapy_redis.scheduler import Scheduler

from project.frontier.config import FrontierConfig
from project.frontier.dupefilter import FleetDupeFilter
from project.frontier.keys import FrontierKeys, KeyTemplates
from project.frontier.layout import ensure_layout
from project.frontier.loop import LEASE_META_KEY, OUTCOME_META_KEY, SEED_META_KEY, FrontierLoop
from project.frontier.queue import LeasedQueue
from project.frontier.retry import RetryPolicy
from project.frontier.sites import (
    SiteResolver,
    is_private_host,
    related_hosts,
    site_of,
    url_refusal,
)
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
        #: Why this node cannot work (a close reason), once it knows.
        self.fatal: str | None = None

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
        # No I/O here: Redis is first asked once every component is open (_connect),
        # so a node that cannot reach it closes cleanly, with one line saying why.
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
            config.max_deliveries,
        )
        self.df = FleetDupeFilter.from_crawler(self.crawler)
        self.loop = FrontierLoop(
            self.crawler, spider, config, self.queue, DeadLetterSink.from_crawler(self.crawler)
        )
        if config.limits.adaptive:
            self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        self.crawler.signals.connect(self._on_spider_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._connect, signal=signals.spider_opened)
        self._retry = RetryPolicy.from_crawler(self.crawler)
        self.crawler.signals.connect(self._on_item_error, signal=signals.item_error)
        self.crawler.signals.connect(self._exit_status, signal=signals.spider_closed)

    async def _connect(self, spider: Spider) -> None:
        """Reach Redis and start the frontier; if it cannot work, say why and close."""
        config = self.config
        where = mask_url(config.redis_url)
        if not hasattr(spider, "request_from_seed"):
            self._fail(
                "not_a_fleet_spider",
                "%s must extend project.frontier.spiders.FleetSpider to be scheduled by"
                " FleetScheduler",
                type(spider).__name__,
            )
        try:
            await self._ping()
        except AuthenticationError as exc:
            self._fail(
                "redis_auth",
                "Redis at %s refused the password (%s): put it in REDIS_URL"
                " (redis://:PASSWORD@host:port/0)",
                where,
                exc,
            )
        except RedisError as exc:
            self._fail(
                "redis_unreachable",
                "Redis at %s unreachable for %.0fs (%s): start it (fleetcrawl services start)"
                " or point REDIS_URL at it",
                where,
                config.connect_timeout,
                exc,
            )
        logger.info(
            "Frontier node %s on %s (queue %s, lease %.0fs)",
            self.node_id,
            where,
            self.keys.queue,
            config.lease_seconds,
            extra={"spider": spider},
        )
        await ensure_layout(self.server, self.keys)
        # "*" records this fleet's defaults for status readers; the Lua
        # scripts take the defaults from each node's own settings.
        caps = config.site_caps()
        allowed = {site.lower() for site in config.allowed_sites}
        if config.site_key == "ip":
            # Sites are servers here: name them by address, as the leases do.
            ip = await SiteResolver(config.site_ip_ttl).resolve_all(set(caps) - {"*"} | allowed)
            caps = {ip.get(site, site): cap for site, cap in caps.items()}
            allowed = {ip[site] for site in allowed}
        await self.server.hset(self.keys.limits, mapping=caps)  # type: ignore[arg-type]
        if allowed:
            await self.server.sadd(self.keys.allowed, *allowed)
        assert self.loop is not None
        self.loop.start()

    async def _ping(self) -> None:
        """PING until it answers, for at most FRONTIER_CONNECT_TIMEOUT seconds."""
        deadline = time.monotonic() + self.config.connect_timeout
        while True:
            try:
                await self.server.ping()
            except AuthenticationError:
                raise
            except (RedisError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise RedisError(str(exc)) from exc
                logger.warning(
                    "Redis at %s not answering (%s); retrying",
                    mask_url(self.config.redis_url),
                    exc,
                    extra={"spider": self.spider},
                )
                await asyncio.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
            else:
                return

    def _fail(self, reason: str, message: str, *args: Any) -> NoReturn:
        """One ERROR line, then a clean close with *reason*; the process exits non-zero."""
        logger.error(message, *args, extra={"spider": self.spider})
        self.fatal = reason
        raise CloseSpider(reason)

    def _exit_status(self) -> None:
        if self.fatal is not None:
            # Scrapy's CrawlerProcess counts a crawl that ends without a spider as one that
            # failed to start, and `scrapy crawl` then exits 1: the one public way a
            # component has to say "this node could not work" to whoever started it.
            self.crawler.spider = None  # type: ignore[assignment]

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        if self.loop is not None and self.fatal is None:
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
        seed = request.meta.pop(SEED_META_KEY, False)
        refusal = url_refusal(request.url)
        if refusal is not None:
            return self._refuse(request, refusal)
        try:
            payload = encode_request(request, self.spider, id=os.urandom(6).hex())
        except UnserializableRequestError:
            self.stats.inc_value("frontier/unserializable")
            raise
        # Requests that skip the filter still mark their URL as seen.
        fp = (b"m" if request.dont_filter else b"f") + self.df.fingerprint(request)
        site = site_of(request.url)
        self.loop.buffer(fp, site, request.priority, payload, self._scope(request, site, seed))
        return True

    def _scope(self, request: Request, site: str, seed: bool) -> str:
        """Where *request* may go (see lua/step/enqueue.lua): only the crawl's sites by default."""
        if seed:
            return "+"
        host = urlsplit(request.url).hostname or ""
        redirected = request.meta.get("redirect_urls")
        if redirected and isinstance(redirected, list) and isinstance(redirected[-1], str):
            origin = urlsplit(redirected[-1]).hostname or ""
            if related_hosts(host, origin):
                # http to https, shop.example to www.shop.example: the crawl follows
                return "~" + site_of(redirected[-1])
        free = self.config.follow == "any" or bool(getattr(self.spider, "allowed_domains", None))
        # Loopback and private addresses only where a seed or FRONTIER_ALLOWED_SITES is.
        return "" if free and not is_private_host(host) else "="

    def _refuse(self, request: Request, reason: str) -> bool:
        self.stats.inc_value(f"frontier/refused/{reason}")
        logger.debug("Refused %s: %s", request.url[:300], reason, extra={"spider": self.spider})
        return False

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
        if self.fatal is not None:
            raise CloseSpider(self.fatal)
        if self.loop is None or not self.loop.finished:
            raise DontCloseSpider

    def _on_item_error(self, item: Any, response: Any, spider: Spider, failure: Any) -> None:
        """A pipeline could not store an item of a leased page: retry the page (a dead
        letter past FRONTIER_RETRY_TIMES), never ack it; items already stored come back
        unchanged. Its request is still in the engine when Scrapy sends item_error."""
        request = getattr(response, "request", None)
        if request is None or not request.meta.get(LEASE_META_KEY):
            return
        if request.meta.get(OUTCOME_META_KEY):
            return  # one failed item decides for the page
        self.stats.inc_value("frontier/item_errors")
        error = getattr(failure, "value", failure)
        self._retry.retry(request, f"item not stored: {type(error).__name__}: {error}"[:300], 0.0)

    def _on_response(self, response: Any, request: Request) -> None:
        latency = request.meta.get("download_latency")
        if latency is not None and self.loop is not None:
            self.loop.record_latency(request.url, float(latency))
