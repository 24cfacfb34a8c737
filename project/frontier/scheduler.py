"""Scheduler that shares one leased frontier in Redis between many nodes."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

import scrapy.dupefilters
import scrapy_redis.dupefilter
from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.python import global_object_name
from scrapy_redis.scheduler import Scheduler
from scrapy_redis.spiders import RedisMixin

from project.frontier import lua
from project.frontier.codes import (
    MODE_ALWAYS,
    MODE_FILTER,
    MODE_REVISIT,
    MODE_SEED,
    SCOPE_ALLOWED,
    SCOPE_ANY,
    SCOPE_REDIRECT,
    SCOPE_SEED,
)
from project.frontier.config import FrontierConfig
from project.frontier.dupefilter import FleetDupeFilter
from project.frontier.keys import FrontierKeys, KeyTemplates
from project.frontier.layout import ensure_layout
from project.frontier.loop import FrontierLoop
from project.frontier.meta import (
    LEASE_META_KEY,
    OUTCOME_META_KEY,
    RETRY_COPY_META_KEY,
    REVISIT_META_KEY,
    SEED_META_KEY,
)
from project.frontier.politeness import unreachable
from project.frontier.queue import LeasedQueue
from project.frontier.retry import RetryPolicy
from project.frontier.revisit import RevisitConfig
from project.frontier.seen import SeenConfig, SeenFormError, ensure_form
from project.frontier.signals import frontier_started, seen_set_opened
from project.frontier.sites import (
    SiteResolver,
    is_private_host,
    related_hosts,
    site_of,
    url_refusal,
)
from project.frontier.spiders import has_own_seeds, seed_key
from project.frontier.wire import UnserializableRequestError, encode_request
from project.storage.deadletters import DeadLetterSink

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

__all__ = ["FleetScheduler"]

logger = logging.getLogger(__name__)

_schedulers: WeakKeyDictionary[Crawler, FleetScheduler] = WeakKeyDictionary()
#: Longest meta download_slot taken as a politeness unit.
_MAX_SLOT = 200


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
        self.seen = SeenConfig.from_settings(crawler.settings)
        revisit = RevisitConfig.from_settings(crawler.settings)
        #: FRONTIER_REVISIT, when it names any URL: such requests are enqueued in revisit mode.
        self._revisit = revisit if revisit.rules else None
        self.loop: FrontierLoop | None = None
        #: Why this node cannot work (a close reason), once it knows.
        self.fatal: str | None = None
        self._ready = asyncio.Event()  # set once the frontier runs (the loop has started)
        _schedulers[crawler] = self

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        return cls(
            crawler, FrontierConfig.from_settings(settings), KeyTemplates.from_settings(settings)
        )

    @staticmethod
    def of(crawler: Crawler) -> FleetScheduler | None:
        """The crawler's fleet scheduler, once the engine made it (None with another one)."""
        return _schedulers.get(crawler)

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        # No I/O here: Redis is first asked once every component is open (_connect),
        # so a node that cannot reach it closes cleanly, with one line saying why.
        self.spider = spider
        config = self.config = self.config.for_spider(spider)
        self.server = config.client(socket_timeout=30, socket_connect_timeout=10)
        keys = FrontierKeys.for_spider(spider.name, self.templates)
        self.keys = keys.with_start_urls(seed_key(spider, keys.start_urls))
        domains = getattr(spider, "allowed_domains", None)
        if domains is not None and not isinstance(domains, list | tuple | set | frozenset | str):
            # scrapy-redis' example project sets filter(None, ...): Scrapy 2.19's
            # OffsiteMiddleware iterates it twice and would then refuse every request.
            setattr(spider, "allowed_domains", [domain for domain in domains if domain])  # noqa: B010
        if isinstance(spider, RedisMixin):
            # scrapy-redis' RedisMixin pops seeds itself when idle, past the leases, and
            # decides alone when to close: the frontier does both for the fleet.
            self.crawler.signals.disconnect(spider.spider_idle, signal=signals.spider_idle)
        self.queue = LeasedQueue(
            self.server,
            spider,
            self.keys,
            self.node_id,
            int(config.lease_seconds * 1000),
            config.limits,
            config.max_deliveries,
        )
        self.df, self._local_filter, self._filtering = self._dupefilters()
        self.crawler.signals.send_catch_log(seen_set_opened, dupefilter=self.df)
        self.loop = FrontierLoop(
            self.crawler, spider, config, self.queue, DeadLetterSink.from_crawler(self.crawler)
        )
        if config.limits.adaptive or self.loop.autotune is not None:
            self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        self.crawler.signals.connect(self._left_downloader, signal=signals.request_left_downloader)
        self.crawler.signals.connect(self._on_spider_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._connect, signal=signals.spider_opened)
        self._retry = RetryPolicy.from_crawler(self.crawler)
        self.crawler.signals.connect(self._on_item_error, signal=signals.item_error)
        self.crawler.signals.connect(self._exit_status, signal=signals.spider_closed)

    def _dupefilters(self) -> tuple[FleetDupeFilter, Any, bool]:
        """The seen-set, a node-local filter of the project's own (if any), and whether to filter.

        ``DUPEFILTER_CLASS`` (or scrapy-redis' ``SCHEDULER_DUPEFILTER_CLASS``): a
        FleetDupeFilter subclass is the fleet's seen-set, its ``fingerprint`` used; Scrapy's
        and scrapy-redis' RFPDupeFilter mean the fleet's seen-set; Scrapy's BaseDupeFilter
        means no filtering (every request is queued, its URL still marked seen); any other
        class is asked ``request_seen`` on this node before the fleet's seen-set is.
        """
        settings = self.crawler.settings
        path = settings.get("SCHEDULER_DUPEFILTER_CLASS") or settings.get("DUPEFILTER_CLASS")
        cls = load_object(path) if isinstance(path, str) else path
        if isinstance(cls, type) and issubclass(cls, FleetDupeFilter):
            return build_from_crawler(cls, self.crawler), None, True
        fleet = FleetDupeFilter.from_crawler(self.crawler)
        if cls in (scrapy_redis.dupefilter.RFPDupeFilter, scrapy.dupefilters.RFPDupeFilter):
            logger.info(
                "DUPEFILTER_CLASS %s: the fleet's shared seen-set does its job",
                global_object_name(cls),
                extra={"spider": self.spider},
            )
            return fleet, None, True
        if cls is scrapy.dupefilters.BaseDupeFilter:
            return fleet, None, False
        local = build_from_crawler(cls, self.crawler)
        if hasattr(local, "open"):
            local.open()
        logger.info(
            "DUPEFILTER_CLASS %s filters on this node, then the fleet's seen-set",
            global_object_name(cls),
            extra={"spider": self.spider},
        )
        return fleet, local, True

    async def _connect(self, spider: Spider) -> None:
        """Reach Redis and start the frontier; if it cannot work, say why and close."""
        config = self.config
        where = config.redis_name
        deadline = time.monotonic() + config.connect_timeout
        while True:
            try:
                await self._ping(deadline)
                await self._prepare()
                break
            except AuthenticationError as exc:
                self._fail(
                    "redis_auth",
                    "Redis at %s refused the password (%s): put it in REDIS_URL"
                    " (redis://:PASSWORD@host:port/0)",
                    where,
                    exc,
                )
            except SeenFormError as exc:
                self._fail("seen_form", "Cannot use the seen-set: %s", exc)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    self._fail(
                        "redis_unreachable",
                        "Redis at %s unreachable for %.0fs (%s): start it (fleetcrawl services"
                        " start) or point REDIS_URL at it",
                        where,
                        config.connect_timeout,
                        exc,
                    )
                # it answered, then went away (a restart): the set-up is safe to run again
                logger.warning(
                    "Redis at %s went away while this node set up its frontier (%s); retrying",
                    where,
                    exc,
                    extra={"spider": spider},
                )
                await asyncio.sleep(0.5)
            except RedisError as exc:
                self._fail(
                    "redis_error", "Redis at %s refused the frontier's set-up: %s", where, exc
                )
        logger.info(
            "Frontier node %s on %s (queue %s, seeds %s%s, lease %.0fs)",
            self.node_id,
            where,
            self.keys.queue,
            self.keys.start_urls,
            " as a set" if config.seeds_as_set else "",
            config.lease_seconds,
            extra={"spider": spider},
        )
        for line in unreachable(self.crawler.settings, config):
            self.stats.inc_value("frontier/politeness/node_limits")
            logger.warning("Site cap unreachable: %s", line, extra={"spider": spider})
        if not has_own_seeds(spider):
            logger.debug("%s reads no seeds of its own", type(spider).__name__)
        assert self.loop is not None
        self.loop.start()
        self.crawler.signals.send_catch_log(frontier_started, loop=self.loop, keys=self.keys)
        self._ready.set()

    async def _prepare(self) -> None:
        """What the frontier needs in Redis before its first step: the key layout, the
        seen-set's form, the sites' caps and the allowed sites. Safe to run again."""
        config = self.config
        await ensure_layout(self.server, self.keys)
        self.queue.seen_form = await ensure_form(self.server, self.keys, self.seen)
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

    async def claim_start(self, *, new_crawl: bool) -> str | None:
        """Ask the fleet whether this node runs the spider's start() (lua/start.lua).

        ``claimed``: run it now (the loop extends the claim, :meth:`FrontierLoop.end_start`
        ends it); ``running``: another node does; ``done``: it ran for this crawl. None
        when this node never reached Redis.
        """
        while not self._ready.is_set():
            if self.fatal is not None:
                return None
            await asyncio.sleep(0.05)
        assert self.loop is not None
        state = await self.queue.claim_start(new_crawl=new_crawl)
        if state == "claimed":
            self.loop.begin_start()
        return state

    async def _ping(self, deadline: float) -> None:
        """PING until it answers, until *deadline* (FRONTIER_CONNECT_TIMEOUT from the start)."""
        while True:
            try:
                await self.server.ping()
            except AuthenticationError:
                raise
            except (RedisError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise RedisConnectionError(str(exc)) from exc
                logger.warning(
                    "Redis at %s not answering (%s); retrying",
                    self.config.redis_name,
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
            if reason == "finished" and not self.config.persist:
                await self._flush_frontier()
        if self._local_filter is not None and hasattr(self._local_filter, "close"):
            self._local_filter.close(reason)
        await self.server.aclose()

    async def _flush_frontier(self) -> None:
        """SCHEDULER_PERSIST = False: the fleet's crawl is over, so its queue and seen-set go.

        One script checks that it is still over and deletes in the same step
        (lua/flush.lua); dead letters stay for inspection, as do node records.
        """
        script = lua.load("flush")
        try:
            deleted = int(
                await self.server.eval(
                    script.source, len(script.keys), *script.keys_from(self.keys)
                )
            )
        except RedisError as exc:
            logger.error("SCHEDULER_PERSIST is off but the frontier stays: %s", exc)
            return
        if deleted < 0:
            logger.info(
                "SCHEDULER_PERSIST is off, but the frontier has work again: it stays",
                extra={"spider": self.spider},
            )
            return
        logger.info(
            "SCHEDULER_PERSIST is off: deleted the finished crawl's queue and seen-set (%d keys)",
            deleted,
            extra={"spider": self.spider},
        )

    # -- engine interface (no I/O) -----------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        assert self.loop is not None
        if request.meta.pop(RETRY_COPY_META_KEY, False):
            # Scrapy's retry request (get_retry_request): it goes back through Redis
            # with the lease of the request it copies (project/frontier/retry.py).
            return True
        # A redirect of a request this node holds: its lease is settled when the
        # original leaves the engine.
        request.meta.pop(LEASE_META_KEY, None)
        if request.meta.pop(REVISIT_META_KEY, None) is not None:
            # a redirect, or a child that copied its page's meta (meta=response.meta,
            # request.replace()): that page's record and validators are not this request's
            # (its items would be judged gone by what the child yields)
            for header in (b"If-None-Match", b"If-Modified-Since"):
                request.headers.pop(header, None)
        seed = request.meta.pop(SEED_META_KEY, False)
        refusal = url_refusal(request.url)
        if refusal is not None:
            return self._refuse(request, refusal)
        local = self._local_filter
        if local is not None and not request.dont_filter and local.request_seen(request):
            local.log(request, self.spider)
            return False
        try:
            payload = encode_request(request, self.spider, id=os.urandom(6).hex())
        except UnserializableRequestError:
            self.stats.inc_value("frontier/unserializable")
            raise
        # Requests that skip the filter still mark their URL as seen; seeds and start()'s
        # requests skip it to be fetched again in the next crawl run, but once in each.
        mode = MODE_ALWAYS if request.dont_filter or not self._filtering else MODE_FILTER
        if seed and mode == MODE_ALWAYS and self._filtering:
            mode = MODE_SEED
        revisit = self._revisit
        if mode == MODE_FILTER and revisit is not None and revisit.interval(request) > 0:
            mode = MODE_REVISIT  # seen, but fetched again once its revisit is due
        url_site = site_of(request.url)
        site = self._slot_of(request) or url_site
        scope = self._scope(request, url_site, seed)
        if site != url_site and scope in (SCOPE_SEED, SCOPE_ALLOWED):
            scope += url_site  # the slot is the politeness unit; the host is still the scope's
        self.loop.buffer(
            mode + self.df.fingerprint(request), site, request.priority, payload, scope
        )
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/redis")
        return True

    def _slot_of(self, request: Request) -> str | None:
        """A ``download_slot`` the spider gave the request: the fleet's politeness unit then.

        Not the one Scrapy's downloader writes into the meta of every request it
        downloads (a redirect copies it), and not when sites are keyed by IP.
        """
        slot = request.meta.get("download_slot")
        if not isinstance(slot, str) or not slot or self.config.site_key == "ip":
            return None
        if "redirect_urls" in request.meta or "retry_times" in request.meta:
            return None
        if slot == urlparse_cached(request).hostname:
            return None  # Scrapy's own slot of the host (a child given meta=response.meta)
        if len(slot) > _MAX_SLOT or not slot.isprintable():
            # a newline would break the in-flight member "<node>\nR<site>\n<payload>"
            self.stats.inc_value("frontier/refused/download_slot")
            return None
        return slot.lower()

    def _scope(self, request: Request, site: str, seed: bool) -> str:
        """Where *request* may go (see lua/step/enqueue.lua): only the crawl's sites by default."""
        if seed:
            return SCOPE_SEED
        host = urlsplit(request.url).hostname or ""
        redirected = request.meta.get("redirect_urls")
        if redirected and isinstance(redirected, list) and isinstance(redirected[-1], str):
            origin = urlsplit(redirected[-1]).hostname or ""
            if related_hosts(host, origin):
                # http to https, shop.example to www.shop.example: the crawl follows
                return SCOPE_REDIRECT + site_of(redirected[-1])
        free = self.config.follow == "any" or bool(getattr(self.spider, "allowed_domains", None))
        # Loopback and private addresses only where a seed or FRONTIER_ALLOWED_SITES is.
        return SCOPE_ANY if free and not is_private_host(host) else SCOPE_ALLOWED

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
        self._retry.retry(
            request,
            f"item not stored: {type(error).__name__}: {error}"[:300],
            0.0,
            "item_not_stored",
        )

    def _left_downloader(self, request: Request) -> None:
        if self.loop is not None:
            self.loop.download_ended(request)

    def _on_response(self, response: Any, request: Request) -> None:
        latency = request.meta.get("download_latency")
        if latency is not None and self.loop is not None:
            self.loop.record_latency(request.url, float(latency))
