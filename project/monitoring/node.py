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
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.frontier import lua
from project.frontier.config import DEFAULT_REDIS_URL, FrontierConfig
from project.frontier.keys import FrontierKeys
from project.frontier.stopping import download_errors
from project.storage.config import MongoConfig, StorageConfigError
from project.storage.journal import journal_backlog
from project.utils import child_processes

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Self

    import redis.asyncio
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "MonitorConfig",
    "NodeMonitor",
    "process_memory",
    "windowed_rate",
]

logger = logging.getLogger(__name__)

_HEARTBEAT = lua.load("heartbeat", __package__ or "project.monitoring")

#: Recount the journal's lines at most this often (it reads every segment).
_JOURNAL_EVERY = 10.0


@dataclass(frozen=True)
class MonitorConfig:
    """``MONITOR_*`` settings."""

    enabled: bool = setting("MONITOR_ENABLED", True)
    interval: float = setting("MONITOR_INTERVAL", 2.0)
    node_timeout: float = setting("MONITOR_NODE_TIMEOUT", 10.0)
    history_seconds: float = setting("MONITOR_HISTORY_SECONDS", 3600.0)
    rate_window: float = setting("MONITOR_RATE_WINDOW", 30.0)
    redis_url: str = DEFAULT_REDIS_URL
    #: Where the fleet's Redis is, for log lines (a cluster, Sentinel: not only REDIS_URL).
    redis_name: str = DEFAULT_REDIS_URL

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        frontier = FrontierConfig.from_settings(settings)
        config = cls(
            **read_settings(
                cls,
                settings,
                redis_url=frontier.redis_url,
                redis_name=frontier.redis_name,
            )
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


def process_memory() -> tuple[int, int]:
    """Resident memory of this process and of all its descendants (browsers), in bytes."""
    try:
        own = _rss("self")
    except OSError:
        return 0, 0
    total, todo, done = 0, child_processes(str(os.getpid())), set()
    while todo:
        pid = todo.pop()
        if pid in done:
            continue
        done.add(pid)
        with contextlib.suppress(OSError, ValueError):
            total += _rss(pid)
        todo += child_processes(pid)
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
        # The scheduler's keys know the spider's own redis_key.
        keys = getattr(scheduler, "keys", None)
        self.keys = (
            keys
            if isinstance(keys, FrontierKeys)
            else FrontierKeys.from_settings(self.crawler.settings, spider.name)
        )
        self._journal_dir = self._find_journal(spider.name)
        self._server = FrontierConfig.from_settings(self.crawler.settings).client(
            socket_timeout=10, socket_connect_timeout=5
        )
        self._script = self._server.register_script(_HEARTBEAT.source)
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
        except (NotConfigured, StorageConfigError):
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
                        self.config.redis_name,
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
        options = {
            "presence_ms": int(self.config.node_timeout * 1000),
            # the leader lock lapses just before the next interval's heartbeats
            "leader_ms": int(self.config.interval * 900),
            "history_ms": int(self.config.history_seconds * 1000),
            "finished": finished is not None,
        }
        sampled = await self._script(
            keys=_HEARTBEAT.keys_from(self.keys),
            args=[
                self.node_id,
                json.dumps(record, separators=(",", ":")),
                json.dumps(options),
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
        # Pages fetched from the sites: a robots.txt answered from the fleet's cache
        # is a response to Scrapy, not a page anyone downloaded.
        pages = int(stat("response_received_count", 0)) - int(stat("robotstxt/shared_hits", 0))
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
            "download_errors": download_errors(
                int(stat("downloader/exception_count", 0)), int(stat("frontier/sent_back", 0))
            ),
            "retries": int(stat("frontier/retry/count", 0)) + int(stat("retry/count", 0)),
            "dead_letters": int(stat("frontier/dead", 0)),
            "seeds_rejected": int(stat("frontier/seeds/rejected", 0)),
            "retry_reasons": {
                key.rsplit("/", 1)[1]: int(value)
                for key, value in stats.items()
                if key.startswith("frontier/retry/reason/")
            },
            # answers looked at and blocks of the sites blocking most (project/blocking)
            "blocks": _site_blocks(stats),
            "in_flight": int(getattr(self._scheduler, "held_leases", 0)),
            "rss_bytes": self._memory[0],
            "children_rss_bytes": self._memory[1],
            "journal_backlog": self._journal,
            # permanent MongoDB faults and journal write failures (project/storage)
            "mongo_errors": int(stat("mongo/permanent_errors", 0)),
            "mongo_last_error": str(stat("mongo/last_error") or "")[:300] or None,
            "journal_errors": int(stat("mongo/journal_errors", 0)),
            # items waiting to be stored, and whether that many keep downloads from starting
            "store_waiting": int(stat("mongo/waiting", 0)),
            "store_behind": bool(stat("mongo/behind", 0)),
            # downloads it runs at once (FLEET_AUTOTUNE's limit, when on): what a node is
            # worth (project/monitoring/scale.py)
            "concurrency": self._concurrency(),
        }

    def _concurrency(self) -> int:
        loop = getattr(self._scheduler, "loop", None)
        ledger = getattr(loop, "ledger", None)
        if ledger is not None:
            return int(ledger.concurrency)
        return self.crawler.settings.getint("CONCURRENT_REQUESTS")

    def _read_files(self, count_journal: bool) -> tuple[tuple[int, int], int | None]:
        journal = self._journal
        if count_journal and self._journal_dir is not None:
            try:
                journal = journal_backlog(self._journal_dir)
            except OSError:
                journal = None
        return process_memory(), journal


#: Sites a heartbeat tells the blocks of, those blocking most.
_BLOCK_SITES = 20


def _site_blocks(stats: dict[str, Any]) -> dict[str, list[int]]:
    """site -> [answers looked at, blocks], from the block middleware's counters."""
    sites: dict[str, list[int]] = {}
    for key, value in stats.items():
        if key.startswith("block_checks/"):
            sites.setdefault(key.removeprefix("block_checks/"), [0, 0])[0] = int(value)
        elif (
            key.startswith("blocks/")
            and key.count("/") >= 2
            and not key.startswith("blocks/signal/")
        ):
            site = key.removeprefix("blocks/").rsplit("/", 1)[0]
            sites.setdefault(site, [0, 0])[1] += int(value)
    worst = sorted(sites, key=lambda site: -sites[site][1])[:_BLOCK_SITES]
    return {site: sites[site] for site in worst}
