"""The fleet's crawl run, node side: join it, stamp items with its id, leave with the counters.

A run is one crawl of the fleet: it begins when the first node joins after the last run
ended and ends when its last node leaves with the work done (lua/run_join.lua,
lua/run_leave.lua). Its id (``<spider>-<UTC start>``) is every stored item's ``crawl_id``
unless ``RUNS_CRAWL_ID`` is set. The node that ends it writes the report (project/runs/report.py).
With ``FRONTIER_KEEP_ALIVE`` a run ends each time the fleet runs out of work, and the next
one begins with the next work (a seed, or revisits falling due).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from redis.exceptions import ClusterDownError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy import signals
from scrapy.exceptions import NotConfigured

from project.frontier import lua
from project.frontier.config import FrontierConfig
from project.frontier.signals import frontier_started
from project.runs.report import RunsConfig, finish_run
from project.storage.outbox import Outbox
from project.storage.store import MongoStore

if TYPE_CHECKING:
    from typing import Self

    import redis.asyncio
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from project.frontier.keys import FrontierKeys
    from project.frontier.loop import FrontierLoop

__all__ = ["RunTracker", "counters"]

logger = logging.getLogger(__name__)

_JOIN, _LEAVE = lua.load("run_join"), lua.load("run_leave")
#: Attempts more to leave a run after a connection error: the last node out writes the report.
_LEAVE_RETRIES = 3
#: How often a keep-alive node looks whether the fleet ran out of work, or found some.
_CHECK_SECONDS = 1.0


def counters(stats: dict[str, Any], since: dict[str, Any] | None = None) -> dict[str, float]:
    """The numeric stats, less what they were at *since* (a keep-alive node's earlier runs)."""
    base = since or {}
    out: dict[str, float] = {}
    for key, value in stats.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            delta = value - base.get(key, 0)
            if delta:
                out[key] = delta
    return out


class RunTracker:
    """Extension: this node's part in the fleet's crawl runs."""

    def __init__(self, crawler: Crawler, config: RunsConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.run_id: str | None = None
        self.started_ms = 0
        self._since: dict[str, Any] = {}
        self._server: redis.asyncio.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        # set when the spider closes: the task ends between two Redis calls, never inside one
        self._stop = asyncio.Event()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = RunsConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("RUNS_ENABLED is off")
        tracker = cls(crawler, config)
        crawler.signals.connect(tracker.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(tracker.frontier_started, signal=frontier_started)
        crawler.signals.connect(tracker.spider_closed, signal=signals.spider_closed)
        return tracker

    def _scheduler(self) -> Any:
        from project.frontier.scheduler import FleetScheduler

        return FleetScheduler.of(self.crawler)

    def spider_opened(self, spider: Spider) -> None:
        self.spider = spider
        scheduler = self._scheduler()
        if scheduler is None:
            return  # not a fleet node (another scheduler): no fleet run to join
        # before the frontier's first step: its seeds are queued once per run from the start
        scheduler.queue.runs = True

    def frontier_started(self, loop: FrontierLoop, keys: FrontierKeys) -> None:
        """The frontier reached Redis: join the run; a node that is not kept alive joins
        before its first round trip, which may then take seeds (it takes them only in a run)."""
        scheduler = self._scheduler()
        if scheduler is None or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run())
        if not scheduler.config.keep_alive:
            loop.before_first_step(self._task)

    async def _pause(self, seconds: float) -> bool:
        """Sleep; False once the spider closes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return not self._stop.is_set()

    async def _run(self) -> None:
        scheduler = self._scheduler()
        self.keys: FrontierKeys = scheduler.keys
        self._server = FrontierConfig.from_settings(self.crawler.settings).client(
            socket_timeout=10, socket_connect_timeout=5
        )
        if not scheduler.config.keep_alive:
            await self._join()
            return
        leased = 0.0
        while await self._pause(_CHECK_SECONDS):  # a keep-alive node: a run per stretch of work
            loop, stats = scheduler.loop, self.crawler.stats
            assert stats is not None
            now = stats.get_value("frontier/leased", 0)
            worked, leased = now > leased, now
            if self.run_id is None and (worked or (loop is not None and loop.held)):
                await self._join()
            elif self.run_id is not None and not worked and loop is not None and loop.fleet_idle:
                await self._leave()

    async def _join(self) -> None:
        assert self._server is not None
        candidate = f"{self.spider.name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{os.urandom(2).hex()}"
        try:
            run_id, started = await self._server.eval(
                _JOIN.source,
                len(_JOIN.keys),
                *_JOIN.keys_from(self.keys),
                self._node(),
                candidate,
                "1" if self._scheduler().config.keep_alive else "0",
            )
        except RedisError as exc:
            logger.warning(
                "could not join the fleet's crawl run (%s): items keep this node's crawl_id", exc
            )
            return
        self.run_id, self.started_ms = run_id.decode(), int(started)
        assert self.crawler.stats is not None
        # what this node did since it left its last run (or started) is this run's: the seed
        # that made it join was taken before
        self.crawler.stats.set_value("run/id", self.run_id)
        store = MongoStore.existing(self.crawler)
        if store is not None:
            store.use_crawl_id(self.run_id)
        logger.info("Crawl run %s", self.run_id, extra={"spider": self.spider})

    def _node(self) -> str:
        return str(self._scheduler().node_id)

    def _node_timeout(self) -> float:
        from project.monitoring.node import MonitorConfig

        config = MonitorConfig.from_settings(self.crawler.settings)
        return config.node_timeout if config.enabled else 0.0

    async def _leave(self, *, closing: bool = False) -> None:
        """Leave the run with this node's counters; the last node out writes the report."""
        if self.run_id is None or self._server is None:
            return
        assert self.crawler.stats is not None
        mine = counters(self.crawler.stats.get_stats(), self._since)
        run_id, self.run_id = self.run_id, None
        self._since = dict(self.crawler.stats.get_stats())
        # The work is done but another node is still in the run: it ends it when it leaves,
        # unless it was killed; its presence expires within MONITOR_NODE_TIMEOUT, so ask again.
        deadline = time.monotonic() + (self._node_timeout() + 2 if closing else 0)
        retries = _LEAVE_RETRIES
        while True:
            try:
                reply = await self._server.eval(
                    _LEAVE.source, len(_LEAVE.keys), *_LEAVE.keys_from(self.keys),
                    self._node(), run_id, json.dumps(mine),
                )  # fmt: skip
            except (
                RedisConnectionError,
                RedisTimeoutError,
                ClusterDownError,
                TryAgainError,
            ) as exc:
                # a pooled connection a long partition killed (TCP keepalive) fails once;
                # leaving again is harmless (lua/run_leave.lua)
                if retries > 0:
                    retries -= 1
                    await asyncio.sleep(1.0)
                    continue
                logger.warning("could not leave the crawl run %s (%s): no report", run_id, exc)
                return
            except RedisError as exc:
                logger.warning("could not leave the crawl run %s (%s): no report", run_id, exc)
                return
            if reply[0] != b"left" or int(reply[2]) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        if reply[0] != b"final":
            return
        if MongoStore.existing(self.crawler) is None:
            logger.info(
                "Crawl run %s ended; this node stores no items, so it writes no report", run_id
            )
            return
        started, ended = int(reply[1]), int(reply[2])  # reply[3]: the seen-set was fresh
        nodes = {}
        for j in range(4, len(reply), 2):
            try:
                nodes[reply[j].decode()] = json.loads(reply[j + 1])
            except ValueError:
                continue
        store = MongoStore.existing(self.crawler)
        outbox = None
        if store is not None and store.outbox is not None:
            outbox = Outbox(self._server, store.outbox.key, max_bytes=store.outbox.max_bytes)
        await finish_run(
            self.crawler.settings, self.spider.name, run_id, started / 1000, ended / 1000, nodes,
            self.config, outbox=outbox,
        )  # fmt: skip

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._server is None:
            return
        # whatever this node's reason: a run ends when its work is done (run_leave.lua)
        try:
            await self._leave(closing=True)
        finally:
            await self._server.aclose()
