"""Base spider for fleetcrawl: seeds come from Redis through the frontier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy_redis.spiders import RedisSpider

from project.frontier.config import FrontierConfig
from project.frontier.seeds import Seed, parse_seed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["FleetSpider"]


class FleetSpider(RedisSpider):  # type: ignore[misc]
    """scrapy-redis ``RedisSpider`` fed by :class:`project.frontier.scheduler.FleetScheduler`.

    The scheduler takes seeds from ``<name>:start_urls`` continuously in
    small leased batches and asks :meth:`request_from_seed` to turn each into
    a request; it also decides when the fleet's crawl is over.
    """

    async def start(self) -> AsyncIterator[Any]:
        """Nothing to start with: seeds arrive through the frontier."""
        return
        yield  # pragma: no cover  (makes this an async generator)

    def spider_idle(self) -> None:
        """Termination is the frontier's decision, not a 5-second poll."""

    def request_from_seed(self, raw: bytes) -> Request:
        """Validate a raw seed and build its request; raises InvalidSeed."""
        limit = getattr(self, "_seed_max_bytes", None)
        if limit is None:
            limit = self._seed_max_bytes = FrontierConfig.from_settings(
                self.settings
            ).seed_max_bytes
        seed = parse_seed(raw, limit)
        return self.make_request_from_seed(seed)

    def make_request_from_seed(self, seed: Seed) -> Request:
        """Build the request for a validated seed; override to route seeds."""
        return Request(
            seed.url,
            method=seed.method,
            headers=seed.headers or None,
            body=seed.body,
            meta=seed.meta,
            priority=seed.priority,
            dont_filter=True,
        )

    def make_request_from_data(self, data: bytes) -> Request:
        """scrapy-redis' name for :meth:`request_from_seed`."""
        return self.request_from_seed(data)
