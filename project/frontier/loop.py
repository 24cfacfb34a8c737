"""The node's side of the shared frontier: its leases, its buffers, one round trip per tick."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from project.frontier.engine import requests_in_progress, wake_engine
from project.frontier.meta import LEASE_META_KEY, OUTCOME_META_KEY, REVISIT_META_KEY, SEED_META_KEY
from project.frontier.queue import StepBatch
from project.frontier.revisit import revisit_entries, touch_items
from project.frontier.seeds import InvalidSeed, preview
from project.frontier.sites import SiteResolver, site_of
from project.frontier.spiders import requests_from_seed
from project.frontier.wire import decode_request, encode_request

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.frontier.config import FrontierConfig
    from project.frontier.queue import Leased, LeasedQueue
    from project.storage.deadletters import DeadLetterSink

__all__ = ["FrontierLoop"]

logger = logging.getLogger(__name__)

_BACKOFF_MIN = 0.5  # seconds between tries while Redis is unreachable or a step fails
_BACKOFF_MAX = 10.0
#: Seconds between the round trips of a node with nothing to do while the fleet still
#: works: it sees the crawl's end, or new work, this soon.
_END_POLL = 0.25
#: Ticks a busy node may skip a round trip for, when it has nothing urgent to send or ask.
_MAX_SKIPPED_TICKS = 3


def process_age() -> float | None:
    """Seconds since this process started (Linux), or None where /proc cannot say."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _rescope(scope: str, ip: dict[str, str]) -> str:
    # A redirect's scope names the site it came from: by IP too.
    return "~" + ip[scope[1:]] if scope.startswith("~") else scope


@dataclass(slots=True)
class _Lease:
    member: bytes
    site: str
    payload: bytes
    leased_at: float = 0.0  # monotonic time the node took it
    downloading: bool = False  # it holds one of its site's download permits


@dataclass(slots=True)
class _Settlement:
    """An ack, retry, dead letter or pause, sent once the requests buffered before it are."""

    after: int  # requests buffered up to then: all must be in Redis first
    acks: list[bytes]
    retries: list[tuple[bytes, int, str, bytes]]
    dead: list[tuple[bytes, bytes]]
    pauses: list[tuple[str, int]]
    revisits: list[tuple[bytes, int, bytes]]


#: Due revisits one maintenance hands out (FRONTIER_KEEP_ALIVE).
_REVISITS_PER_MAINTENANCE = 500


class FrontierLoop:
    """Leases in a local heap, requests to enqueue and leases to settle, and the task
    that sends them to Redis: at most one Lua round trip per tick (lua/step.lua).

    The engine-facing side (:meth:`buffer`, :meth:`pop`) never touches the network.
    """

    def __init__(
        self,
        crawler: Crawler,
        spider: Spider,
        config: FrontierConfig,
        queue: LeasedQueue,
        dead_sink: DeadLetterSink,
    ) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.spider = spider
        self.stats: StatsCollector = crawler.stats
        self.config = config
        self.queue = queue
        self.dead_sink = dead_sink
        self.download_timeout: float = crawler.settings.getfloat("DOWNLOAD_TIMEOUT")
        self.finished = False
        self._heap: list[tuple[float, int, Request, _Lease]] = []
        self._heap_counter = 0
        # Download permits (lua/lib/permits.lua): held per site, in use per site, leased
        # requests per site not dispatched yet, and those waiting for a permit to free.
        self._permits: Counter[str] = Counter()
        self._busy: Counter[str] = Counter()
        self._ready: Counter[str] = Counter()
        self._blocked: dict[str, list[tuple[float, int, Request, _Lease]]] = {}
        self._ended: Counter[str] = Counter()  # downloads ended since the last round trip
        self._shares: dict[str, int] = {}  # this node's share of a site's cap (lua/step/lease.lua)
        self._first_lease = False
        self._dispatched: dict[Request, _Lease] = {}
        self._enqueue: list[tuple[bytes, str, int, bytes, str]] = []
        self._buffered = 0  # requests ever buffered; the first ones leave with each step
        self._sent = 0  # requests ever sent
        self._settlements: list[_Settlement] = []
        self._stale: set[bytes] = set()  # leases past FRONTIER_MAX_LEASE_SECONDS
        self._latency: dict[str, list[float]] = {}
        self._resolver = SiteResolver(config.site_ip_ttl) if config.site_key == "ip" else None
        self._next_wake: float | None = None  # monotonic time a throttled site may go
        self._seeds_maybe = True
        self._counts: tuple[int, int, int, int, int] | None = None
        #: "run" while this node runs the spider's start() for the fleet, "done" once
        #: it ended and its claim waits to be ended with its last requests.
        self._start: str | None = None
        self._start_after = 0
        self._dupe_logged = False  # Scrapy logs the first duplicate, or all with DUPEFILTER_DEBUG
        self._seen_work = False  # this node saw the fleet's crawl with work left, or did some
        self._started_at = time.monotonic()
        self._last_step = 0.0
        self._held_back = False  # pop() refused to dispatch while no step confirmed the permits
        self._walk_open = True  # the last round trip's walk used every slot it asked for
        self._closing = False
        self._closed = asyncio.Event()  # set by stop(): sleeps of the I/O task end
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0
        self._last_maintenance = 0.0
        self._redis_down_since: float | None = None

    # -- engine side (no I/O) ----------------------------------------------

    def buffer(
        self, fingerprint: bytes, site: str, priority: int, payload: bytes, scope: str
    ) -> None:
        """Queue a request for the next round trip (*scope*: see lua/step/enqueue.lua)."""
        self._enqueue.append((fingerprint, site, priority, payload, scope))
        self._buffered += 1
        if len(self._enqueue) >= self.config.batch_max:
            self._wakeup.set()

    def pop(self) -> Request | None:
        """The best leased request whose site has a free download permit, now dispatched."""
        self._wakeup.set()
        if time.monotonic() - self._last_step > self.config.lease_seconds / 2:
            # No round trip for half a lease (a stall, a partition): the fleet may have taken
            # this node's permits back; it starts nothing before its next step says.
            self._held_back = bool(self._heap)
            return None
        while self._heap:
            entry = heapq.heappop(self._heap)
            *_, request, lease = entry
            site = lease.site
            if self._busy[site] >= self._usable(site):
                # every permit of its site is downloading: it waits for one to end
                self._blocked.setdefault(site, []).append(entry)
                continue
            break
        else:
            return None
        self._busy[site] += 1
        self._ready[site] -= 1
        lease.downloading = True
        self._dispatched[request] = lease
        self.stats.inc_value("frontier/dispatched")
        # Scrapy's scheduler counts these (and scrapy-redis' its /redis share)
        self.stats.inc_value("scheduler/dequeued")
        self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def download_ended(self, request: Request) -> None:
        """*request* left the downloader: its permit may start the next request of its site."""
        lease = self._dispatched.get(request)
        if lease is not None and lease.downloading:
            self._end_download(lease)

    def _end_download(self, lease: _Lease) -> None:
        lease.downloading = False
        site = lease.site
        self._busy[site] -= 1
        self._ended[site] += 1
        self._unblock(site)

    def _usable(self, site: str) -> int:
        """Permits of *site* this node may download with: those above its share go back."""
        share = self._shares.get(site, 0)
        permits = self._permits[site]
        return min(permits, share) if share else permits

    def _unblock(self, site: str) -> None:
        waiting = self._blocked.pop(site, None)
        if waiting:
            for entry in waiting:
                heapq.heappush(self._heap, entry)

    def has_pending(self) -> bool:
        """Leased requests not dispatched yet, or requests not enqueued yet."""
        return bool(self._heap or self._blocked or self._enqueue)

    def __len__(self) -> int:
        return sum(self._ready.values())

    @property
    def fleet_idle(self) -> bool:
        """The fleet had no work at this node's last count, and this node holds none."""
        counts = self._counts
        return (
            counts is not None
            and not any(counts)
            and not self.held
            and not self._enqueue
            and not self._settlements
        )

    @property
    def held(self) -> int:
        """Requests this node holds: leased but not yet settled."""
        return sum(self._ready.values()) + len(self._dispatched)

    @property
    def downloading(self) -> int:
        """Requests this node downloads now (each holds a permit of its site)."""
        return sum(self._busy.values())

    def _undispatched(self) -> list[_Lease]:
        leases = [lease for *_, lease in self._heap]
        for waiting in self._blocked.values():
            leases += [lease for *_, lease in waiting]
        return leases

    def begin_start(self) -> None:
        """This node holds the claim on the spider's start(): extend it with the heartbeats."""
        self._start = "run"

    @property
    def runs_start(self) -> bool:
        """Whether this node holds the claim on the spider's start() (not lost, not ended)."""
        return self._start == "run"

    def end_start(self) -> None:
        """start() is over: end the claim once every request it yielded is in Redis."""
        if self._start == "run":
            self._start, self._start_after = "done", self._buffered
            self._wakeup.set()

    def record_latency(self, url: str, seconds: float) -> None:
        """A download latency sample for adaptive throttling."""
        self._latency.setdefault(site_of(url), []).append(seconds)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the I/O task on the running asyncio loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the task, settle and flush what is left, give unstarted leases back."""
        self._closing = True
        self._closed.set()
        self._wakeup.set()
        if self._task is not None:
            await self._task
        # Everything dispatched has left the engine by now.
        self._reconcile(force=True)
        try:
            while self._enqueue or self._has_settlements() or self._start == "done":
                await self._step(closing=True)
            held = [lease.member for lease in self._undispatched()]
            released = await self.queue.release(held)
            self._permits.clear()
            if released:
                logger.info("Released %d unstarted leases", released, extra={"spider": self.spider})
        except RedisError as exc:
            logger.error(
                "Redis unreachable at close (%s): %d leases will be reaped after expiry,"
                " %d discovered requests will be rediscovered from their re-crawled parents",
                exc,
                self.held,
                len(self._enqueue),
                extra={"spider": self.spider},
            )

    # -- the I/O task ----------------------------------------------------------

    async def _run(self) -> None:
        tick = self.config.tick_seconds
        delay = tick
        self._started_at = time.monotonic()
        while not self._closing:
            started = time.monotonic()
            self._reconcile()
            if delay <= tick and not self._step_needed(started):
                # Enough leased for another tick and nothing urgent: one round trip fewer.
                await self._pause(tick)
                continue
            try:
                busy = await self._step()
                self.dead_sink.kick()
            except RedisError as exc:
                self._on_redis_error(exc, started)
                delay = min(max(delay * 2, _BACKOFF_MIN), _BACKOFF_MAX)
            except Exception:
                # A bug here must not silently stop the node's frontier.
                self.stats.inc_value("frontier/errors")
                logger.exception("Frontier step failed", extra={"spider": self.spider})
                delay = min(max(delay * 2, _BACKOFF_MIN), _BACKOFF_MAX)
            else:
                self._on_redis_back()
                delay = tick if busy else min(max(delay * 2, tick), self.config.idle_poll_max)
                if self._fleet_busy():
                    delay = min(delay, max(tick, _END_POLL))
                if self._next_wake is not None and self._slots():
                    # A throttled site gets tokens then: be there to lease them.
                    delay = min(delay, max(tick, self._next_wake - time.monotonic()))
            # At most one round trip per tick; sooner only when woken with work.
            await self._pause(tick - (time.monotonic() - started))
            self._wakeup.clear()
            if delay > tick and not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                if self._wakeup.is_set() and self._has_work():
                    delay = tick

    async def _pause(self, seconds: float) -> None:
        """Sleep up to *seconds*, or less when the node starts closing."""
        if seconds > 0 and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), seconds)

    def _step_needed(self, now: float) -> bool:
        """Whether a busy node should step now rather than skip a tick.

        It skips while every site it works on has requests leased ahead for at least as many
        downloads as ended since its last round trip, no permit is spare, nothing it found
        waits in numbers, and its heartbeat and maintenance are not due; at most
        _MAX_SKIPPED_TICKS in a row. A node with nothing of its own left always steps.
        """
        config = self.config
        if (
            self._closing
            or self._start is not None
            or not self.held
            or now - self._last_step >= _MAX_SKIPPED_TICKS * config.tick_seconds
            or now - self._last_heartbeat >= config.heartbeat_seconds
            or now - self._last_maintenance >= config.maintenance_seconds
            or len(self._enqueue) >= config.batch_max // 4
            or (self._seeds_maybe and self._seed_want())
            or (self._walk_open and self._slots())
        ):
            return True
        for site, permits in self._permits.items():
            ready, busy = self._ready[site], self._busy[site]
            if permits - busy > ready:
                return True  # a spare permit: lease a request for it
            if ready - (permits - busy) < max(1, self._ended[site]):
                return True  # what is leased ahead would not last another tick
        return any(n > 0 and not self._permits[s] for s, n in self._ready.items())

    def _has_work(self) -> bool:
        return bool(self._enqueue or self._dispatched or self._slots())

    def _fleet_busy(self) -> bool:
        """The last counts this node read say the fleet has work left."""
        return self._counts is not None and any(self._counts)

    def _has_settlements(self) -> bool:
        return bool(self._settlements)

    def _settle(
        self,
        *,
        ack: bytes | None = None,
        retry: tuple[bytes, int, str, bytes] | None = None,
        dead: tuple[bytes, bytes] | None = None,
        pause: tuple[str, int] | None = None,
        revisit: tuple[bytes, int, bytes] | None = None,
    ) -> None:
        """Queue one settlement behind every request buffered so far (its children)."""
        last = self._settlements[-1] if self._settlements else None
        if last is None or last.after != self._buffered:
            last = _Settlement(self._buffered, [], [], [], [], [])
            self._settlements.append(last)
        if ack is not None:
            last.acks.append(ack)
        if retry is not None:
            last.retries.append(retry)
        if dead is not None:
            last.dead.append(dead)
        if pause is not None:
            last.pauses.append(pause)
        if revisit is not None:
            last.revisits.append(revisit)

    def _on_redis_error(self, exc: RedisError, since: float) -> None:
        """A step that began at *since* failed: the outage counts from then (a partition
        shows as a step that hangs for its socket timeout)."""
        self.stats.inc_value("frontier/redis_errors")
        if self._redis_down_since is None:
            self._redis_down_since = since
            logger.error(
                "Redis unreachable at %s (%s); holding %d requests to enqueue, retrying",
                self.config.redis_name,
                exc,
                len(self._enqueue),
                extra={"spider": self.spider},
            )

    def _on_redis_back(self) -> None:
        if self._redis_down_since is not None:
            logger.warning(
                "Redis reachable again after %.1fs",
                time.monotonic() - self._redis_down_since,
                extra={"spider": self.spider},
            )
            self._redis_down_since = None

    def _slots(self) -> int:
        """New download permits this node could use (CONCURRENT_REQUESTS in all)."""
        return max(0, self.config.concurrency - sum(self._permits.values()))

    def _plan(self, batch: StepBatch) -> None:
        """What to lease, per site and in all, and which permits to give back.

        A free permit above this node's share of the site's cap goes back; a spare one (free,
        no request to start) asks for a request of its site, and goes back in the same round
        trip if the site has none; requests waiting for a permit ask for one; and each site
        with permits keeps a few requests more than it can start (FRONTIER_PREFETCH, or three
        times the downloads that ended since the last round trip), so a download that ends starts the
        next at once. FRONTIER_PREFETCH = 0 leases only what starts at once, for strict
        priority order.
        """
        config = self.config
        held = 0
        more = 0
        for site in {*self._permits, *(s for s, n in self._ready.items() if n > 0)}:
            permits, busy, ready = self._permits[site], self._busy[site], self._ready[site]
            over = permits - max(busy, self._usable(site))  # free, above this node's share
            if over > 0:
                batch.give_back.append((site, over))
                permits -= over
            held += permits
            spare = max(0, permits - busy - ready)
            waiting = max(0, ready - (permits - busy))
            target = 0
            if config.prefetch and permits > 0:
                target = min(permits, max(config.prefetch, 3 * self._ended[site]))
            extra = spare + max(0, target - waiting)
            batch.ahead.append((site, extra, waiting, permits, spare))
            more += extra
        batch.slots = max(0, config.concurrency - held)
        batch.want = min(config.batch_max, batch.slots + more)
        self._ended.clear()

    def _seed_want(self) -> int:
        # a node with nothing to do always looks: a seed pushed now is taken at once
        if self._closing or not (self._seeds_maybe or not self.held):
            return 0
        return self.config.seed_batch

    def _reconcile(self, force: bool = False) -> None:
        """Turn requests that left the engine into acks, retries or dead letters."""
        if not self._dispatched:
            return
        inprogress = set() if force else requests_in_progress(self.crawler)
        for request in [r for r in self._dispatched if r not in inprogress]:
            lease = self._dispatched.pop(request)
            if lease.downloading:
                self._end_download(lease)  # it never reached the downloader, or left unseen
            self._stale.discard(lease.member)
            outcome = request.meta.get(OUTCOME_META_KEY)
            if outcome is None:
                self._settle(ack=lease.member)
                for revisit in revisit_entries(request, lease.site, lease.payload):
                    self._settle(revisit=revisit)
                continue
            if outcome["action"] == "retry":
                try:
                    again = outcome.get("request") or request  # Scrapy's retry copy
                    payload = encode_request(again, self.spider, id=os.urandom(6).hex())
                except Exception as exc:  # noqa: BLE001 (whatever it is, this one request pays)
                    outcome = {**outcome, "action": "dead", "error": f"cannot retry: {exc}"}
                else:
                    delay_ms = int(outcome["delay"] * 1000)
                    self._settle(retry=(lease.member, delay_ms, lease.site, payload))
            if outcome["action"] != "retry":
                record = self._dead_record(request.url, lease.site, outcome, lease.payload)
                self._settle(dead=(lease.member, record))
                last = request.meta.get(REVISIT_META_KEY)
                if isinstance(last, dict):
                    # a revisit that failed tells nothing of its items: they stay alive
                    touch_items(self.crawler, [json.dumps(last).encode()])
            if outcome.get("pause"):
                self._settle(pause=(lease.site, int(outcome["pause"] * 1000)))

    def _dead_record(
        self, url: str, site: str | None, outcome: dict[str, Any], payload: bytes | None
    ) -> bytes:
        return json.dumps(
            {
                "url": url,
                "site": site,
                "attempts": outcome.get("attempts", 0),
                "error": outcome.get("error", ""),
                "kind": outcome.get("kind", "request"),
                "time": time.time(),
                "node": self.config.node_id,
                "request": payload.decode("utf-8", "replace") if payload else None,
            },
            separators=(",", ":"),
        ).encode()

    async def _step(self, closing: bool = False) -> bool:
        """One round trip. Returns True when it moved anything."""
        now = time.monotonic()
        batch = StepBatch(seed_want=0 if closing else self._seed_want())
        if not closing:
            self._plan(batch)
        batch.enqueue = self._enqueue[: self.config.batch_max]
        # Settle a lease only once everything its callback produced is sent: in an
        # earlier round trip, or in this one (the script enqueues before it settles).
        sent_after = self._sent + len(batch.enqueue)
        settled = 0
        for settlement in self._settlements:
            if settlement.after > sent_after:
                break
            batch.acks += settlement.acks
            batch.retries += settlement.retries
            batch.dead += settlement.dead
            batch.pauses += settlement.pauses
            batch.revisits += settlement.revisits
            settled += 1
        if self._latency:
            batch.latency = [(site, sum(v), len(v)) for site, v in self._latency.items()]
        if self._resolver is not None:
            await self._key_by_ip(batch, self._resolver)
        if now - self._last_heartbeat >= self.config.heartbeat_seconds:
            batch.heartbeat = [lease.member for lease in self._undispatched()]
            batch.heartbeat += self._live_leases(now)
            # Leases waiting for their children to reach Redis are still held.
            for settlement in self._settlements[settled:]:
                batch.heartbeat += settlement.acks
                batch.heartbeat += [member for member, *_ in settlement.retries]
                batch.heartbeat += [member for member, _ in settlement.dead]
        batch.maintain = now - self._last_maintenance >= self.config.maintenance_seconds
        if batch.maintain and self.config.keep_alive and not closing:
            batch.revisit_due = _REVISITS_PER_MAINTENANCE
        # A node with nothing of its own left after this step asks whether the fleet has:
        # the crawl ends the moment nothing is left anywhere.
        batch.count = not closing and (
            not self.held
            and len(self._enqueue) <= self.config.batch_max
            and settled == len(self._settlements)
            and self._start is None
        )
        batch.list_dupes = bool(batch.enqueue) and (
            self.config.dupefilter_debug or not self._dupe_logged
        )
        if self._start == "done" and sent_after >= self._start_after:
            batch.start = "done"
        elif self._start == "run" and now - self._last_heartbeat >= self.config.heartbeat_seconds:
            batch.start = "run"
        sent_at = time.monotonic()  # the holder deadline the step sets counts from about here
        result = await self.queue.step(batch)
        self._last_step = sent_at
        self.stats.inc_value("frontier/round_trips")
        if batch.latency:
            self._latency = {}
        wake = result.next_wake_ms
        self._next_wake = None if wake is None else time.monotonic() + wake / 1000
        if batch.pauses:
            self._count("frontier/site_paused", len(batch.pauses))
        if batch.start is not None:
            self._start_settled(batch.start, result.start_held)
        # Only now, with the step known to have run, drop what it carried.
        del self._enqueue[: len(batch.enqueue)]
        self._sent = sent_after
        del self._settlements[:settled]
        self._count("frontier/acked", len(batch.acks))
        self._count("frontier/retried", len(batch.retries))
        self._count("frontier/dead", len(batch.dead))
        if batch.dead:
            self.dead_sink.add([record for _, record in batch.dead])
        if result.poisoned:
            self._on_poisoned(result.poisoned)
        self._count("frontier/settled_stale", result.stale)
        self._count("frontier/refused/offsite", result.offsite)
        if batch.heartbeat:
            self._last_heartbeat = now
        if batch.maintain or batch.count:
            self._counts = result.counts
        if batch.maintain:
            self._last_maintenance = now
            self._seeds_maybe = self._seeds_maybe or bool(result.counts and result.counts[3])
            self._count("frontier/reaped", result.reaped)
            self._count("frontier/retries_due", result.promoted)
            if result.reaped:
                logger.warning(
                    "Put back %d expired leases of dead or stalled nodes",
                    result.reaped,
                    extra={"spider": self.spider},
                )
        if result.rejoined and self._permits:
            self._permits_reclaimed()
        for site, n in [*batch.give_back, *result.spare_back]:
            self._permits[site] -= n
            if self._permits[site] <= 0:
                del self._permits[site]
        granted = sum(n for _, n in result.permits)
        self._walk_open = bool(batch.enqueue) or granted >= (batch.slots or 0) > 0
        self._shares.update(result.shares)
        for site, n in result.permits:
            self._permits[site] += n
            self._unblock(site)
        for site in [s for s, n in self._ready.items() if n <= 0 and not self._holds(s)]:
            # a site this node is done with: forget it (a crawl may see thousands)
            del self._ready[site]
            self._busy.pop(site, None)
            self._shares.pop(site, None)
        self._count(
            "frontier/permits/returned",
            sum(n for _, n in batch.give_back) + sum(n for _, n in result.spare_back),
        )
        self._count("frontier/permits/granted", sum(n for _, n in result.permits))
        self._count("frontier/enqueued", result.added)
        self._count("frontier/duplicates", result.duplicates)
        self._count("dupefilter/filtered", result.duplicates)
        self._count("revisit/recorded", len(batch.revisits))
        self._count("revisit/rediscovered", result.revisits[0])
        self._count("revisit/due", result.revisits[1])
        if result.still_linked:
            self._count("revisit/not_due", len(result.still_linked))
            touch_items(self.crawler, result.still_linked)
        if result.duplicate_at:
            self._log_duplicates([batch.enqueue[i][3] for i in result.duplicate_at])
        self._accept_leases(result.leased)
        self._accept_seeds(result.seeds, batch.seed_want, result.seeds_kind)
        moved = bool(batch.enqueue or result.leased or result.seeds or batch.acks)
        self._check_finished(moved, result.counts if batch.maintain or batch.count else None)
        if result.leased or result.seeds or self.finished or self._held_back:
            self._held_back = False
            wake_engine(self.crawler)
        return moved

    def _holds(self, site: str) -> bool:
        """Permits of *site*, or downloads of it (reclaimed permits leave those running)."""
        return bool(self._permits[site] or self._busy[site])

    def _permits_reclaimed(self) -> None:
        """The fleet gave this node's permits back while it did not step (a stall past its
        lease): it holds none of them; downloads it started before count for no permit."""
        lost = sum(self._permits.values())
        self._count("frontier/permits/reclaimed", lost)
        logger.warning(
            "No round trip for more than the lease time (%.0fs): the fleet took back this"
            " node's %d download permits; it asks for permits again before it downloads more",
            self.config.lease_seconds,
            lost,
            extra={"spider": self.spider},
        )
        self._permits.clear()

    def _log_duplicates(self, payloads: list[bytes]) -> None:
        """Scrapy's dupefilter lines: the first duplicate, or every one with DUPEFILTER_DEBUG."""
        for payload in payloads if self.config.dupefilter_debug else payloads[:1]:
            try:
                url = str(json.loads(payload)["url"])
            except (ValueError, KeyError, TypeError):
                url = preview(payload)
            if self.config.dupefilter_debug:
                logger.debug(
                    "Filtered duplicate request: <%s> (seen by the fleet)",
                    url,
                    extra={"spider": self.spider},
                )
            else:
                logger.debug(
                    "Filtered duplicate request: <%s> - no more duplicates will be shown"
                    " (see DUPEFILTER_DEBUG to show all duplicates)",
                    url,
                    extra={"spider": self.spider},
                )
        self._dupe_logged = True

    def _start_settled(self, asked: str, held: bool) -> None:
        if asked == "done":
            self._start = None
            if held:
                logger.info(
                    "start() ran for the fleet: its requests are in the shared frontier",
                    extra={"spider": self.spider},
                )
        if not held:
            self._start = None
            self.stats.inc_value("frontier/start/claim_lost")
            logger.warning(
                "Lost the claim on start() (not extended within FRONTIER_LEASE_SECONDS): a"
                " waiting node runs start() again; its requests already sent are kept",
                extra={"spider": self.spider},
            )

    async def _key_by_ip(self, batch: StepBatch, resolver: SiteResolver) -> None:
        """Sites named by IP. Retries and pauses keep the site their lease was granted under."""
        names = {entry[1] for entry in batch.enqueue} | {s for s, _, _ in batch.latency}
        names |= {scope[1:] for *_, scope in batch.enqueue if scope.startswith("~")}
        ip = await resolver.resolve_all(names)
        batch.enqueue = [
            (fp, ip[site], priority, payload, _rescope(scope, ip))
            for fp, site, priority, payload, scope in batch.enqueue
        ]
        batch.latency = [(ip[s], total, n) for s, total, n in batch.latency]

    def _count(self, key: str, n: int) -> None:
        if n:
            self.stats.inc_value(key, n)

    def _accept_leases(self, leased: list[Leased]) -> None:
        self._count("frontier/leased", len(leased))
        now = time.monotonic()
        if leased and not self._first_lease:
            self._first_lease = True
            age = process_age()
            if age is not None:
                self.stats.set_value("frontier/first_lease_seconds", round(age, 3))
                logger.info(
                    "First lease %.2fs after the process started",
                    age,
                    extra={"spider": self.spider},
                )
        for entry in leased:
            member = self.queue.request_member(entry.site, entry.payload)
            try:
                request, data = decode_request(entry.payload, self.spider)
            except Exception as exc:  # noqa: BLE001 (a payload from Redis costs at most itself)
                self._refuse(member, "payload", "", entry.site, entry.payload, exc)
                continue
            request.meta[LEASE_META_KEY] = True
            if isinstance(data.get("revisit"), dict):
                request.meta[REVISIT_META_KEY] = data["revisit"]
            # The downloader gives up before the lease is too old to be held.
            timeout = request.meta.get("download_timeout", self.download_timeout)
            request.meta["download_timeout"] = min(timeout, self.config.max_lease_seconds)
            self._heap_counter += 1
            lease = _Lease(member, entry.site, entry.payload, now)
            heapq.heappush(self._heap, (entry.score, self._heap_counter, request, lease))
            self._ready[entry.site] += 1

    def _accept_seeds(self, seeds: list[bytes], asked: int, kind: str = "S") -> None:
        if asked and len(seeds) < asked:
            self._seeds_maybe = False
        for raw in seeds:
            member = self.queue.seed_member(raw, kind)
            try:
                requests = requests_from_seed(self.spider, raw)
                for request in requests:
                    request.meta[SEED_META_KEY] = True
                    # Scheduled through the engine like any request; the seed's own
                    # lease is acked in the same round trip that enqueues it.
                    assert self.crawler.engine is not None
                    self.crawler.engine.crawl(request)
            except Exception as exc:  # noqa: BLE001 (a seed from Redis costs at most itself)
                self._refuse(member, "seed", preview(raw), None, None, exc)
                continue
            self.stats.inc_value("frontier/seeds/accepted")
            self._settle(ack=member)

    def _refuse(
        self,
        member: bytes,
        kind: str,
        url: str,
        site: str | None,
        payload: bytes | None,
        exc: Exception,
    ) -> None:
        """Dead-letter one seed or queue entry that cannot become a request, with its reason."""
        code = exc.code if isinstance(exc, InvalidSeed) else type(exc).__name__
        reason = str(exc)[:300] or type(exc).__name__
        if kind == "seed":
            self.stats.inc_value("frontier/seeds/rejected")
            self.stats.inc_value(f"frontier/seeds/rejected/{code}")
            logger.warning("Rejected seed %r: %s", url, reason, extra={"spider": self.spider})
        else:
            self.stats.inc_value("frontier/undecodable")
            logger.error(
                "Dead-lettering an undecodable queue entry (%s): %s",
                reason,
                preview(payload or b""),
                extra={"spider": self.spider},
            )
            reason = f"undecodable: {reason}"
        outcome = {"error": reason, "kind": kind}
        self._settle(dead=(member, self._dead_record(url, site, outcome, payload)))

    def _live_leases(self, now: float) -> list[bytes]:
        """Leases to heartbeat: a lease older than FRONTIER_MAX_LEASE_SECONDS is let go."""
        live = []
        for request, lease in self._dispatched.items():
            if now - lease.leased_at <= self.config.max_lease_seconds:
                live.append(lease.member)
            elif lease.member not in self._stale:
                self._stale.add(lease.member)
                self.stats.inc_value("frontier/lease_too_old")
                logger.warning(
                    "%s is still in progress after %.0fs (FRONTIER_MAX_LEASE_SECONDS): its lease"
                    " is no longer extended, so another node retries it",
                    request,
                    now - lease.leased_at,
                    extra={"spider": self.spider},
                )
        return live

    def _on_poisoned(self, records: list[bytes]) -> None:
        """Entries whose leases expired FRONTIER_MAX_DELIVERIES times: dead letters now."""
        self._count("frontier/poison", len(records))
        self.dead_sink.add(records)
        for raw in records:
            logger.error(
                "Dead-lettered a request whose lease expired %d times (it may kill nodes): %s",
                self.config.max_deliveries,
                preview(raw),
                extra={"spider": self.spider},
            )

    def _check_finished(self, moved: bool, counts: tuple[int, int, int, int, int] | None) -> None:
        """Finish the moment the fleet has nothing left, with nothing of this node's own.

        Exact, not a grace period: a lease is acknowledged only in the round trip that
        enqueues what its callback produced (or after), start() holds its claim until its
        last request is in, seeds are leased, so the counts are zero only when no node
        holds anything that could still produce work. A node that never saw work waits
        FRONTIER_IDLE_GRACE seconds for a crawl to begin (seeds pushed just after it).
        """
        if moved or (counts is not None and any(counts)):
            self._seen_work = True
        local_busy = bool(
            self.held
            or self._enqueue
            or self._has_settlements()
            or moved
            or self._start is not None
        )
        if local_busy or self.config.keep_alive or self.finished:
            return
        if counts is None or any(counts):
            return  # only counts read in this very round trip say the fleet is done
        if self._seen_work:
            logger.info(
                "Crawl over: no request queued, leased or retried and no seed waiting",
                extra={"spider": self.spider},
            )
            self.finished = True
        elif time.monotonic() - self._started_at >= self.config.idle_grace:
            logger.info(
                "No crawl to join: the frontier stayed empty for %.1fs (FRONTIER_IDLE_GRACE)",
                self.config.idle_grace,
                extra={"spider": self.spider},
            )
            self.finished = True
