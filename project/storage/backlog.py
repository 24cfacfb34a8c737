"""What a node's store has not stored yet, bounded: a store slower than the downloads slows them.

Every record the store takes waits until MongoDB, the fleet's outbox or the journal has it
(``MongoStore._submit``). While more than ``MONGO_MAX_WAITING`` records, or
``MONGO_MAX_WAITING_BYTES`` of them, wait, the store says it is behind
(``store_backpressure`` with ``behind=True``): the node's frontier starts no more downloads
and leases nothing more, so responses, items and leases do not pile up in memory. Once half of
each bound is left it says so again (``behind=False``) and downloads go on. Each episode is
logged once, counted (``mongo/backpressure``, ``mongo/backpressure_ms``), and the node's
heartbeat shows ``store_waiting`` and ``store_behind`` (``fleetcrawl status``), from the
gauges ``mongo/waiting`` and ``mongo/behind``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import bson

from project.frontier.signals import store_backpressure

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.signalmanager import SignalManager
    from scrapy.statscollectors import StatsCollector

__all__ = ["StoreBacklog", "record_bytes"]

logger = logging.getLogger(__name__)


def record_bytes(record: Mapping[str, Any]) -> int:
    """About what *record* costs in memory: its document as BSON (at least 256 bytes)."""
    doc = record.get("doc")
    try:
        size = len(bson.encode(doc)) if isinstance(doc, dict) else 0
    except Exception:  # noqa: BLE001 (a document BSON refuses is refused later, with its reason)
        size = 0
    return max(256, size)


class StoreBacklog:
    """Records waiting to be stored, in count and bytes, and whether the store is behind."""

    def __init__(
        self,
        stats: StatsCollector,
        max_records: int,
        max_bytes: int,
        signals: SignalManager | None = None,
    ) -> None:
        self.stats = stats
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.signals = signals
        self.records = 0
        self.bytes = 0
        self.behind = False
        self._since = 0.0
        self._most = 0

    def added(self, size: int) -> None:
        """A record of *size* bytes waits."""
        self.records += 1
        self.bytes += size
        self.stats.set_value("mongo/waiting", self.records)
        if self.records > self._most:
            self._most = self.records
            self.stats.max_value("mongo/waiting_max", self.records)
        if not self.behind and (
            (self.max_records and self.records > self.max_records)
            or (self.max_bytes and self.bytes > self.max_bytes)
        ):
            self._fall_behind()

    def done(self, size: int) -> None:
        """A record of *size* bytes is stored (or failed)."""
        self.records -= 1
        self.bytes -= size
        self.stats.set_value("mongo/waiting", self.records)
        if (
            self.behind
            and self.records <= self.max_records // 2
            and self.bytes <= self.max_bytes // 2
        ):
            self._catch_up()

    def _fall_behind(self) -> None:
        self.behind = True
        self._since = time.monotonic()
        self.stats.inc_value("mongo/backpressure")
        logger.warning(
            "The store is behind: %d items (%.1f MiB) wait to be stored, over MONGO_MAX_WAITING=%d"
            " or MONGO_MAX_WAITING_BYTES=%d; this node starts no more downloads until half of"
            " that is left",
            self.records,
            self.bytes / 2**20,
            self.max_records,
            self.max_bytes,
        )
        self._send()

    def _catch_up(self) -> None:
        self.behind = False
        seconds = time.monotonic() - self._since
        self.stats.inc_value("mongo/backpressure_ms", round(seconds * 1000))
        logger.info("The store caught up after %.1fs: downloads go on", seconds)
        self._send()

    def _send(self) -> None:
        self.stats.set_value("mongo/behind", int(self.behind))
        if self.signals is not None:
            self.signals.send_catch_log(store_backpressure, behind=self.behind)
