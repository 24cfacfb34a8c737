"""A node's view of Redis going away and coming back: one line each way, and a count."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.exceptions import RedisError
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

__all__ = ["RedisOutage"]

logger = logging.getLogger(__name__)


class RedisOutage:
    """Since when this node's steps fail, logged once as it begins and once as it ends."""

    def __init__(self, stats: StatsCollector, spider: Spider, redis_name: str) -> None:
        self.stats = stats
        self.spider = spider
        self.redis_name = redis_name  # masked: no password
        self.since: float | None = None

    def began(self, exc: RedisError, since: float, waiting: int) -> None:
        """A step that began at *since* failed: the outage counts from then (a partition
        shows as a step that hangs for its socket timeout); *waiting*: requests to enqueue."""
        self.stats.inc_value("frontier/redis_errors")
        if self.since is None:
            self.since = since
            logger.error(
                "Redis unreachable at %s (%s); holding %d requests to enqueue, retrying",
                self.redis_name,
                exc,
                waiting,
                extra={"spider": self.spider},
            )

    def ended(self) -> None:
        """A step ran."""
        if self.since is not None:
            logger.warning(
                "Redis reachable again after %.1fs",
                time.monotonic() - self.since,
                extra={"spider": self.spider},
            )
            self.since = None
