"""Scheduler that shares one leased frontier in Redis between many nodes."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis.asyncio
from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.defer import deferred_from_coro
from scrapy_redis import defaults
from scrapy_redis.scheduler import Scheduler

from project.config import FrontierConfig
from project.deadletters import DeadLetterSink
from project.dupefilter import FleetDupeFilter
from project.queue import FrontierKeys, LeasedQueue, StepBatch
from project.seeds import InvalidSeed, preview
from project.services import mask_url
from project.wire import UnserializableRequestError, decode_request, encode_request, site_of

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

__all__ = ["OUTCOME_META_KEY", "FleetScheduler"]

logger = logging.getLogger(__name__)

#: request.meta key through which middlewares ask for a retry or dead letter.
OUTCOME_META_KEY = "_frontier_outcome"

_PAYLOAD_HOST = re.compile(rb'^\{"url":"[A-Za-z][\w+.-]*://([^/"?#]+)')


@dataclass(slots=True)
class _Lease:
    member: bytes
    payload: bytes


class FleetScheduler(Scheduler):  # type: ignore[misc]
    """scrapy-redis scheduler with leases, batching and fleet-wide termination.

    A background task on the asyncio loop does all Redis I/O, one Lua round
    trip per tick: it flushes buffered requests (seen-check plus push),
    settles finished leases (ack, retry, dead letter), extends held leases,
    reaps expired ones, leases the next batch and takes a few seeds. The
    engine-facing methods never touch the network.
    """

    def __init__(self, crawler: Crawler, config: FrontierConfig) -> None:
        super().__init__(
            server=None,
            persist=True,
            queue_key=crawler.settings.get("SCHEDULER_QUEUE_KEY", defaults.SCHEDULER_QUEUE_KEY),
            dupefilter_key=crawler.settings.get(
                "SCHEDULER_DUPEFILTER_KEY", defaults.SCHEDULER_DUPEFILTER_KEY
            ),
        )
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.node_id = config.node_id
        self._start_urls_key: str = crawler.settings.get(
            "REDIS_START_URLS_KEY", defaults.START_URLS_KEY
        )
        self._heap: list[tuple[float, int, Request, _Lease]] = []
        self._heap_counter = 0
        self._consumed = 0  # requests dispatched since the last round trip
        self._dispatched: dict[Request, _Lease] = {}
        self._enqueue: list[tuple[bytes, str, int, bytes]] = []
        self._next_wake: float | None = None
        self._ip_sites: dict[str, str] = {}
        self._settle = StepBatch()
        self._seeds_maybe = True
        self._counts: tuple[int, int, int, int] | None = None
        self._idle_since: float | None = None
        self._finished = False
        self._closing = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0
        self._last_maintenance = 0.0
        self._redis_down_since: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, FrontierConfig.from_settings(crawler.settings))

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not hasattr(spider, "request_from_seed"):
            raise NotConfigured(
                f"{type(spider).__name__} must extend project.spider.FleetSpider"
                " to be scheduled by FleetScheduler"
            )
        self.spider = spider
        self.server = redis.asyncio.from_url(
            self.config.redis_url, socket_timeout=30, socket_connect_timeout=10
        )
        keys = FrontierKeys.for_spider(
            spider.name, self.queue_key, self.dupefilter_key, self._start_urls_key
        )
        self.queue = LeasedQueue(
            self.server,
            spider,
            keys,
            self.node_id,
            int(self.config.lease_seconds * 1000),
            self.config.limits,
        )
        self._latency: dict[str, list[float]] = {}
        if self.config.limits.adaptive:
            self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        self.df = FleetDupeFilter.from_crawler(self.crawler)
        settings = self.crawler.settings
        self._dead_sink = DeadLetterSink(
            settings.get("MONGO_URI", "mongodb://127.0.0.1:27017"),
            settings.get("MONGO_DATABASE", "fleetcrawl"),
            settings.get("MONGO_FAILURES_COLLECTION", "failures"),
            self.stats,
        )
        self.crawler.signals.connect(self._on_spider_idle, signal=signals.spider_idle)
        logger.info(
            "Frontier node %s on %s (queue %s, lease %.0fs)",
            self.node_id,
            mask_url(self.config.redis_url),
            keys.queue,
            self.config.lease_seconds,
            extra={"spider": spider},
        )
        # "*" records this fleet's defaults for status readers; the Lua
        # scripts take the defaults from each node's own settings.
        limits = self.config.limits
        mapping: dict[Any, Any] = {"*": f"{limits.rate} {limits.concurrency}"}
        mapping.update({site: f"{rate} {conc}" for site, rate, conc in self.config.site_limits})
        await self.server.hset(keys.limits, mapping=mapping)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        # Everything dispatched has left the engine by now: settle it, flush
        # what callbacks produced, then hand unstarted leases back.
        self._reconcile(force=True)
        try:
            while self._enqueue or self._has_settlements():
                await self._step(want=0, seed_want=0)
            held = [lease.member for *_, lease in self._heap]
            released = await self.queue.release(held)
            if released:
                logger.info("Released %d unstarted leases", released, extra={"spider": self.spider})
        except RedisError as exc:
            logger.error(
                "Redis unreachable at close (%s): %d leases will be reaped after expiry,"
                " %d discovered requests will be rediscovered from their re-crawled parents",
                exc,
                len(self._heap) + len(self._dispatched),
                len(self._enqueue),
                extra={"spider": self.spider},
            )
        self._dead_sink.kick()
        await self._dead_sink.close()
        await self.server.aclose()

    # -- engine interface (no I/O) -----------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        lease = request.meta.get("_frontier_lease")
        if lease is not None:
            # A redirect or retry of a request this node holds: its lease is
            # settled when the original leaves the engine.
            request.meta.pop("_frontier_lease")
        try:
            payload = encode_request(request, self.spider, id=os.urandom(6).hex())
        except UnserializableRequestError:
            self.stats.inc_value("frontier/unserializable")
            raise
        # Requests that skip the filter still mark their URL as seen.
        fp = (b"m" if request.dont_filter else b"f") + self.df.fingerprint(request)
        self._enqueue.append((fp, site_of(request.url), request.priority, payload))
        if len(self._enqueue) >= self.config.batch_max:
            self._wakeup.set()
        return True

    def next_request(self) -> Request | None:
        self._wakeup.set()
        if not self._heap:
            return None
        *_, request, lease = heapq.heappop(self._heap)
        self._dispatched[request] = lease
        self._consumed += 1
        self.stats.inc_value("frontier/dispatched")
        return request

    def has_pending_requests(self) -> bool:
        return bool(self._heap or self._enqueue)

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def held_leases(self) -> int:
        """Requests this node holds: leased but not yet settled."""
        return len(self._heap) + len(self._dispatched)

    def _on_spider_idle(self, spider: Spider) -> None:
        if not self._finished:
            raise DontCloseSpider

    # -- the I/O task ------------------------------------------------------

    def _has_settlements(self) -> bool:
        s = self._settle
        return bool(s.acks or s.retries or s.dead or s.pauses)

    def _on_response(self, response: Any, request: Request) -> None:
        latency = request.meta.get("download_latency")
        if latency is not None:
            self._latency.setdefault(site_of(request.url), []).append(float(latency))

    def _engine_inprogress(self) -> set[Request]:
        # Scrapy has no public hook for "a request and everything its
        # callback produced are done"; the engine slot's in-progress set is
        # exactly that (requests leave it after their items went through the
        # pipelines and their follow-ups were scheduled).
        slot = getattr(self.crawler.engine, "_slot", None)
        return slot.inprogress if slot is not None else set()

    def _reconcile(self, force: bool = False) -> None:
        """Turn requests that left the engine into acks, retries or dead letters."""
        if not self._dispatched:
            return
        inprogress = set() if force else self._engine_inprogress()
        for request in [r for r in self._dispatched if r not in inprogress]:
            lease = self._dispatched.pop(request)
            outcome = request.meta.get(OUTCOME_META_KEY)
            if outcome is None:
                self._settle.acks.append(lease.member)
                continue
            if outcome["action"] == "retry":
                payload = encode_request(request, self.spider, id=os.urandom(6).hex())
                not_before = int((time.time() + outcome["delay"]) * 1000)
                self._settle.retries.append((lease.member, not_before, payload))
            else:
                self._settle.dead.append(
                    (lease.member, self._dead_record(request.url, outcome, lease.payload))
                )
            if outcome.get("pause"):
                until = int((time.time() + outcome["pause"]) * 1000)
                self._settle.pauses.append((site_of(request.url), until))

    def _dead_record(self, url: str, outcome: dict[str, Any], payload: bytes | None) -> bytes:
        return json.dumps(
            {
                "url": url,
                "attempts": outcome.get("attempts", 0),
                "error": outcome.get("error", ""),
                "kind": outcome.get("kind", "request"),
                "time": time.time(),
                "node": self.node_id,
                "request": payload.decode("utf-8", "replace") if payload else None,
            },
            separators=(",", ":"),
        ).encode()

    def _want(self) -> int:
        held = len(self._heap) + len(self._dispatched)
        # A fast node drains its local batch within one tick: lease ahead by
        # about what it consumed last tick, so it never waits on Redis.
        # FRONTIER_PREFETCH = 0 asks for strict priority order instead.
        prefetch = max(self.config.prefetch, 2 * self._consumed) if self.config.prefetch else 0
        return max(0, min(self.config.batch_max, self.config.concurrency + prefetch - held))

    async def _run(self) -> None:
        delay = self.config.tick_seconds
        while not self._closing:
            started = time.monotonic()
            try:
                self._reconcile()
                want = self._want()
                self._consumed = 0
                busy = await self._step(want=want, seed_want=self._seed_want())
                self._dead_sink.kick()
            except RedisError as exc:
                self._on_redis_error(exc)
                delay = min(max(delay * 2, 0.5), 10.0)
            except Exception:
                # A bug here must not silently stop the node's frontier.
                self.stats.inc_value("frontier/errors")
                logger.exception("Frontier step failed", extra={"spider": self.spider})
                delay = min(max(delay * 2, 0.5), 10.0)
            else:
                if self._redis_down_since is not None:
                    logger.warning(
                        "Redis reachable again after %.1fs",
                        time.monotonic() - self._redis_down_since,
                        extra={"spider": self.spider},
                    )
                    self._redis_down_since = None
                delay = (
                    self.config.tick_seconds
                    if busy
                    else min(max(delay * 2, self.config.tick_seconds), self.config.idle_poll_max)
                )
                if self._next_wake is not None and self._want():
                    # A throttled site gets tokens then: be there to lease them.
                    until_wake = self._next_wake - time.time()
                    delay = min(delay, max(self.config.tick_seconds, until_wake))
            # At most one round trip per tick; sooner only when woken with work.
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.config.tick_seconds - elapsed))
            self._wakeup.clear()
            if delay > self.config.tick_seconds:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                if self._wakeup.is_set() and self._has_work():
                    delay = self.config.tick_seconds

    def _has_work(self) -> bool:
        return bool(self._enqueue or self._dispatched or self._want())

    def _on_redis_error(self, exc: RedisError) -> None:
        self.stats.inc_value("frontier/redis_errors")
        if self._redis_down_since is None:
            self._redis_down_since = time.monotonic()
            logger.error(
                "Redis unreachable at %s (%s); holding %d requests to enqueue, retrying",
                mask_url(self.config.redis_url),
                exc,
                len(self._enqueue),
                extra={"spider": self.spider},
            )

    def _seed_want(self) -> int:
        if self._closing or not self._seeds_maybe:
            return 0
        return self.config.seed_batch

    async def _step(self, want: int, seed_want: int) -> bool:
        """One round trip. Returns True when it moved anything."""
        now = time.monotonic()
        batch = StepBatch(want=want, seed_want=seed_want)
        batch.enqueue = self._enqueue[: self.config.batch_max]
        # Settle a lease only once everything its callback produced is sent.
        settle = len(batch.enqueue) == len(self._enqueue)
        if settle:
            batch.acks, batch.retries, batch.dead, batch.pauses = (
                self._settle.acks,
                self._settle.retries,
                self._settle.dead,
                self._settle.pauses,
            )
        if self._latency:
            batch.latency = [(site, sum(v), len(v)) for site, v in self._latency.items()]
        if self.config.site_key == "ip":
            await self._key_by_ip(batch)
        if now - self._last_heartbeat >= self.config.heartbeat_seconds:
            batch.heartbeat = [lease.member for *_, lease in self._heap]
            batch.heartbeat += [lease.member for lease in self._dispatched.values()]
        batch.maintain = now - self._last_maintenance >= self.config.maintenance_seconds
        result = await self.queue.step(batch)
        self.stats.inc_value("frontier/round_trips")
        if batch.latency:
            self._latency = {}
        self._next_wake = result.next_wake_ms / 1000 if result.next_wake_ms else None
        if batch.pauses:
            self._count("frontier/site_paused", len(batch.pauses))
        # Only now, with the step known to have run, drop what it carried.
        del self._enqueue[: len(batch.enqueue)]
        if settle:
            self._settle = StepBatch()
            self._count("frontier/acked", len(batch.acks))
            self._count("frontier/retried", len(batch.retries))
            self._count("frontier/dead", len(batch.dead))
            if batch.dead:
                self._dead_sink.add([record for _, record in batch.dead])
        if batch.heartbeat:
            self._last_heartbeat = now
        if batch.maintain:
            self._last_maintenance = now
            self._counts = result.counts
            self._seeds_maybe = self._seeds_maybe or bool(result.counts and result.counts[3])
            self._count("frontier/reaped", result.reaped)
            self._count("frontier/retries_due", result.promoted)
            if result.reaped:
                logger.warning(
                    "Put back %d expired leases of dead or stalled nodes",
                    result.reaped,
                    extra={"spider": self.spider},
                )
        self._count("frontier/enqueued", result.added)
        self._count("frontier/duplicates", result.duplicates)
        self._accept_leases(result.leased)
        self._accept_seeds(result.seeds, seed_want)
        moved = bool(batch.enqueue or result.leased or result.seeds or batch.acks)
        self._check_finished(moved)
        if result.leased or result.seeds or self._finished:
            self._wake_engine()
        return moved

    async def _key_by_ip(self, batch: StepBatch) -> None:
        """FLEET_SITE_KEY = "ip": one politeness unit per server, whatever its host names.

        The resolved site travels in front of the payload, where the Lua
        scripts look for it first.
        """

        def tag(payload: bytes, site: str) -> bytes:
            return b'{"site":' + json.dumps(site).encode() + b"," + payload[1:]

        batch.enqueue = [
            (fp, ip, priority, tag(payload, ip))
            for fp, site, priority, payload in batch.enqueue
            for ip in [await self._ip_site(site)]
        ]
        retries = []
        for member, not_before, payload in batch.retries:
            if payload.startswith(b'{"site":'):
                retries.append((member, not_before, payload))
                continue
            found = _PAYLOAD_HOST.match(payload)
            ip = await self._ip_site(found[1].decode().lower() if found else "_")
            retries.append((member, not_before, tag(payload, ip)))
        batch.retries = retries
        batch.pauses = [(await self._ip_site(site), until) for site, until in batch.pauses]
        batch.latency = [(await self._ip_site(s), total, n) for s, total, n in batch.latency]

    async def _ip_site(self, netloc: str) -> str:
        """``ip[:port]`` of a ``host[:port]``, resolved once (the domain if it fails)."""
        cached = self._ip_sites.get(netloc)
        if cached is not None:
            return cached
        parts = urlsplit("//" + netloc)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname or netloc, None, family=socket.AF_INET
            )
            ip = str(infos[0][4][0])
            site = f"{ip}:{parts.port}" if parts.port else ip
        except (OSError, IndexError, ValueError) as exc:
            logger.warning("Cannot resolve %s (%s): limiting it by name", netloc, exc)
            site = netloc
        self._ip_sites[netloc] = site
        return site

    def _count(self, key: str, n: int) -> None:
        if n:
            self.stats.inc_value(key, n)

    def _accept_leases(self, leased: list[tuple[bytes, float]]) -> None:
        self._count("frontier/leased", len(leased))
        for payload, score in leased:
            member = self.queue.request_member(payload)
            try:
                request, _ = decode_request(payload, self.spider)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.stats.inc_value("frontier/undecodable")
                logger.error(
                    "Dead-lettering an undecodable queue entry (%s): %s",
                    exc,
                    preview(payload),
                    extra={"spider": self.spider},
                )
                outcome = {"error": f"undecodable: {exc}", "kind": "payload"}
                self._settle.dead.append((member, self._dead_record("", outcome, payload)))
                continue
            request.meta["_frontier_lease"] = True
            lease = _Lease(member, payload)
            self._heap_counter += 1
            heapq.heappush(self._heap, (score, self._heap_counter, request, lease))

    def _accept_seeds(self, seeds: list[bytes], asked: int) -> None:
        if asked and len(seeds) < asked:
            self._seeds_maybe = False
        for raw in seeds:
            member = self.queue.seed_member(raw)
            try:
                request = self.spider.request_from_seed(raw)
            except InvalidSeed as exc:
                self.stats.inc_value("frontier/seeds/rejected")
                self.stats.inc_value(f"frontier/seeds/rejected/{exc.code}")
                logger.warning(
                    "Rejected seed %r: %s", preview(raw), exc, extra={"spider": self.spider}
                )
                outcome = {"error": str(exc), "kind": "seed"}
                self._settle.dead.append((member, self._dead_record(preview(raw), outcome, None)))
                continue
            self.stats.inc_value("frontier/seeds/accepted")
            # Scheduled through the engine like any request; the seed's own
            # lease is acked in the same round trip that enqueues it.
            self.crawler.engine.crawl(request)
            self._settle.acks.append(member)

    def _check_finished(self, moved: bool) -> None:
        local_busy = bool(
            self._heap or self._dispatched or self._enqueue or self._has_settlements() or moved
        )
        fleet_busy = self._counts is None or any(self._counts)
        if local_busy or fleet_busy or self.config.keep_alive:
            self._idle_since = None
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= self.config.idle_grace and not self._finished:
            logger.info(
                "Fleet idle for %.1fs: queue, retries, leases and seeds are empty",
                now - self._idle_since,
                extra={"spider": self.spider},
            )
            self._finished = True

    def _wake_engine(self) -> None:
        # The engine polls the scheduler only every 5 s when it thinks it is
        # idle; new leases should start downloading now.
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()
