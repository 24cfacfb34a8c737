"""The leased request queue: scrapy-redis' queue keys, driven by the Lua scripts in lua/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_redis.queue import Base

from project.frontier import lua
from project.frontier.wire import decode_request, encode_request

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from scrapy import Request, Spider

    from project.frontier.config import SiteLimits
    from project.frontier.keys import FrontierKeys

__all__ = ["Leased", "LeasedQueue", "StepBatch", "StepResult"]


@dataclass
class StepBatch:
    """Everything one round trip sends (the ARGV sections of lua/step.lua)."""

    #: (mode + fingerprint, site, priority, payload, scope)
    enqueue: list[tuple[bytes, str, int, bytes, str]] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)
    #: (member, delay in ms, site, payload)
    retries: list[tuple[bytes, int, str, bytes]] = field(default_factory=list)
    #: (member, dead-letter record)
    dead: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: (fingerprint, interval in ms, "<site>\n<priority>\n<record>\n<payload>") of URLs
    #: under a revisit policy that were fetched (lua/step/revisit.lua)
    revisits: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    heartbeat: list[bytes] = field(default_factory=list)
    #: (site, pause in ms)
    pauses: list[tuple[str, int]] = field(default_factory=list)
    #: (site, seconds summed, samples)
    latency: list[tuple[str, float, int]] = field(default_factory=list)
    #: (site, permits) this node gives back: it has no request of that site for them
    give_back: list[tuple[str, int]] = field(default_factory=list)
    #: (site, requests, permits, held, spare) for sites this node works on: requests to
    #: lease ahead, permits for requests it holds but may not start yet, the permits of the
    #: site it holds, and how many of those have no request to start (the requests taken
    #: ahead use them first; the rest go back)
    ahead: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    #: requests to lease in all, and how many of them with a new download permit (None:
    #: each of them)
    want: int = 0
    slots: int | None = None
    seed_want: int = 0
    maintain: bool = False
    #: Return the counts without maintenance (an idle node looking for the end).
    count: bool = False
    #: "run": extend this node's claim on the spider's start(); "done": end it (lua/start.lua)
    start: str | None = None
    #: Ask where the duplicates are in ``enqueue`` (to log them).
    list_dupes: bool = False
    #: With maintenance, hand out up to this many due revisits (FRONTIER_KEEP_ALIVE).
    revisit_due: int = 0


@dataclass(frozen=True, slots=True)
class Leased:
    """A request leased to this node: its site, payload and queue score."""

    site: str
    payload: bytes
    score: float


@dataclass
class StepResult:
    """What one round trip returned."""

    added: int
    duplicates: int
    leased: list[Leased]
    seeds: list[bytes]
    reaped: int
    promoted: int
    counts: tuple[int, int, int, int, int] | None  # queued, delayed, inflight, seeds, starting
    #: Milliseconds until the next throttled site may go, by Redis' clock.
    next_wake_ms: int | None
    #: Dead-letter records of entries whose leases expired FRONTIER_MAX_DELIVERIES times.
    poisoned: list[bytes] = field(default_factory=list)
    #: Retries and dead letters dropped because their lease had been reaped meanwhile.
    stale: int = 0
    #: Requests dropped because their scope does not allow their site.
    offsite: int = 0
    #: Whether this node still holds the start claim the batch extended or ended.
    start_held: bool = False
    #: Positions in the batch's ``enqueue`` of the duplicates, when asked.
    duplicate_at: list[int] = field(default_factory=list)
    #: "S": the seeds came from a list, "T": from a set (see :meth:`LeasedQueue.seed_member`).
    seeds_kind: str = "S"
    #: Download permits granted with the leases: (site, n).
    permits: list[tuple[str, int]] = field(default_factory=list)
    #: This node's share of the cap of each site it named in ``ahead`` (0: no cap).
    shares: dict[str, int] = field(default_factory=dict)
    #: Spare permits of the sites named in ``ahead`` that went back: (site, n).
    spare_back: list[tuple[str, int]] = field(default_factory=list)
    #: Seen URLs queued again because their revisit was due: rediscovered, handed out.
    revisits: tuple[int, int] = (0, 0)
    #: Records of URLs rediscovered before their revisit is due: their items are still there.
    still_linked: list[bytes] = field(default_factory=list)
    #: This node was no permit holder when the step began (its first step, or it stalled
    #: past its deadline and maintenance gave every permit it held back to the fleet).
    rejoined: bool = False


class LeasedQueue(Base):  # type: ignore[misc]
    """scrapy-redis queue whose pops are leases, with JSON on the wire.

    Requests wait in per-site sorted sets indexed by ``<spider>:requests``,
    scored by priority and then arrival order. Taking one moves it to
    ``<spider>:inflight`` under a deadline and the node's id; it leaves only
    when acknowledged, retried (``<spider>:delayed``) or dead-lettered
    (``<spider>:dead``), or when its lease expires and any node puts it back.
    """

    def __init__(
        self,
        server: Redis,
        spider: Spider,
        keys: FrontierKeys,
        node_id: str,
        lease_ms: int,
        limits: SiteLimits,
        max_deliveries: int = 3,
    ) -> None:
        self.server = server
        self.spider = spider
        self.key = keys.queue
        self.keys = keys
        self.node_id = node_id
        self.lease_ms = lease_ms
        self.limits = limits
        self.max_deliveries = max_deliveries
        #: The seen-set's form (project/frontier/seen.py), known once the node reached Redis.
        self.seen_form: dict[str, Any] = {"mode": "set"}
        #: The fleet keeps crawl runs (set by project/runs/tracker.py): a seed is queued
        #: once per run (lua/step/enqueue.lua), not each time it is pushed.
        self.runs = False
        self.member_prefix = node_id.encode() + b"\n"
        self._scripts = {name: lua.load(name) for name in ("step", "release", "start")}
        self._step = server.register_script(self._scripts["step"].source)
        self._release = server.register_script(self._scripts["release"].source)
        self._start = server.register_script(self._scripts["start"].source)

    def _encode_request(self, request: Request, **extra: Any) -> bytes:
        return encode_request(request, self.spider, **extra)

    def _decode_request(self, encoded_request: bytes) -> Request:
        return decode_request(encoded_request, self.spider)[0]

    def _options(self, batch: StepBatch) -> bytes:
        lim = self.limits
        options = {
            "node": self.node_id,
            "lease_ms": self.lease_ms,
            "want": batch.want,
            "slots": batch.want if batch.slots is None else batch.slots,
            "seed_want": batch.seed_want,
            "maintain": batch.maintain,
            "max_deliveries": self.max_deliveries,
            "limits": {
                "rate": lim.rate,
                "concurrency": lim.concurrency,
                "burst_seconds": lim.burst_seconds,
                "adaptive": lim.adaptive,
                "target_concurrency": lim.target_concurrency,
                "min_rate": lim.min_rate,
                "start_rate": lim.start_rate,
            },
            "counts": {
                "enqueue": len(batch.enqueue),
                "ack": len(batch.acks),
                "retry": len(batch.retries),
                "dead": len(batch.dead),
                "revisit": len(batch.revisits),
                "heartbeat": len(batch.heartbeat),
                "give_back": len(batch.give_back),
                "pause": len(batch.pauses),
                "latency": len(batch.latency),
                "ahead": len(batch.ahead),
            },
        }
        if batch.count:
            options["count"] = True
        if batch.start is not None:
            options["start"] = batch.start
        if batch.list_dupes:
            options["list_dupes"] = True
        if self.seen_form["mode"] != "set":
            options["seen"] = self.seen_form
        if self.runs:
            options["runs"] = True
        if batch.revisit_due:
            options["revisit"] = batch.revisit_due
        return json.dumps(options, separators=(",", ":")).encode()

    async def step(self, batch: StepBatch) -> StepResult:
        """Run one atomic frontier step (lua/step.lua): enqueue, settle, heartbeat, lease."""
        argv: list[Any] = [self._options(batch)]
        for entry in batch.enqueue:
            argv += entry
        argv += batch.acks
        for retry in batch.retries:
            argv += retry
        for dead in batch.dead:
            argv += dead
        for revisit in batch.revisits:
            argv += revisit
        argv += batch.heartbeat
        for give_back in batch.give_back:
            argv += give_back
        for pause in batch.pauses:
            argv += pause
        for sample in batch.latency:
            argv += sample
        for ahead in batch.ahead:
            argv += ahead
        keys = self._scripts["step"].keys_from(self.keys)
        reply = await self._step(keys=keys, args=argv)
        added, dupes, leased, seeds, reaped, promoted, counts, wake, poisoned, stale, offsite = (
            reply[:11]
        )
        return StepResult(
            added=int(added),
            duplicates=int(dupes),
            leased=[
                # A site is what the node enqueued; bytes that are not UTF-8 survive as written.
                Leased(
                    leased[j].decode("utf-8", "surrogateescape"),
                    leased[j + 1],
                    float(leased[j + 2]),
                )
                for j in range(0, len(leased), 3)
            ],
            seeds=list(seeds),
            reaped=int(reaped),
            promoted=int(promoted),
            counts=(int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]), int(counts[4]))
            if counts
            else None,
            next_wake_ms=None if wake is None else int(wake),
            poisoned=list(poisoned),
            stale=int(stale),
            offsite=int(offsite),
            start_held=bool(reply[11]),
            seeds_kind=reply[13].decode() if isinstance(reply[13], bytes) else str(reply[13]),
            duplicate_at=[int(i) for i in reply[12]],
            permits=[
                (reply[14][j].decode("utf-8", "surrogateescape"), int(reply[14][j + 1]))
                for j in range(0, len(reply[14]), 2)
            ],
            shares={
                reply[15][j].decode("utf-8", "surrogateescape"): int(reply[15][j + 1])
                for j in range(0, len(reply[15]), 3)
            },
            spare_back=[
                (reply[15][j].decode("utf-8", "surrogateescape"), int(reply[15][j + 2]))
                for j in range(0, len(reply[15]), 3)
                if int(reply[15][j + 2])
            ],
            revisits=(int(reply[16][0]), int(reply[16][1])),
            still_linked=list(reply[17]),
            rejoined=bool(reply[18]),
        )

    async def claim_start(self, *, new_crawl: bool) -> str:
        """Ask for the spider's start() (lua/start.lua): ``claimed``, ``running`` or ``done``."""
        options = json.dumps(
            {"node": self.node_id, "lease_ms": self.lease_ms, "new_crawl": new_crawl}
        )
        keys = self._scripts["start"].keys_from(self.keys)
        reply = await self._start(keys=keys, args=[options])
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    async def release(self, members: list[bytes]) -> int:
        """Give leases back to the queue, and every download permit to the fleet, at once
        (clean shutdown); returns the leases given back."""
        keys = self._scripts["release"].keys_from(self.keys)
        return int(await self._release(keys=keys, args=[self.node_id, *members]))

    def request_member(self, site: str, payload: bytes) -> bytes:
        """The in-flight member under which this node holds *payload* of *site*."""
        return self.member_prefix + b"R" + site.encode("utf-8", "surrogateescape") + b"\n" + payload

    def seed_member(self, raw: bytes, kind: str = "S") -> bytes:
        """The in-flight member under which this node holds the raw seed *raw* (*kind*: "S"
        for a seed of the list, "T" of the set, as the step took it)."""
        return self.member_prefix + kind.encode() + raw

    def __len__(self) -> int:
        raise TypeError("LeasedQueue has no cheap length: see project.monitoring.status")

    def push(self, request: Request) -> None:
        raise TypeError("LeasedQueue batches pushes: use FleetScheduler.enqueue_request()")

    def pop(self, timeout: int = 0) -> None:
        raise TypeError("LeasedQueue leases instead of popping: use FleetScheduler")
