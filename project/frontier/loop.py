"""The node's side of the shared frontier: its leases, its buffers, one round trip per tick."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from project.blocking.pool import pool_of
from project.frontier.autotune import Autotune, AutotuneConfig
from project.frontier.claim import StartClaim
from project.frontier.clock import FleetClock
from project.frontier.codes import MODE_ALWAYS, START_END
from project.frontier.ending import CrawlEnd
from project.frontier.engine import requests_in_progress, wake_engine
from project.frontier.handover import Handover
from project.frontier.ledger import PermitLedger
from project.frontier.meta import OUTCOME_META_KEY
from project.frontier.outage import RedisOutage
from project.frontier.outcomes import count_step, settle_request
from project.frontier.queue import StepBatch
from project.frontier.rejects import log_duplicates, log_poisoned
from project.frontier.revisit import RevisitConfig, touch_items
from project.frontier.seen import BloomFill
from project.frontier.settlements import SettlementQueue
from project.frontier.signals import store_backpressure
from project.frontier.sites import SiteResolver, site_of
from project.rendering.plan import plan_of

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.frontier.config import FrontierConfig
    from project.frontier.queue import Counts, LeasedQueue, StepResult
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
#: Seconds the first round trip waits at most for what it waits for (the crawl run's join).
_FIRST_STEP_WAIT = 2.0
#: Seconds after its start a node that has leased nothing yet steps every tick while the
#: fleet has work: it joins at once (later, an idle node's polls slow down to spare Redis).
_STARTING = 5.0


#: Due revisits one maintenance hands out (FRONTIER_KEEP_ALIVE).
_REVISITS_PER_MAINTENANCE = 500


def _harmed_by_a_second_run(batch: StepBatch) -> bool:
    """Whether running *batch*'s step twice would do harm, so it carries a seq (one command
    more): entries queued whatever was seen, dead letters and retries written twice, permits
    given back twice (the node would download past the cap until its next permit table),
    downloads told of the fleet's sessions counted twice (a proven pair's one block would
    read as two and ban it), render outcomes counted twice. A second run of the rest costs leases that expire and permits
    the table corrects."""
    return bool(
        batch.dead
        or batch.retries
        or batch.give_back
        or any(fp[:1] == MODE_ALWAYS for fp, *_ in batch.enqueue)
        or any(entry[0] in ("ok", "block") for entry in batch.sessions)
        or bool(batch.render)
    )


class FrontierLoop:
    """Leases in a local heap, requests to enqueue and leases to settle, and the task
    that sends them to Redis: at most one Lua round trip per tick (lua/step.lua).

    The engine-facing side (:meth:`buffer`, :meth:`pop`) never touches the network. The
    permits and leased requests live in a :class:`PermitLedger`, the acks, retries and
    dead letters waiting for their children in a :class:`SettlementQueue`.
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
        self.ledger = PermitLedger(config.concurrency, config.prefetch)
        self.settlements = SettlementQueue()
        self.handover = Handover(crawler, spider, config, queue, self.ledger, self.settlements)
        self.claim = StartClaim(self.stats, spider)
        self.end = CrawlEnd(config.idle_grace, config.keep_alive, spider)
        #: Redis' time, for what the fleet compares (the item store stamps items by it)
        self.clock = FleetClock()
        revisits = RevisitConfig.from_settings(crawler.settings)
        #: Count steps sweep due revisits the run did not see (a keep-alive fleet hands them
        #: out anyway).
        self._sweep = bool(revisits.rules and revisits.sweep and not config.keep_alive)
        self._revisit_limits = revisits.limits() if revisits.rules else None
        self._revisit_max_record = revisits.max_record_bytes
        self._enqueue: list[tuple[bytes, str, int, bytes, str]] = []
        self._latency: dict[str, list[float]] = {}
        self._resolver = SiteResolver(config.site_ip_ttl) if config.site_key == "ip" else None
        self._next_wake: float | None = None  # monotonic time a throttled site may go
        self._seeds_maybe = True
        self._counts: Counts | None = None
        self._dupe_logged = False  # Scrapy logs the first duplicate, or all with DUPEFILTER_DEBUG
        self._last_step = 0.0
        self._released = 0  # unstarted leases the last step handed back (a closing one)
        self._held_back = False  # pop() refused to dispatch while no step confirmed the permits
        self._walk_open = True  # the last round trip's walk used every slot it asked for
        self._closing = False
        #: Asked to stop (project/frontier/stopping.py): nothing more is leased or seeded.
        self._stopping = False
        #: The stop grace is over: requests held at the permit gate go on, to be cut.
        self._downloads_cut = False
        self._closed = asyncio.Event()  # set by stop(): sleeps of the I/O task end
        self._wakeup = asyncio.Event()
        self._step_done = asyncio.Event()  # set, and replaced, after each step applied
        self._task: asyncio.Task[None] | None = None
        #: What the first round trip waits for (at most _FIRST_STEP_WAIT): the crawl run's
        #: join (project/runs/tracker.py), so that it may take seeds
        self._first_step_after: list[asyncio.Future[Any]] = []
        self._last_heartbeat = 0.0
        self._last_maintenance = 0.0
        self._seq = int.from_bytes(os.urandom(4), "big") << 16  # this process's steps
        #: (when built, batch, settlements) of a step whose round trip failed: sent again
        self._unsent: tuple[float, StepBatch, int] | None = None
        self._bloom_fill: BloomFill | None = None
        self.outage = RedisOutage(self.stats, spider, config.redis_name)
        #: The item store is behind (project/storage/backlog.py): no downloads start, nothing
        #: more is leased, until it catches up.
        self.store_behind = False
        #: The fleet's sessions as this node sees them; told with each step what its
        #: downloads saw (project/blocking/pool.py), None without sessions.
        self.sessions = pool_of(crawler)
        if self.sessions is not None:
            self.sessions.clock = self.clock.now
        #: Which pages the fleet renders (project/rendering/plan.py), None without
        #: PLAYWRIGHT_ADAPTIVE.
        self.render_plan = plan_of(crawler)
        #: FLEET_AUTOTUNE: the node's downloads at once, moved by what it measures
        tune = AutotuneConfig.from_settings(crawler.settings)
        self.autotune = Autotune(tune, config.concurrency, self.stats) if tune.enabled else None
        if self.autotune is not None:
            self.ledger.concurrency = self.autotune.limit
        crawler.signals.connect(self._store_backpressure, signal=store_backpressure)

    # -- engine side (no I/O) ----------------------------------------------

    def buffer(
        self, fingerprint: bytes, site: str, priority: int, payload: bytes, scope: str
    ) -> None:
        """Queue a request for the next round trip (*scope*: see lua/step/enqueue.lua)."""
        self._enqueue.append((fingerprint, site, priority, payload, scope))
        self.settlements.buffered += 1
        if len(self._enqueue) >= self.config.batch_max:
            self._wakeup.set()

    def pop(self) -> Request | None:
        """The best leased request whose site has a free download permit, now dispatched."""
        self._wakeup.set()
        if self._stalled() or self.store_behind:
            # it starts nothing before its next step says which permits it still holds, or
            # while its store is behind
            self._held_back = self.ledger.has_heap
            return None
        request = self.ledger.pop()
        if request is not None:
            self.stats.inc_value("frontier/dispatched")
            # Scrapy's scheduler counts these (and scrapy-redis' its /redis share)
            self.stats.inc_value("scheduler/dequeued")
            self.stats.inc_value("scheduler/dequeued/redis")
        return request

    def download_ended(self, request: Request) -> None:
        """*request* left the downloader: its permit may start the next request of its site."""
        lease = self.ledger.dispatched.get(request)
        if lease is not None:
            self.ledger.end_download(lease)

    def has_pending(self) -> bool:
        """Leased requests not dispatched yet, or requests not enqueued yet."""
        return self.ledger.pending or bool(self._enqueue)

    def __len__(self) -> int:
        return self.ledger.undispatched_count

    @property
    def fleet_idle(self) -> bool:
        """The fleet had no work at this node's last count, and this node holds none."""
        counts = self._counts
        return (
            counts is not None
            and not any(counts)
            and not self.held
            and not self._enqueue
            and not self.settlements
        )

    @property
    def held(self) -> int:
        """Requests this node holds: leased but not yet settled."""
        return self.ledger.held

    @property
    def downloading(self) -> int:
        """Requests this node downloads now (each holds a permit of its site)."""
        return self.ledger.downloading

    @property
    def finished(self) -> bool:
        """The crawl is over for this node (:class:`CrawlEnd`)."""
        return self.end.finished

    def begin_start(self) -> None:
        """This node holds the claim on the spider's start(): extend it with the heartbeats."""
        self.claim.begin()

    @property
    def runs_start(self) -> bool:
        """Whether this node holds the claim on the spider's start() (not lost, not ended)."""
        return self.claim.held

    def end_start(self) -> None:
        """start() is over: end the claim once every request it yielded is in Redis."""
        if self.claim.end(self.settlements.buffered):
            self._wakeup.set()

    async def may_download(self, request: Request) -> None:
        """Hold *request*, dispatched, until this node may put it on the wire: a round trip
        within half a lease (a node that stalled learns first whether the fleet took its
        permits back), and a permit of its site for each of its downloads of it."""
        lease = self.ledger.dispatched.get(request)
        counted = False
        while (
            lease is not None
            and not self._closing
            and not self._downloads_cut
            and (self._stalled() or not self.ledger.covered(lease.site))
        ):
            if not counted:
                counted = True
                self.stats.inc_value("frontier/permits/held_back")
            self._wakeup.set()
            await self._step_done.wait()
            lease = self.ledger.dispatched.get(request)

    def _store_backpressure(self, behind: bool) -> None:
        self.store_behind = behind
        if not behind:
            self._held_back = False
            wake_engine(self.crawler)

    def _stalled(self) -> bool:
        """No round trip for half a lease (a stall, a partition): the fleet may have taken this
        node's permits back."""
        return time.monotonic() - self._last_step > self.config.lease_seconds / 2

    def record_latency(self, url: str, seconds: float) -> None:
        """A download latency sample for adaptive throttling and the autotune."""
        if self.config.limits.adaptive:
            self._latency.setdefault(site_of(url), []).append(seconds)
        if self.autotune is not None:
            self.autotune.download_ended(seconds)

    # -- lifecycle -----------------------------------------------------------

    def begin_stop(self) -> None:
        """The node was asked to stop: lease and seed nothing more from the next round trip
        on (which gives spare permits back); what is leased goes back when it closes."""
        self._stopping = True
        self._wakeup.set()

    def cut_downloads(self) -> None:
        """The stop grace is over: nothing waits at the permit gate any more (the download
        handler cuts what reaches it), so a node stalled or cut off from Redis still closes."""
        self._downloads_cut = True
        self._step_done.set()

    def step_age(self) -> float | None:
        """Seconds since the last round trip was sent; None before the first."""
        return time.monotonic() - self._last_step if self._last_step else None

    def start(self) -> None:
        """Start the I/O task on the running asyncio loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())
        if self.autotune is not None:
            self.autotune.start()

    async def stop(self) -> None:
        """Stop the task, settle and flush what is left, give unstarted leases back."""
        self._closing = True
        self._closed.set()
        self._wakeup.set()
        self._step_done.set()  # downloads held back go: the node closes
        if self.autotune is not None:
            self.autotune.stop()
        if self._task is not None:
            await self._task
        # Everything dispatched has left the engine by now.
        self._reconcile(force=True)
        try:
            # the step that settles what is left hands back the rest in the same round trip
            # (step/release.lua); with nothing to settle, the release script alone does
            released: int | None = None
            while self._enqueue or self.settlements or self.claim.state == START_END:
                await self._step(closing=True)
                released = (released or 0) + self._released
                # its permits went back with that step: a next one (more to settle) finds
                # the node no holder any more, which is no reclaim
                self.ledger.release()
            if released is None:
                held = [lease.member for lease in self.ledger.undispatched()]
                released = await self.queue.release(held)
                self.ledger.release()
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

    def before_first_step(self, waiting: asyncio.Future[Any]) -> None:
        """Hold the first round trip until *waiting* is done, or _FIRST_STEP_WAIT seconds."""
        self._first_step_after.append(waiting)

    async def _run(self) -> None:
        tick = self.config.tick_seconds
        delay = tick
        if self._first_step_after:
            await asyncio.wait(self._first_step_after, timeout=_FIRST_STEP_WAIT)
            self._first_step_after.clear()
        self.end.started_at = time.monotonic()
        hurried = False  # the one round trip sent without its tick (below)
        while not self._closing:
            started = time.monotonic()
            hurry = False
            self._reconcile()
            if self.autotune is not None:
                self.autotune.in_flight(sum(self.ledger.busy.values()))
                self.ledger.concurrency = self.autotune.tick(started)
            if delay <= tick and not self._step_needed(started):
                # Enough leased for another tick and nothing urgent: one round trip fewer.
                await self._pause(tick)
                continue
            try:
                busy = await self._step()
                self.dead_sink.kick()
            except RedisError as exc:
                self.outage.began(exc, started, len(self._enqueue))
                delay = min(max(delay * 2, _BACKOFF_MIN), _BACKOFF_MAX)
            except Exception:
                # A bug here must not silently stop the node's frontier.
                self.stats.inc_value("frontier/errors")
                logger.exception("Frontier step failed", extra={"spider": self.spider})
                delay = min(max(delay * 2, _BACKOFF_MIN), _BACKOFF_MAX)
            else:
                self.outage.ended()
                delay = tick if busy else min(max(delay * 2, tick), self.config.idle_poll_max)
                if self._counts is not None and any(self._counts):
                    delay = min(delay, max(tick, _END_POLL))  # the fleet still works
                    if not self.handover.leased_any and started - self.end.started_at < _STARTING:
                        delay = tick  # a node starting: its first lease is what it waits for
                if self._next_wake is not None and self.ledger.slots():
                    # A throttled site gets tokens then: be there to lease them.
                    delay = min(delay, max(tick, self._next_wake - time.monotonic()))
                # Once in a node's life, after a step that ran: a node that has leased nothing
                # yet and holds requests its seeds (or start()) just made sends them at once,
                # so its first lease comes a round trip after its seeds, not a tick after.
                hurry = not hurried and not self.handover.leased_any and bool(self._enqueue)
                hurried = hurried or hurry
            # At most one round trip per tick; sooner only when woken with work (or in a hurry).
            if not hurry or self._closing:
                await self._pause(tick - (time.monotonic() - started))
            self._wakeup.clear()
            if delay > tick and not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                if self._wakeup.is_set() and (
                    self._enqueue or self.ledger.dispatched or self.ledger.slots()
                ):
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
        return (
            self._closing
            or self.claim.state is not None
            or not self.held
            or now - self._last_step >= _MAX_SKIPPED_TICKS * config.tick_seconds
            or now - self._last_heartbeat >= config.heartbeat_seconds
            or now - self._last_maintenance >= config.maintenance_seconds
            or len(self._enqueue) >= config.batch_max // 4
            or bool(self._seeds_maybe and self._seed_want())
            or bool(self._walk_open and self.ledger.slots())
            or self.ledger.runs_short()
            or bool(self.sessions is not None and self.sessions.waiting)
        )

    def _seed_want(self) -> int:
        # a node with nothing to do always looks: a seed pushed now is taken at once
        if self._closing or self._stopping or not (self._seeds_maybe or not self.held):
            return 0
        return self.config.seed_batch

    def _reconcile(self, force: bool = False) -> None:
        """Turn requests that left the engine into acks, retries or dead letters."""
        if not self.ledger.dispatched:
            return
        inprogress = set() if force else requests_in_progress(self.crawler)
        for request in [r for r in self.ledger.dispatched if r not in inprogress]:
            lease = self.ledger.settle(request)  # it never reached the downloader, or left unseen
            outcome = request.meta.get(OUTCOME_META_KEY)
            node = self.config.node_id
            settle_request(
                request, lease, outcome, self.settlements, self.crawler, self.spider, node,
                self.clock.now(), self._revisit_max_record,
            )  # fmt: skip

    # -- one round trip ----------------------------------------------------------

    async def _step(self, closing: bool = False) -> bool:
        """One round trip. Returns True when it moved anything.

        A step whose round trip failed (Redis away, a reply lost) may have run: its batch
        goes again as it was, with its seq, so Redis runs it at most once (``replayed``).
        """
        if self._unsent is not None and not closing:
            now, batch, settled = self._unsent
        else:
            now = time.monotonic()
            batch, settled = await self._build(now, closing)
            if _harmed_by_a_second_run(batch):
                self._seq += 1
                batch.seq = self._seq
        if closing:
            # the node closes: every permit and unstarted lease goes back after the settling
            batch.releasing = True
            batch.release = [lease.member for lease in self.ledger.undispatched()]
        self._unsent = (now, batch, settled)
        sent_at = time.monotonic()  # the holder deadline the step sets counts from about here
        wall_sent = time.time()
        result = await self.queue.step(batch)
        self._unsent = None
        self.clock.observe(result.now_ms, wall_sent, time.time())
        if result.replayed:
            self.stats.inc_value("frontier/steps_replayed")
        self._last_step = sent_at
        self._released = result.released
        self.stats.inc_value("frontier/round_trips")
        moved = self._apply(now, batch, settled, result)
        done, self._step_done = self._step_done, asyncio.Event()
        done.set()
        return moved

    async def _build(self, now: float, closing: bool) -> tuple[StepBatch, int]:
        """The batch of one round trip, and how many settlements it carries."""
        config = self.config
        batch = StepBatch(seed_want=0 if closing else self._seed_want())
        # a fleet that keeps runs takes seeds once in the run (a keep-alive one's begin with work)
        batch.join_first = self.queue.runs and not config.keep_alive
        if not closing:
            # behind, its store takes no more: it leases nothing, gives spare permits back
            # asked to stop, it leases nothing more either
            most = 0 if self.store_behind or self._stopping else config.batch_max
            self.ledger.plan(batch, most)
        batch.enqueue = self._enqueue[: config.batch_max]
        # Settle a lease only once everything its callback produced is sent: in an
        # earlier round trip, or in this one (the script enqueues before it settles).
        sent_after = self.settlements.sent + len(batch.enqueue)
        settled = self.settlements.collect(batch, sent_after)
        if self._latency:
            batch.latency = [(site, sum(v), len(v)) for site, v in self._latency.items()]
        if self.sessions is not None:
            batch.sessions = self.sessions.take_entries()
            batch.session_options = self.sessions.options(batch.sessions)
        if self.render_plan is not None:
            batch.render = self.render_plan.take_entries()
            batch.render_options = self.render_plan.options()
        if self._resolver is not None:
            await self._resolver.rekey(batch)
        if now - self._last_heartbeat >= config.heartbeat_seconds:
            batch.heartbeat = [lease.member for lease in self.ledger.undispatched()]
            batch.heartbeat += self._live_leases(now)
            # Leases waiting for their children to reach Redis are still held.
            batch.heartbeat += self.settlements.waiting(settled)
            # and the permits this node holds, as it counts them after this step's give-backs:
            # Redis corrects to them (a reply lost, a step replayed, permits taken back)
            batch.permit_table = self.ledger.table(batch.give_back)
            batch.permit_check = True
        batch.maintain = now - self._last_maintenance >= config.maintenance_seconds
        if batch.maintain and config.keep_alive and not closing:
            batch.revisit_due = _REVISITS_PER_MAINTENANCE
        # A node with nothing of its own left after this step asks whether the fleet has:
        # the crawl ends the moment nothing is left anywhere.
        batch.count = not closing and (
            not self.held
            and len(self._enqueue) <= config.batch_max
            and settled == len(self.settlements)
            and self.claim.state is None
        )
        if batch.count and self._sweep and self.end.seen_work:
            # only a node that saw this run's crawl: one that starts after a crawl ended
            # must not fetch the catalogue again in a run of its own
            batch.sweep = _REVISITS_PER_MAINTENANCE
        batch.revisit_limits = self._revisit_limits
        batch.list_dupes = bool(batch.enqueue) and (
            config.dupefilter_debug or not self._dupe_logged
        )
        batch.start = self.claim.ask(
            sent_after, now - self._last_heartbeat >= config.heartbeat_seconds
        )
        return batch, settled

    def _apply(self, now: float, batch: StepBatch, settled: int, result: StepResult) -> bool:
        """Take in what a step that ran returned. Returns True when it moved anything."""
        if batch.latency:
            self._latency = {}
        if self.sessions is not None and batch.session_options is not None:
            self.sessions.apply(result.sessions, result.retired, result.probes)
            if result.retired:
                self._count("sessions/retired", result.retired)
            if result.sites_forgotten:
                self._count("sessions/sites_forgotten", result.sites_forgotten)
        wake = result.next_wake_ms
        self._next_wake = None if wake is None else time.monotonic() + wake / 1000
        count_step(self.stats, batch, result)
        if self.render_plan is not None and batch.render_options is not None:
            self.render_plan.apply(result.render)
            if result.patterns_forgotten:
                self._count("render/adaptive/forgotten", result.patterns_forgotten)
        if batch.start is not None:
            self.claim.settled(batch.start, result.start_held)
        # Only now, with the step known to have run, drop what it carried.
        del self._enqueue[: len(batch.enqueue)]
        self.settlements.sent_with(settled, len(batch.enqueue))
        if batch.dead:
            self.dead_sink.add([record for _, record in batch.dead])
        if result.poisoned:
            self.dead_sink.add(result.poisoned)
            log_poisoned(result.poisoned, self.config.max_deliveries, self.spider)
        if batch.heartbeat:
            self._last_heartbeat = now
        if batch.maintain or batch.count:
            self._counts = result.counts
            if result.seen_count is not None:
                if self._bloom_fill is None:
                    self._bloom_fill = BloomFill(self.queue.seen_form, self.stats, self.spider)
                self._bloom_fill.update(result.seen_count)
        if batch.maintain:
            self._last_maintenance = now
            self._seeds_maybe = self._seeds_maybe or bool(result.counts and result.counts.seeds)
            if result.reaped:
                logger.warning(
                    "Put back %d expired leases of dead or stalled nodes",
                    result.reaped,
                    extra={"spider": self.spider},
                )
        self._apply_permits(batch, result)
        if result.still_linked:
            touch_items(self.crawler, result.still_linked)
        if result.duplicate_at:
            debug = self.config.dupefilter_debug
            log_duplicates([batch.enqueue[i][3] for i in result.duplicate_at], debug, self.spider)
            self._dupe_logged = True
        self.handover.leases(result.leased)
        if batch.seed_want and len(result.seeds) < batch.seed_want:
            self._seeds_maybe = False
        self.handover.seeds(result.seeds, result.seeds_kind)
        moved = bool(batch.enqueue or result.leased or result.seeds or batch.acks)
        local_busy = bool(
            self.held or self._enqueue or self.settlements or self.claim.state is not None
        )
        self.end.observe(
            moved, result.counts if batch.maintain or batch.count else None, local_busy
        )
        if result.leased or result.seeds or self.finished or self._held_back:
            self._held_back = False
            wake_engine(self.crawler)
        return moved

    def _apply_permits(self, batch: StepBatch, result: StepResult) -> None:
        ledger = self.ledger
        if result.rejoined and ledger.permits:
            lost = ledger.reclaimed()
            self._count("frontier/permits/reclaimed", lost)
            logger.warning(
                "No round trip for more than the lease time (%.0fs): the fleet took back this"
                " node's %d download permits; it asks for permits again before it downloads"
                " more",
                self.config.lease_seconds,
                lost,
                extra={"spider": self.spider},
            )
        if result.permits_fixed:
            self._count("frontier/permits/corrected", result.permits_fixed)
            logger.warning(
                "Redis counted %d download permits for this node that it never heard of (a"
                " reply lost): they went back to the fleet",
                result.permits_fixed,
                extra={"spider": self.spider},
            )
        if result.permits_held:
            dropped = ledger.correct(result.permits_held, batch.give_back)
            self._count("frontier/permits/dropped", dropped)
        returned = [*batch.give_back, *result.spare_back]
        granted = sum(n for _, n in result.permits)
        self._walk_open = bool(batch.enqueue) or granted >= (batch.slots or 0) > 0
        ledger.apply(returned, result.permits, result.shares)
        self._count("frontier/permits/returned", sum(n for _, n in returned))
        self._count("frontier/permits/granted", granted)

    def _count(self, key: str, n: int) -> None:
        if n:
            self.stats.inc_value(key, n)

    def _live_leases(self, now: float) -> list[bytes]:
        """Leases to heartbeat: a lease older than FRONTIER_MAX_LEASE_SECONDS is let go."""
        live, too_old = self.ledger.live(now, self.config.max_lease_seconds)
        for request, age in too_old:
            self.stats.inc_value("frontier/lease_too_old")
            logger.warning(
                "%s is still in progress after %.0fs (FRONTIER_MAX_LEASE_SECONDS): its lease"
                " is no longer extended, so another node retries it",
                request,
                age,
                extra={"spider": self.spider},
            )
        return live
