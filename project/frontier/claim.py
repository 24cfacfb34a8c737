"""This node's claim on the spider's start() (lua/start.lua): held, extended, ended."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from project.frontier.codes import START_END as END
from project.frontier.codes import START_EXTEND as EXTEND

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

__all__ = ["StartClaim"]

logger = logging.getLogger(__name__)


class StartClaim:
    """None, "run" while this node runs start() for the fleet, "done" once start() ended
    and the claim waits to be ended with the step that sends its last requests."""

    def __init__(self, stats: StatsCollector, spider: Spider) -> None:
        self.stats = stats
        self.spider = spider
        self.state: str | None = None
        self._after = 0  # requests buffered when start() ended: all must be sent first

    @property
    def held(self) -> bool:
        """Whether start() runs here (the claim not lost, not ended)."""
        return self.state == EXTEND

    def begin(self) -> None:
        self.state = EXTEND

    def end(self, buffered: int) -> bool:
        """start() is over once the *buffered* requests so far are sent; True if it was held."""
        if self.state != EXTEND:
            return False
        self.state, self._after = END, buffered
        return True

    def ask(self, sent_after: int, heartbeat_due: bool) -> str | None:
        """What the next step asks, once *sent_after* requests are sent: end the claim,
        extend it with the heartbeat, or nothing."""
        if self.state == END and sent_after >= self._after:
            return END
        if self.state == EXTEND and heartbeat_due:
            return EXTEND
        return None

    def settled(self, asked: str, held: bool) -> None:
        """The step that asked *asked* ran: the claim was still this node's, or not."""
        if asked == END:
            self.state = None
            if held:
                logger.info(
                    "start() ran for the fleet: its requests are in the shared frontier",
                    extra={"spider": self.spider},
                )
        if not held:
            self.state = None
            self.stats.inc_value("frontier/start/claim_lost")
            logger.warning(
                "Lost the claim on start() (not extended within FRONTIER_LEASE_SECONDS): a"
                " waiting node runs start() again; its requests already sent are kept",
                extra={"spider": self.spider},
            )
