"""FLEET_AUTOTUNE: a node finds how many downloads to run at once from what it measures.

Every window (``FLEET_AUTOTUNE_WINDOW`` seconds with downloads) the tuner looks at the
downloads that ended: their mean latency against the lowest mean of recent windows (the
latency the sites give when nothing queues), and at the node itself: its CPU and how late
its event loop runs. Throughput by Little's law is concurrency over latency: while latency
stays at its floor, more concurrency is more pages, so the limit grows (by one, or a tenth,
each window it was used); once latency grows, the sites queue the extra downloads, so the
limit shrinks by the latency's ratio (a gradient, as in Netflix's concurrency-limits), and a
node whose CPU or event loop is saturated backs off too. The limit moves between
``FLEET_AUTOTUNE_MIN`` and ``CONCURRENT_REQUESTS``; the fleet-wide site caps bound what it can
use as before (the permits of the frontier). Stats: ``autotune/limit``, ``autotune/latency``,
``autotune/floor``; one INFO line each time the limit moves by a quarter.
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

__all__ = ["Autotune", "AutotuneConfig"]

logger = logging.getLogger(__name__)

#: Latency this much above its floor still counts as the floor: noise, and a little queueing
#: at the sites, which keeps them busy while the node turns one download into the next
#: (measured: a limit at the knee itself gives 0.91 of the best fixed setting's pages/s).
_TOLERANCE = 1.1
#: The most a window takes off the limit (one slow window is not the sites' new pace).
_MOST_CUT = 0.75
#: Windows whose mean latency the floor is the lowest of: two probes' worth.
_FLOOR_WINDOWS = 60
#: Every this many windows the limit drops by a quarter for one window (a probe, as BBR's
#: PROBE_RTT): below the knee again, the sites answer at their floor, and the floor stays
#: theirs. Without it a node held past the knee takes its own queueing for the floor, and
#: creeps up (a model of a knee at 16 was at 30 after 900 windows).
_PROBE_EVERY = 30
#: CPU share of one core (user and system) past which the node is overloaded.
_CPU_BUSY = 0.9
#: Seconds the event loop may run late before the node counts as overloaded.
_LAG_BUSY = 0.2
#: Downloads a window needs before its latency says anything.
_MIN_SAMPLES = 8


@dataclass(frozen=True)
class AutotuneConfig:
    """``FLEET_AUTOTUNE*``; the upper bound is Scrapy's ``CONCURRENT_REQUESTS``."""

    enabled: bool = setting("FLEET_AUTOTUNE", False)
    least: int = setting("FLEET_AUTOTUNE_MIN", 2)
    start: int = setting("FLEET_AUTOTUNE_START", 8)
    window: float = setting("FLEET_AUTOTUNE_WINDOW", 2.0)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        config = cls(**read_settings(cls, settings))
        if config.least < 1 or config.start < 1 or config.window <= 0:
            raise NotConfigured(
                "FLEET_AUTOTUNE_MIN and FLEET_AUTOTUNE_START must be at least 1,"
                " FLEET_AUTOTUNE_WINDOW above 0"
            )
        return config


class Autotune:
    """The limit of one node's downloads at once, moved by what its downloads measured."""

    def __init__(self, config: AutotuneConfig, most: int, stats: StatsCollector) -> None:
        self.config = config
        self.most = max(most, 1)
        self.least = min(config.least, self.most)
        self.limit = min(max(config.start, self.least), self.most)
        self.stats = stats
        self._latencies: list[float] = []
        self._busy_sum = 0.0  # downloads in flight, summed over the window's samples
        self._busy_n = 0
        self._floors: deque[float] = deque(maxlen=_FLOOR_WINDOWS)
        self._window_at = time.monotonic()
        self._cpu_at = self._cpu()
        #: how late the event loop woke, every tenth of a second of this window
        self._lags: list[float] = []
        self._windows = 0
        self._logged = self.limit
        self._lag_task: asyncio.Task[None] | None = None
        stats.set_value("autotune/limit", self.limit)

    def start(self) -> None:
        """Watch the event loop's lag (a task on the running loop)."""
        self._lag_task = asyncio.get_running_loop().create_task(self._watch_lag())

    def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()

    async def _watch_lag(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(0.1)
            self._lags.append(time.monotonic() - asked - 0.1)

    @staticmethod
    def _cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def download_ended(self, latency: float) -> None:
        """A download took *latency* seconds."""
        if math.isfinite(latency) and latency >= 0:
            self._latencies.append(latency)

    def in_flight(self, busy: int) -> None:
        """The node has *busy* downloads running now (sampled each round trip)."""
        self._busy_sum += busy
        self._busy_n += 1

    def tick(self, now: float) -> int:
        """The limit for now: moved when a window with enough downloads is over."""
        elapsed = now - self._window_at
        if elapsed < self.config.window or len(self._latencies) < _MIN_SAMPLES:
            return self.limit
        latency = sum(self._latencies) / len(self._latencies)
        used = self._busy_sum / self._busy_n if self._busy_n else 0.0
        cpu_now = self._cpu()
        cpu = (cpu_now - self._cpu_at) / elapsed
        # the loop's lag nine times in ten: one long callback is not an overloaded node
        lag = _quantile(self._lags, 0.9)
        self._latencies.clear()
        self._lags.clear()
        self._busy_sum, self._busy_n = 0.0, 0
        self._window_at, self._cpu_at = now, cpu_now
        self._floors.append(latency)
        floor = min(self._floors)
        self._windows += 1
        gradient = min(1.0, _TOLERANCE * floor / latency) if latency > 0 else 1.0
        overloaded = cpu >= _CPU_BUSY or lag >= _LAG_BUSY
        if overloaded:
            gradient = min(gradient, 0.9)
            self.stats.inc_value("autotune/overloaded")
        if gradient < 1.0:
            limit = math.floor(self.limit * max(gradient, _MOST_CUT))
        elif used >= 0.8 * self.limit:
            limit = self.limit + max(1, self.limit // 10)  # used, at the latency's floor
        else:
            limit = self.limit  # the sites, not the limit, bound the node now
        if self._windows % _PROBE_EVERY == 0:
            limit = math.floor(min(limit, self.limit) * _MOST_CUT)
            self.stats.inc_value("autotune/probes")
        self.limit = min(max(limit, self.least), self.most)
        self.stats.set_value("autotune/limit", self.limit)
        self.stats.set_value("autotune/latency", round(latency, 4))
        self.stats.set_value("autotune/floor", round(floor, 4))
        if abs(self.limit - self._logged) >= max(1, self._logged // 4):
            logger.info(
                "Autotune: %d downloads at once (latency %.3fs, floor %.3fs, CPU %.0f%%,"
                " loop lag %.3fs)",
                self.limit,
                latency,
                floor,
                cpu * 100,
                lag,
            )
            self._logged = self.limit
        return self.limit


def _quantile(values: list[float], share: float) -> float:
    """The value *share* of the way up *values* sorted (0 when there are none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
