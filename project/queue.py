"""The leased request queue: scrapy-redis' queue keys, driven by Lua scripts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_redis.queue import Base

from project import lua
from project.wire import decode_request, encode_request

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from scrapy import Request, Spider

__all__ = ["FrontierKeys", "LeasedQueue", "SiteLimits", "StepBatch", "StepResult"]


@dataclass(frozen=True)
class FrontierKeys:
    """Redis keys of one spider's frontier (scrapy-redis names kept)."""

    queue: str
    dupefilter: str
    start_urls: str
    inflight: str
    delayed: str
    dead: str
    seq: str
    throttled: str
    limits: str
    rates: str
    buckets: str
    active: str
    leases: str
    lat_sum: str
    lat_n: str
    queued: str

    @classmethod
    def for_spider(
        cls,
        name: str,
        queue_template: str = "%(spider)s:requests",
        dupefilter_template: str = "%(spider)s:dupefilter",
        start_urls_template: str = "%(name)s:start_urls",
    ) -> FrontierKeys:
        scrapy_redis_keys = {"queue", "dupefilter", "start_urls"}
        own = {k: f"{name}:{k}" for k in lua.WIDE_KEYS if k not in scrapy_redis_keys}
        return cls(
            queue=queue_template % {"spider": name},
            dupefilter=dupefilter_template % {"spider": name},
            start_urls=start_urls_template % {"name": name},
            **own,
        )

    def site_queue(self, site: str) -> str:
        """The sorted set holding *site*'s queued requests."""
        return f"{self.queue}:{site}"

    def wide(self) -> list[str]:
        """Every key the Lua scripts take, in their order."""
        return [getattr(self, k) for k in lua.WIDE_KEYS]


@dataclass(frozen=True)
class SiteLimits:
    """Fleet-wide politeness defaults; per-site caps live in Redis."""

    rate: float = 0.0  # requests/s per site, 0 = unlimited
    concurrency: int = 0  # requests in flight per site, 0 = unlimited
    burst_seconds: float = 0.1
    adaptive: bool = False
    target_concurrency: float = 4.0
    min_rate: float = 0.5
    start_rate: float = 2.0


@dataclass
class StepBatch:
    """Everything one round trip sends."""

    enqueue: list[tuple[bytes, str, int, bytes]] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)
    retries: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    dead: list[tuple[bytes, bytes]] = field(default_factory=list)
    heartbeat: list[bytes] = field(default_factory=list)
    pauses: list[tuple[str, int]] = field(default_factory=list)
    latency: list[tuple[str, float, int]] = field(default_factory=list)
    want: int = 0
    seed_want: int = 0
    maintain: bool = False


@dataclass
class StepResult:
    """What one round trip returned."""

    added: int
    duplicates: int
    leased: list[tuple[bytes, float]]
    seeds: list[bytes]
    reaped: int
    promoted: int
    counts: tuple[int, int, int, int] | None  # queued, delayed, inflight, seeds
    next_wake_ms: int | None


class LeasedQueue(Base):  # type: ignore[misc]
    """scrapy-redis queue whose pops are leases, with JSON on the wire.

    Requests live in the ``<spider>:requests`` sorted set as before, scored
    by priority and then arrival order. Taking one moves it to
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
        limits: SiteLimits | None = None,
    ) -> None:
        self.server = server
        self.lease_ms = lease_ms
        self.limits = limits or SiteLimits()
        self.spider = spider
        self.key = keys.queue
        self.keys = keys
        self.node_id = node_id
        self.member_prefix = node_id.encode() + b"\n"
        self._step = server.register_script(lua.STEP)
        self._release = server.register_script(lua.RELEASE)

    def _encode_request(self, request: Request, **extra: Any) -> bytes:
        return encode_request(request, self.spider, **extra)

    def _decode_request(self, encoded_request: bytes) -> Request:
        return decode_request(encoded_request, self.spider)[0]

    async def step(self, batch: StepBatch) -> StepResult:
        """Run one atomic frontier step: enqueue, settle, heartbeat, lease."""
        now_ms = int(time.time() * 1000)
        lim = self.limits
        argv: list[Any] = [
            self.node_id,
            now_ms,
            now_ms + self.lease_ms,
            batch.want,
            batch.seed_want,
            "1" if batch.maintain else "0",
            lim.rate,
            lim.concurrency,
            lim.burst_seconds,
            "1" if lim.adaptive else "0",
            lim.target_concurrency,
            lim.min_rate,
            lim.start_rate,
            len(batch.enqueue),
            len(batch.acks),
            len(batch.retries),
            len(batch.dead),
            len(batch.heartbeat),
            len(batch.pauses),
            len(batch.latency),
        ]
        for fp, site, priority, payload in batch.enqueue:
            argv += (fp, site, priority, payload)
        argv += batch.acks
        for member, not_before, payload in batch.retries:
            argv += (member, not_before, payload)
        for member, record in batch.dead:
            argv += (member, record)
        argv += batch.heartbeat
        for site, until_ms in batch.pauses:
            argv += (site, until_ms)
        for site, seconds, count in batch.latency:
            argv += (site, seconds, count)
        added, dupes, leased, seeds, reaped, promoted, counts, wake = await self._step(
            keys=self.keys.wide(), args=argv
        )
        return StepResult(
            added=int(added),
            duplicates=int(dupes),
            leased=[(leased[j], float(leased[j + 1])) for j in range(0, len(leased), 2)],
            seeds=list(seeds),
            reaped=int(reaped),
            promoted=int(promoted),
            counts=(int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]))
            if counts
            else None,
            next_wake_ms=int(float(wake)) if wake else None,
        )

    async def release(self, members: list[bytes]) -> int:
        """Give leases back to the queue at once (clean shutdown)."""
        if not members:
            return 0
        return int(await self._release(keys=self.keys.wide(), args=members))

    def request_member(self, payload: bytes) -> bytes:
        """The in-flight member under which this node holds *payload*."""
        return self.member_prefix + b"R" + payload

    def seed_member(self, raw: bytes) -> bytes:
        return self.member_prefix + b"S" + raw

    def __len__(self) -> int:
        raise TypeError("LeasedQueue has no cheap length: see project.status.frontier_snapshot()")

    def push(self, request: Request) -> None:
        raise TypeError("LeasedQueue batches pushes: use FleetScheduler.enqueue_request()")

    def pop(self, timeout: int = 0) -> None:
        raise TypeError("LeasedQueue leases instead of popping: use FleetScheduler")
