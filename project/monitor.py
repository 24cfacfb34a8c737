"""Node heartbeats and an hour of fleet history in Redis, read by status, watch and the dashboard."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio
from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import NotConfigured

from project.journal import journal_backlog
from project.mongo import MongoConfig
from project.queue import FrontierKeys
from project.services import mask_url

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "HEARTBEAT",
    "MonitorConfig",
    "MonitorKeys",
    "NodeMonitor",
    "process_memory",
    "windowed_rate",
]

logger = logging.getLogger(__name__)

# One atomic round trip per interval and node. The node's record goes into
# the <spider>:nodes hash and its presence key <spider>:node:<id> (TTL = node
# timeout: a node is alive while the key exists, judged by Redis' clock, so
# clock skew between machines does not matter). The first node whose
# heartbeat finds the leader lock free (SET NX, TTL 0.9 x interval) writes
# the fleet sample, so the history gets about one sample per interval however
# many nodes run. The sample is computed here, from Redis itself, at one
# instant: queue sizes, seen-set, dead letters, and the sums of the node
# records. Records of nodes gone for longer than the history are dropped.
#
# KEYS: nodes, node presence, leader, history, queued counter, delayed, inflight,
#       seen, dead, seeds
# ARGV: node id, record, presence ttl ms, leader ttl ms, history ms,
#       presence key prefix, finished ("1": delete the presence key, no sample)
HEARTBEAT = r"""
local node, record = ARGV[1], ARGV[2]
redis.call('HSET', KEYS[1], node, record)
if ARGV[7] == '1' then
    redis.call('DEL', KEYS[2])
    return 0
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if not redis.call('SET', KEYS[3], node, 'NX', 'PX', ARGV[4]) then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local keep = tonumber(ARGV[5])
local s = {
    queued = tonumber(redis.call('GET', KEYS[5])) or 0, delayed = redis.call('ZCARD', KEYS[6]),
    in_flight = redis.call('ZCARD', KEYS[7]), seen = redis.call('SCARD', KEYS[8]),
    dead = redis.call('LLEN', KEYS[9]), seeds = redis.call('LLEN', KEYS[10]),
    pages = 0, items = 0, errors = 0, retries = 0,
    pages_per_s = 0, items_per_s = 0, alive = 0, nodes = {},
}
local fields = redis.call('HGETALL', KEYS[1])
local stale = {}
for i = 1, #fields, 2 do
    local id = fields[i]
    local ok, rec = pcall(cjson.decode, fields[i + 1])
    if ok and type(rec) == 'table' then
        s.pages = s.pages + (tonumber(rec.pages) or 0)
        s.items = s.items + (tonumber(rec.items) or 0)
        s.errors = s.errors + (tonumber(rec.errors) or 0)
        s.retries = s.retries + (tonumber(rec.retries) or 0)
        if rec.state == 'running' and redis.call('EXISTS', ARGV[6] .. id) == 1 then
            local pps = (tonumber(rec.pages_per_min) or 0) / 60
            s.nodes[id] = pps
            s.pages_per_s = s.pages_per_s + pps
            s.items_per_s = s.items_per_s + (tonumber(rec.items_per_min) or 0) / 60
            s.alive = s.alive + 1
        elseif (tonumber(rec.last_seen) or 0) * 1000 < now - keep then
            stale[#stale + 1] = id
        end
    else
        stale[#stale + 1] = id
    end
end
if #stale > 0 then redis.call('HDEL', KEYS[1], unpack(stale)) end
redis.call('XADD', KEYS[4], 'MINID', '~', now - keep, '*', 's', cjson.encode(s))
return 1
"""

#: Recount the journal's lines at most this often (it reads every segment).
_JOURNAL_EVERY = 10.0


@dataclass(frozen=True)
class MonitorKeys:
    """Redis keys of one spider's monitoring data."""

    nodes: str
    node_prefix: str
    history: str
    leader: str

    @classmethod
    def for_spider(cls, name: str) -> MonitorKeys:
        return cls(
            nodes=f"{name}:nodes",
            node_prefix=f"{name}:node:",
            history=f"{name}:history",
            leader=f"{name}:history:leader",
        )

    def node(self, node_id: str) -> str:
        """The presence key of *node_id* (exists while the node heartbeats)."""
        return self.node_prefix + node_id


@dataclass(frozen=True)
class MonitorConfig:
    """``MONITOR_*`` settings; the defaults here are the only ones."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    enabled: bool = True
    interval: float = 2.0
    node_timeout: float = 10.0
    history_seconds: float = 3600.0
    rate_window: float = 30.0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        config = cls(
            redis_url=settings.get("REDIS_URL") or cls.redis_url,
            enabled=settings.getbool("MONITOR_ENABLED", cls.enabled),
            interval=settings.getfloat("MONITOR_INTERVAL", cls.interval),
            node_timeout=settings.getfloat("MONITOR_NODE_TIMEOUT", cls.node_timeout),
            history_seconds=settings.getfloat("MONITOR_HISTORY_SECONDS", cls.history_seconds),
            rate_window=settings.getfloat("MONITOR_RATE_WINDOW", cls.rate_window),
        )
        if not config.interval >= 0.1:
            raise NotConfigured(f"MONITOR_INTERVAL must be at least 0.1 s, got {config.interval}")
        if not config.node_timeout > config.interval:
            raise NotConfigured(
                f"MONITOR_NODE_TIMEOUT ({config.node_timeout}) must be above MONITOR_INTERVAL"
                f" ({config.interval}), or live nodes show as dead between heartbeats"
            )
        if not config.history_seconds >= config.interval:
            raise NotConfigured("MONITOR_HISTORY_SECONDS must be at least MONITOR_INTERVAL")
        if not config.rate_window >= config.interval:
            raise NotConfigured("MONITOR_RATE_WINDOW must be at least MONITOR_INTERVAL")
        return config


def windowed_rate(points: Sequence[tuple[float, float]]) -> float:
    """Per-second rate between the first and the last ``(time, count)`` point."""
    if len(points) < 2:
        return 0.0
    (t0, v0), (t1, v1) = points[0], points[-1]
    return (v1 - v0) / (t1 - t0) if t1 > t0 else 0.0


def _rss(pid: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0  # a zombie has no VmRSS


def _children(pid: str) -> list[str]:
    found: list[str] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += (task / "children").read_text().split()
    return found


def process_memory() -> tuple[int, int]:
    """Resident memory of this process and of all its descendants (browsers), in bytes."""
    try:
        own = _rss("self")
    except OSError:
        return 0, 0
    total, todo, done = 0, _children(str(os.getpid())), set()
    while todo:
        pid = todo.pop()
        if pid in done:
            continue
        done.add(pid)
        with contextlib.suppress(OSError, ValueError):
            total += _rss(pid)
        todo += _children(pid)
    return own, total


class NodeMonitor:
    """Scrapy extension: publishes this node's heartbeat and the fleet's history to Redis.

    Every ``MONITOR_INTERVAL`` seconds one Lua call (a single round trip on the
    asyncio loop) writes the node's record and, on one node per interval, a
    fleet sample. Stats are read locally; nothing is sent per stats change.
    """

    def __init__(self, crawler: Crawler, config: MonitorConfig) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.node_id = f"{socket.gethostname()}:{os.getpid()}"
        self.started = time.time()
        self._points: deque[tuple[float, int, int]] = deque()
        self._memory = (0, 0)
        self._journal_dir: Path | None = None
        self._journal: int | None = None
        self._journal_at = -_JOURNAL_EVERY
        self._server: redis.asyncio.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._redis_down = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = MonitorConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("MONITOR_ENABLED is off")
        monitor = cls(crawler, config)
        crawler.signals.connect(monitor.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(monitor.spider_closed, signal=signals.spider_closed)
        return monitor

    def spider_opened(self, spider: Spider) -> None:
        self.spider = spider
        scheduler = self.crawler.engine.scheduler if self.crawler.engine else None
        self._scheduler = scheduler
        # FleetScheduler's id is the one its leases are held under.
        self.node_id = str(getattr(scheduler, "node_id", None) or self.node_id)
        self.keys = MonitorKeys.for_spider(spider.name)
        self.frontier = FrontierKeys.for_spider(
            spider.name,
            self.crawler.settings.get("SCHEDULER_QUEUE_KEY") or "%(spider)s:requests",
            self.crawler.settings.get("SCHEDULER_DUPEFILTER_KEY") or "%(spider)s:dupefilter",
            self.crawler.settings.get("REDIS_START_URLS_KEY") or "%(name)s:start_urls",
        )
        self._journal_dir = self._find_journal(spider.name)
        self._server = redis.asyncio.from_url(
            self.config.redis_url, socket_timeout=10, socket_connect_timeout=5
        )
        self._script = self._server.register_script(HEARTBEAT)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._server is None:
            return
        with contextlib.suppress(RedisError):
            await self._publish(finished=reason)
        await self._server.aclose()

    def _find_journal(self, spider_name: str) -> Path | None:
        try:
            return MongoConfig.from_settings(
                self.crawler.settings, spider_name=spider_name
            ).journal_dir
        except NotConfigured:
            return None

    async def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._publish()
            except RedisError as exc:
                self.stats.inc_value("monitor/redis_errors")
                if not self._redis_down:
                    logger.warning(
                        "Cannot publish node status to %s: %s",
                        mask_url(self.config.redis_url),
                        exc,
                        extra={"spider": self.spider},
                    )
                self._redis_down = True
            else:
                self._redis_down = False
            wait = max(0.0, self.config.interval - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)

    async def _publish(self, finished: str | None = None) -> None:
        record = await self._record(finished)
        assert self._server is not None
        k, f = self.keys, self.frontier
        sampled = await self._script(
            keys=[
                k.nodes,
                k.node(self.node_id),
                k.leader,
                k.history,
                f.queued,
                f.delayed,
                f.inflight,
                f.dupefilter,
                f.dead,
                f.start_urls,
            ],
            args=[
                self.node_id,
                json.dumps(record, separators=(",", ":")),
                int(self.config.node_timeout * 1000),
                int(self.config.interval * 900),
                int(self.config.history_seconds * 1000),
                k.node_prefix,
                "1" if finished else "0",
            ],
        )
        self.stats.inc_value("monitor/heartbeats")
        if sampled:
            self.stats.inc_value("monitor/samples")

    async def _record(self, finished: str | None) -> dict[str, Any]:
        now = time.monotonic()
        count_journal = now - self._journal_at >= _JOURNAL_EVERY or finished is not None
        # /proc and the journal are files: read them off the event loop.
        self._memory, journal = await asyncio.to_thread(self._read_files, count_journal)
        if count_journal:
            self._journal, self._journal_at = journal, now
        stat = self.stats.get_value
        pages = int(stat("response_received_count", 0))
        items = int(stat("item_scraped_count", 0))
        self._points.append((now, pages, items))
        while len(self._points) > 2 and self._points[1][0] <= now - self.config.rate_window:
            self._points.popleft()
        stats = self.stats.get_stats()
        return {
            "id": self.node_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": self.started,
            "last_seen": time.time(),
            "state": "finished" if finished else "running",
            "finish_reason": finished,
            "interval": self.config.interval,
            "pages": pages,
            "items": items,
            "pages_per_min": 60 * windowed_rate([(t, p) for t, p, _ in self._points]),
            "items_per_min": 60 * windowed_rate([(t, i) for t, _, i in self._points]),
            "errors": int(stat("log_count/ERROR", 0)),
            "download_errors": int(stat("downloader/exception_count", 0)),
            "retries": int(stat("frontier/retry/count", 0)) + int(stat("retry/count", 0)),
            "dead_letters": int(stat("frontier/dead", 0)),
            "seeds_rejected": int(stat("frontier/seeds/rejected", 0)),
            "retry_reasons": {
                key.rsplit("/", 1)[1]: int(value)
                for key, value in stats.items()
                if key.startswith("frontier/retry/reason/")
            },
            "in_flight": int(getattr(self._scheduler, "held_leases", 0)),
            "rss_bytes": self._memory[0],
            "children_rss_bytes": self._memory[1],
            "journal_backlog": self._journal,
        }

    def _read_files(self, count_journal: bool) -> tuple[tuple[int, int], int | None]:
        journal = self._journal
        if count_journal and self._journal_dir is not None:
            try:
                journal = journal_backlog(self._journal_dir)
            except OSError:
                journal = None
        return process_memory(), journal
