"""A node asked to stop, and the file that says how it is doing.

SIGTERM or SIGINT (Ctrl-C, scrapyd's cancel, Kubernetes deleting a pod): the node leases
nothing more from that moment, and the downloads it has started get ``FLEET_STOP_GRACE``
seconds to finish. Those still running then are cut (:class:`DownloadCut`): each goes back
to the fleet as a retry due at once, not counted as an attempt, and the node hands back the
rest (unstarted leases, its permits, its start claim) as it closes. So a node stops within
the grace plus its close, under the 30 s most platforms give, and nothing is lost: a page
whose download was cut is fetched again by another node.

``FLEET_HEALTH_FILE``: the node keeps a small JSON file there, for probes
(``fleetcrawl probe``) and ``fleetcrawl stop``: its pid, its state (``starting``,
``crawling``, ``stopping``) and the time of its last round trip to Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured

from project.config import read_settings, setting
from project.frontier.meta import LEASE_META_KEY, OUTCOME_META_KEY
from project.frontier.signals import frontier_started

if TYPE_CHECKING:
    from types import FrameType
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from project.frontier.loop import FrontierLoop

__all__ = [
    "DownloadCut",
    "NodeStop",
    "StopConfig",
    "downloads_cut",
]

logger = logging.getLogger(__name__)

#: Sent when the stop grace is over: download handlers cut what they still download.
downloads_cut = object()

#: Seconds between two writes of the health file.
_HEALTH_EVERY = 1.0


@dataclass(frozen=True)
class StopConfig:
    """``FLEET_STOP_GRACE`` and ``FLEET_HEALTH_FILE``."""

    #: Seconds the downloads in flight get to finish once the node is asked to stop.
    stop_grace: float = setting("FLEET_STOP_GRACE", 20.0)
    #: Where the node keeps its health (JSON), for probes; empty: nowhere.
    health_file: str = setting("FLEET_HEALTH_FILE", "")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        config = cls(**read_settings(cls, settings))
        if config.stop_grace < 0:
            raise NotConfigured("FLEET_STOP_GRACE must be 0 or more seconds")
        return config


class SentBack(IgnoreRequest):
    """A leased request this node gives back to the fleet unfetched: a retry due after a
    delay (its outcome says which), not counted as an attempt."""


class DownloadCut(SentBack):
    """A download still running when the stop grace ended: its lease goes back as a retry
    due at once (another node fetches the page), not counted as an attempt."""


def download_errors(exceptions: int, sent_back: int) -> int:
    """Scrapy's ``downloader/exception_count`` without the requests sent back unfetched
    (``frontier/sent_back``, a :class:`SentBack` each): those are no errors."""
    return max(0, exceptions - sent_back)


def send_back(request: Request, delay: float, error: str) -> None:
    """Mark leased *request* to go back to the fleet, due in *delay* seconds, unfetched and
    not counted as an attempt (raise a :class:`SentBack` then)."""
    if request.meta.get(LEASE_META_KEY):
        request.meta[OUTCOME_META_KEY] = {
            "action": "retry",
            "delay": delay,
            "error": error,
            "request": request,
        }


def cut(request: Request, grace: float) -> DownloadCut:
    """Mark *request*, whose download is cut, to go back to the fleet; the exception to raise."""
    error = f"DownloadCut: still downloading {grace:g} s after the node was asked to stop"
    send_back(request, 0.0, error)
    return DownloadCut(error)


class NodeStop:
    """Extension: the stop grace, and the health file."""

    def __init__(self, crawler: Crawler, config: StopConfig) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.loop: FrontierLoop | None = None
        self.state = "starting"
        self.asked_at: float | None = None
        self._started_at = time.time()
        self._writer: asyncio.Task[None] | None = None
        self._cut_timer: asyncio.TimerHandle | None = None
        self.closed = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        extension = cls(crawler, StopConfig.from_settings(crawler.settings))
        crawler.signals.connect(extension._engine_started, signal=signals.engine_started)
        crawler.signals.connect(extension._frontier_started, signal=frontier_started)
        crawler.signals.connect(extension._spider_closed, signal=signals.spider_closed)
        return extension

    # -- signals -------------------------------------------------------------------

    def _engine_started(self) -> None:
        # Scrapy's handlers are in place by now: ours run first, then theirs (the first
        # signal closes gracefully, a second forces).
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)
            if callable(previous):
                signal.signal(signum, self._chain(previous))
        if self.config.health_file:
            self._write_health()
            self._writer = asyncio.get_running_loop().create_task(self._keep_health())

    def _chain(self, previous: Any) -> Any:
        loop = asyncio.get_running_loop()

        def handler(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(self.stop, signal.Signals(signum).name)
            previous(signum, frame)
            # Scrapy's first handler put its force-quit in place for both signals: a second
            # SIGTERM (a platform's own after a preStop hook, a scaler's) would drop the
            # settlements of the close. Ctrl-C twice still forces.
            signal.signal(signal.SIGTERM, self._again)

        return handler

    def _again(self, signum: int, frame: FrameType | None) -> None:
        del frame
        logger.warning(
            "%s again: already stopping (within FLEET_STOP_GRACE=%g s and the close);"
            " SIGINT twice or SIGKILL forces",
            signal.Signals(signum).name,
            self.config.stop_grace,
        )

    def _frontier_started(self, loop: FrontierLoop, **_: Any) -> None:
        self.loop = loop
        if self.state == "starting":
            self.state = "crawling"

    def _spider_closed(self) -> None:
        self.closed = True
        if self._cut_timer is not None:
            self._cut_timer.cancel()
        if self._writer is not None:
            self._writer.cancel()
        if self.asked_at is not None:
            self.stats.set_value("fleet/stop/seconds", round(time.monotonic() - self.asked_at, 3))
        if self.config.health_file:
            with contextlib.suppress(OSError):
                Path(self.config.health_file).unlink()

    # -- stopping ------------------------------------------------------------------

    def stop(self, why: str) -> None:
        """Lease nothing more; cut the downloads still running after the grace."""
        if self.asked_at is not None or self.closed:
            return  # once is enough; closed, there is nothing left to stop (or to write)
        self.asked_at = time.monotonic()
        self.state = "stopping"
        self.stats.set_value("fleet/stop/signal", why)
        logger.info(
            "%s: stopping; nothing more is leased, the downloads in flight have"
            " FLEET_STOP_GRACE=%g s to finish, then go back to the fleet",
            why,
            self.config.stop_grace,
        )
        if self.loop is not None:
            self.loop.begin_stop()
        self._cut_timer = asyncio.get_running_loop().call_later(self.config.stop_grace, self._cut)
        if self.config.health_file:
            self._write_health()

    def _cut(self) -> None:
        if self.loop is not None:
            self.loop.cut_downloads()
        self._cut_queued()
        receivers = self.crawler.signals.send_catch_log(downloads_cut, grace=self.config.stop_grace)
        if not receivers:
            logger.warning(
                "FLEET_STOP_GRACE is over, but the project's DOWNLOAD_HANDLERS are not the"
                " fleet's: the downloads in flight run on until DOWNLOAD_TIMEOUT"
            )

    def _cut_queued(self) -> None:
        """Requests still waiting in Scrapy's download slots (a DOWNLOAD_DELAY, AutoThrottle)
        are cut too: they would leave one a delay apart, long after the grace."""
        engine = self.crawler.engine
        slots = getattr(getattr(engine, "downloader", None), "slots", None) or {}
        queued = 0
        for slot in list(slots.values()):
            waiting = getattr(slot, "queue", None)
            while waiting:
                request, deferred = waiting.popleft()
                queued += 1
                deferred.errback(cut(request, self.config.stop_grace))
        if queued:
            self.stats.inc_value("fleet/stop/cut_queued", queued)
            logger.info("%d requests waiting in download slots cut by the node's stop", queued)

    # -- the health file -------------------------------------------------------------

    async def _keep_health(self) -> None:
        while True:
            await asyncio.sleep(_HEALTH_EVERY)
            self._write_health()

    def _write_health(self) -> None:
        age = self.loop.step_age() if self.loop is not None else None
        health = {
            "pid": os.getpid(),
            "node": self.loop.config.node_id if self.loop is not None else None,
            "state": self.state,
            "started_at": round(self._started_at, 3),
            "step_at": round(time.time() - age, 3) if age is not None else None,
            "written_at": round(time.time(), 3),
        }
        path = Path(self.config.health_file)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(health))
            temporary.replace(path)
        except OSError as exc:
            self.stats.inc_value("fleet/health/write_errors")
            logger.warning("Cannot write FLEET_HEALTH_FILE %s: %s", path, exc)
