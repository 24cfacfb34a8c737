"""The leased request queue: scrapy-redis' queue keys, driven by the Lua scripts in lua/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from scrapy_redis.queue import Base

from project.frontier import lua
from project.frontier.codes import MEMBER_REQUEST, SEEDS_LIST
from project.frontier.wire import decode_request, encode_request

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from scrapy import Request, Spider

    from project.frontier.config import SiteLimits
    from project.frontier.keys import FrontierKeys

__all__ = ["REPLY", "SECTIONS", "Counts", "Leased", "LeasedQueue", "StepBatch", "StepResult"]

#: The step's ARGV sections, in ARGV order: (name, StepBatch attribute, the fields of one
#: entry). Sent to the script as options.sections (lua/lib/sections.lua); each phase's
#: header names its section's fields (tests/test_lua_wire.py holds them together).
SECTIONS: Final = (
    ("enqueue", "enqueue", ("fingerprint", "site", "priority", "payload", "scope")),
    ("ack", "acks", ("member",)),
    ("retry", "retries", ("member", "delay_ms", "site", "payload")),
    ("dead", "dead", ("member", "record")),
    ("revisit", "revisits", ("fingerprint", "interval_ms", "record")),
    ("heartbeat", "heartbeat", ("member",)),
    ("give_back", "give_back", ("site", "permits")),
    ("permit_table", "permit_table", ("site", "permits")),
    ("pause", "pauses", ("site", "pause_ms")),
    ("latency", "latency", ("site", "seconds", "samples")),
    ("session", "sessions", ("kind", "site", "id", "proxy", "data")),
    ("render", "render", ("pattern", "outcome", "data")),
    ("ahead", "ahead", ("site", "requests", "permits", "held", "spare")),
    ("release", "release", ("member",)),
)

#: The names of the step's reply, name/value pairs (lua/step.lua's header).
REPLY: Final = (
    "added",
    "duplicates",
    "offsite",
    "duplicate_at",
    "rediscovered",
    "still_linked",
    "stale",
    "reaped",
    "promoted",
    "poisoned",
    "handed_out",
    "revisits_capped",
    "revisits_forgotten",
    "permits_fixed",
    "permits_held",
    "leased",
    "permits",
    "shares",
    "rejoined",
    "seeds",
    "seeds_kind",
    "start_held",
    "counts",
    "wait_ms",
    "now",
    "replayed",
    "sessions",
    "retired",
    "probes",
    "sites_forgotten",
    "render",
    "patterns_forgotten",
    "released",
)

_MEMBER_REQUEST = MEMBER_REQUEST.encode()
_LEASED_WIDTH = 3  # site, payload, score
_PERMITS_WIDTH = 2  # site, n
_SHARES_WIDTH = 3  # site, share, back


class Counts(NamedTuple):
    """The fleet's work, as a step counted it. A count without maintenance stops at the
    first above zero (queued, inflight, delayed, seeds, starting: lib/crawl.lua's
    fleet_counts), the rest left 0: enough to tell whether any work is left."""

    queued: int = 0
    delayed: int = 0
    inflight: int = 0
    seeds: int = 0
    starting: int = 0  # 1 while a node runs start()
    revisits: int = 0  # what the sweep queued, +1 when due ones are left (StepBatch.sweep)


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
    #: (kind, site, session id, proxy, data): what downloads told of the fleet's sessions
    #: and proxies (project/blocking/pool.py, lua/step/sessions.lua)
    sessions: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    #: The sessions' limits and the sites this node asks the sessions of, with the version
    #: of them it knows (-1: none); None: no sessions
    session_options: dict[str, Any] | None = None
    #: (pattern, outcome, data): what this node's fetches taught about which pages need a
    #: browser (project/rendering/plan.py, lua/step/render.lua)
    render: list[tuple[str, str, str]] = field(default_factory=list)
    #: The version of the patterns this node knows, and their limits; None: adaptive
    #: rendering is off
    render_options: dict[str, Any] | None = None
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
    #: Return the counts without maintenance (an idle node looking for the end), up to the
    #: first above zero (:class:`Counts`).
    count: bool = False
    #: START_EXTEND: extend this node's claim on start(); START_END: end it (lua/step/start.lua)
    start: str | None = None
    #: Ask where the duplicates are in ``enqueue`` (to log them).
    list_dupes: bool = False
    #: With maintenance, hand out up to this many due revisits (FRONTIER_KEEP_ALIVE).
    revisit_due: int = 0
    #: With a count that finds the fleet with nothing left, queue up to this many due
    #: revisits of URLs the crawl run has not seen (FRONTIER_REVISIT_SWEEP: a page no longer
    #: linked is fetched once more).
    sweep: int = 0
    #: This node's whole table of permits (site, n), after ``give_back``: Redis corrects
    #: its counts to it (``permit_check``: the table is sent, even empty). Each heartbeat.
    permit_table: list[tuple[str, int]] = field(default_factory=list)
    permit_check: bool = False
    #: The node's number for this step (0: none); a batch sent again after an error keeps
    #: it, so a step that ran already, its reply lost, does not run twice.
    seq: int = 0
    #: Take seeds only once this node is in the crawl run (the run's seeds count as its own).
    join_first: bool = False
    #: (records in all, of one site, runs and ms a record may go unrediscovered): the caps
    #: and the forgetting of revisit records, sent with revisits or a sweep
    revisit_limits: tuple[int, int, int, int] | None = None
    #: The node closes (``releasing``): after the settlements, every permit it holds goes
    #: back to the fleet and these unstarted leases (members) to the queue (step/release.lua)
    releasing: bool = False
    release: list[bytes] = field(default_factory=list)


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
    counts: Counts | None  # with maintenance or a count
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
    #: SEEDS_LIST: the seeds came from a list, SEEDS_SET: from a set (their in-flight members).
    seeds_kind: str = SEEDS_LIST
    #: Download permits granted with the leases: (site, n).
    permits: list[tuple[str, int]] = field(default_factory=list)
    #: This node's share of the cap of each site it named in ``ahead`` (0: no cap).
    shares: dict[str, int] = field(default_factory=dict)
    #: Spare permits of the sites named in ``ahead`` that went back: (site, n).
    spare_back: list[tuple[str, int]] = field(default_factory=list)
    #: Seen URLs queued again because their revisit was due, when rediscovered.
    rediscovered: int = 0
    #: Due revisits maintenance queued (FRONTIER_KEEP_ALIVE), or the sweep.
    handed_out: int = 0
    #: New revisit records the caps left out (FRONTIER_REVISIT_MAX_URLS, ..._MAX_SITE_URLS).
    revisits_capped: int = 0
    #: Revisit records the sweep forgot (FRONTIER_REVISIT_FORGET_RUNS, ..._FORGET_AFTER).
    revisits_forgotten: int = 0
    #: With a permit table: permits Redis counted for this node beyond it, given back.
    permits_fixed: int = 0
    #: With a permit table: (site, permits Redis counts) where this node counts more.
    permits_held: list[tuple[str, int]] = field(default_factory=list)
    #: Records of URLs rediscovered before their revisit is due: their items are still there.
    still_linked: list[bytes] = field(default_factory=list)
    #: This node was no permit holder when the step began (its first step, or it stalled
    #: past its deadline and maintenance gave every permit it held back to the fleet).
    rejoined: bool = False
    #: URLs a Bloom seen-set holds, with the counts (None otherwise).
    seen_count: int | None = None
    #: Redis' time of the step, ms (project/frontier/clock.py).
    now_ms: int | None = None
    #: A step of this batch's seq ran already: this one did nothing.
    replayed: bool = False
    #: (site, version, sessions JSON, pairs JSON) of the sites asked for whose sessions
    #: changed (lua/step/sessions.lua)
    sessions: list[tuple[str, int, bytes, bytes]] = field(default_factory=list)
    #: Sessions this step retired.
    retired: int = 0
    #: (site, proxy) pairs on probation this node may try (lua/step/sessions.lua).
    probes: list[tuple[str, str]] = field(default_factory=list)
    #: Sites whose sessions and pairs this step's maintenance forgot (idle long).
    sites_forgotten: int = 0
    #: (version, changes JSON or b"", full) of the render patterns (lua/step/render.lua);
    #: None without adaptive rendering.
    render: tuple[int, bytes, bool] | None = None
    #: Render patterns this step's maintenance forgot.
    patterns_forgotten: int = 0
    #: With ``releasing``: the unstarted leases that went back to the queue.
    released: int = 0


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
            "sections": [
                [name, len(getattr(batch, attr)), fields] for name, attr, fields in SECTIONS
            ],
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
        if batch.sweep:
            options["sweep"] = batch.sweep
        if batch.permit_check:
            options["permit_table"] = True
        if batch.join_first and batch.seed_want:
            options["join_first"] = True
        if batch.seq:
            options["seq"] = str(batch.seq)  # text: a Lua number loses digits past 14
        if batch.session_options is not None:
            options["sessions"] = batch.session_options
        if batch.render_options is not None:
            options["render"] = batch.render_options
        if batch.releasing:
            options["release"] = True
        if batch.revisit_limits and (batch.sweep or batch.revisits):
            options["revisit_limits"] = list(batch.revisit_limits)
        return json.dumps(options, separators=(",", ":")).encode()

    async def step(self, batch: StepBatch) -> StepResult:
        """Run one atomic frontier step (lua/step.lua): enqueue, settle, heartbeat, lease."""
        argv: list[Any] = [self._options(batch)]
        for _, attr, fields in SECTIONS:
            entries = getattr(batch, attr)
            if len(fields) == 1:
                argv += entries
            else:
                for entry in entries:
                    argv += entry
        keys = self._scripts["step"].keys_from(self.keys)
        return _decode_reply(await self._step(keys=keys, args=argv))

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
        site_bytes = site.encode("utf-8", "surrogateescape")
        return self.member_prefix + _MEMBER_REQUEST + site_bytes + b"\n" + payload

    def seed_member(self, raw: bytes, kind: str = SEEDS_LIST) -> bytes:
        """The in-flight member under which this node holds the raw seed *raw* (*kind*:
        SEEDS_LIST for a seed of the list, SEEDS_SET of the set, as the step took it)."""
        return self.member_prefix + kind.encode() + raw

    def __len__(self) -> int:
        raise TypeError("LeasedQueue has no cheap length: see project.monitoring.status")

    def push(self, request: Request) -> None:
        raise TypeError("LeasedQueue batches pushes: use FleetScheduler.enqueue_request()")

    def pop(self, timeout: int = 0) -> None:
        raise TypeError("LeasedQueue leases instead of popping: use FleetScheduler")


def _text(value: bytes) -> str:
    # A site is what the node enqueued; bytes that are not UTF-8 survive as written.
    return value.decode("utf-8", "surrogateescape")


def _decode_reply(raw: list[Any]) -> StepResult:
    """lua/step.lua's reply, name/value pairs, by name."""
    reply = {_text(raw[j]): raw[j + 1] for j in range(0, len(raw), 2)}
    leased, permits, shares = reply["leased"], reply["permits"], reply["shares"]
    held = reply["permits_held"]
    views = reply["sessions"]
    counts = reply["counts"]
    render = reply["render"]
    named = {_text(counts[j]): int(counts[j + 1]) for j in range(0, len(counts), 2)}
    wait = reply["wait_ms"]
    return StepResult(
        added=int(reply["added"]),
        duplicates=int(reply["duplicates"]),
        leased=[
            Leased(_text(leased[j]), leased[j + 1], float(leased[j + 2]))
            for j in range(0, len(leased), _LEASED_WIDTH)
        ],
        seeds=list(reply["seeds"]),
        reaped=int(reply["reaped"]),
        promoted=int(reply["promoted"]),
        counts=Counts(**{name: n for name, n in named.items() if name != "seen"})
        if counts
        else None,
        seen_count=named.get("seen"),
        next_wake_ms=None if wait is None else int(wait),
        poisoned=list(reply["poisoned"]),
        stale=int(reply["stale"]),
        offsite=int(reply["offsite"]),
        start_held=bool(reply["start_held"]),
        duplicate_at=[int(i) for i in reply["duplicate_at"]],
        seeds_kind=_text(reply["seeds_kind"]),
        permits=[
            (_text(permits[j]), int(permits[j + 1])) for j in range(0, len(permits), _PERMITS_WIDTH)
        ],
        shares={_text(shares[j]): int(shares[j + 1]) for j in range(0, len(shares), _SHARES_WIDTH)},
        spare_back=[
            (_text(shares[j]), int(shares[j + 2]))
            for j in range(0, len(shares), _SHARES_WIDTH)
            if int(shares[j + 2])
        ],
        rediscovered=int(reply["rediscovered"]),
        handed_out=int(reply["handed_out"]),
        revisits_capped=int(reply["revisits_capped"]),
        revisits_forgotten=int(reply["revisits_forgotten"]),
        permits_fixed=int(reply["permits_fixed"]),
        permits_held=[
            (_text(held[j]), int(held[j + 1])) for j in range(0, len(held), _PERMITS_WIDTH)
        ],
        still_linked=list(reply["still_linked"]),
        rejoined=bool(reply["rejoined"]),
        now_ms=int(reply["now"]),
        replayed=bool(reply["replayed"]),
        sessions=[
            (_text(views[j]), int(views[j + 1]), views[j + 2], views[j + 3])
            for j in range(0, len(views), 4)
        ],
        retired=int(reply["retired"]),
        probes=[
            (site, proxy) for site, _, proxy in (_text(p).partition("\n") for p in reply["probes"])
        ],
        sites_forgotten=int(reply["sites_forgotten"]),
        released=int(reply["released"]),
        render=(int(render[0]), render[1], bool(render[2])) if render else None,
        patterns_forgotten=int(reply["patterns_forgotten"]),
    )
