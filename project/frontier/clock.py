"""The fleet's one clock: Redis', as each node reads it through its round trips.

Times the fleet compares with each other (an item's ``last_seen`` against the moment a page
said it is gone, a run's start against what its nodes stored) must come from one clock; a
node whose own clock is behind would otherwise make what it saw look old. Each step's reply
carries Redis' time (lua/step.lua); the node keeps the offset of its clock from it, taken
from the round trip with the smallest delay of the last minute (NTP's way: the true time lies
within that trip, so its midpoint is off by at most half of it).
"""

from __future__ import annotations

import time

__all__ = ["FleetClock"]

#: A sample this old gives way to any newer one (clocks drift; a long trip beats none).
_SAMPLE_SECONDS = 60.0


class FleetClock:
    """Redis' time for this node: ``time.time()`` plus the offset its round trips measured."""

    def __init__(self) -> None:
        self.offset = 0.0  # seconds to add to this node's clock
        self.synced = False
        self._trip = float("inf")
        self._sampled_at = 0.0

    def observe(self, redis_ms: int | None, sent: float, received: float) -> None:
        """A round trip sent at *sent* and answered at *received* (this node's clock) read
        Redis' time *redis_ms* (milliseconds) somewhere in between."""
        if redis_ms is None or received < sent:
            return
        trip = received - sent
        if trip <= self._trip or received - self._sampled_at > _SAMPLE_SECONDS:
            self.offset = redis_ms / 1000 - (sent + received) / 2
            self._trip, self._sampled_at, self.synced = trip, received, True

    def now(self) -> float:
        """Unix time by Redis' clock (this node's own until a round trip measured it)."""
        return time.time() + self.offset
