"""When a node's crawl is over: the fleet has nothing left, and neither has the node."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = ["CrawlEnd"]

logger = logging.getLogger(__name__)


class CrawlEnd:
    """Finishes the moment the fleet's counts are all zero, with nothing of this node's own.

    Exact, not a grace period: a lease is acknowledged only in the round trip that
    enqueues what its callback produced (or after), start() holds its claim until its
    last request is in, seeds are leased, so the counts are zero only when no node
    holds anything that could still produce work. A node that never saw work waits
    FRONTIER_IDLE_GRACE seconds for a crawl to begin (seeds pushed just after it).
    """

    def __init__(self, idle_grace: float, keep_alive: bool, spider: Spider) -> None:
        self.idle_grace = idle_grace
        self.keep_alive = keep_alive  # FRONTIER_KEEP_ALIVE: never finishes
        self.spider = spider
        self.finished = False
        self.started_at = time.monotonic()
        self._seen_work = False  # this node saw the fleet's crawl with work left, or did some

    @property
    def seen_work(self) -> bool:
        """This node saw the fleet's crawl with work left, or did some."""
        return self._seen_work

    def observe(self, moved: bool, counts: tuple[int, ...] | None, local_busy: bool) -> bool:
        """A step ran: it *moved* something, read the fleet's *counts* (None: it did not
        count), and the node still has work of its own or not. Returns :attr:`finished`."""
        if moved or (counts is not None and any(counts)):
            self._seen_work = True
        if local_busy or moved or self.keep_alive or self.finished:
            return self.finished
        if counts is None or any(counts):
            return False  # only counts read in this very round trip say the fleet is done
        if self._seen_work:
            logger.info(
                "Crawl over: no request queued, leased or retried and no seed waiting",
                extra={"spider": self.spider},
            )
            self.finished = True
        elif time.monotonic() - self.started_at >= self.idle_grace:
            logger.info(
                "No crawl to join: the frontier stayed empty for %.1fs (FRONTIER_IDLE_GRACE)",
                self.idle_grace,
                extra={"spider": self.spider},
            )
            self.finished = True
        return self.finished
