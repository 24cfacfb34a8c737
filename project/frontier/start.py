"""A spider's ``start_urls`` and ``start()`` seed the fleet's crawl once, not once per node."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request, Spider

from project.frontier.meta import SEED_META_KEY
from project.frontier.scheduler import FleetScheduler

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["FleetStartMiddleware"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at a claim another node holds.
_WAIT_POLL = 1.0


def _starts_nothing(spider: Spider) -> bool:
    """A spider whose start() is Scrapy's own over no start_urls (a scrapy-redis spider's)."""
    return type(spider).start is Spider.start and not getattr(spider, "start_urls", None)


class FleetStartMiddleware:
    """Spider middleware: one node of the fleet runs the spider's ``start()`` per crawl.

    The first node claims it in Redis (lua/start.lua) and runs it; the requests it
    yields are seeds (their sites join the crawl's). Nodes that start meanwhile wait
    for it to end, crawling what is leased to them, so none closes before the crawl
    has begun; if the claimant dies, its claim expires and a waiting node runs
    start() again. A node started after a crawl ended (nothing queued, leased,
    retried or seeded) begins a new one. Items start() yields pass through.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        spider = self.crawler.spider
        scheduler = FleetScheduler.of(self.crawler)
        if scheduler is None or spider is None or _starts_nothing(spider):
            async for item in start:
                yield item
            return
        stats = self.crawler.stats
        assert stats is not None
        state = await self._claim(scheduler, new_crawl=True)
        if state == "running":
            logger.info(
                "Another node runs start() for this crawl: waiting for it to end",
                extra={"spider": spider},
            )
        while state == "running":
            await asyncio.sleep(_WAIT_POLL)
            state = await self._claim(scheduler, new_crawl=False)
        if state != "claimed":
            stats.set_value("frontier/start/ran_here", False)
            if state == "done":
                logger.info(
                    "start() of this crawl ran on another node: its requests come from the"
                    " shared frontier",
                    extra={"spider": spider},
                )
            return
        logger.info("This node runs start() for the fleet", extra={"spider": spider})
        stats.set_value("frontier/start/ran_here", True)
        loop = scheduler.loop
        assert loop is not None
        try:
            async for item in start:
                if not loop.runs_start:
                    # The claim expired (this node stalled) and another node runs start().
                    stats.inc_value("frontier/start/abandoned")
                    return
                if isinstance(item, Request):
                    item.meta[SEED_META_KEY] = True
                    stats.inc_value("frontier/start/requests")
                yield item
        except Exception:
            # Scrapy logs the error and crawls on: what start() yielded so far is the crawl's
            # start, and the fleet must not wait for the rest for ever.
            loop.end_start()
            raise
        loop.end_start()

    async def _claim(self, scheduler: FleetScheduler, *, new_crawl: bool) -> str | None:
        """The claim's state; None when Redis cannot be asked (the node closes, or waits)."""
        while True:
            try:
                return await scheduler.claim_start(new_crawl=new_crawl)
            except RedisError as exc:
                logger.warning(
                    "Cannot ask Redis who runs start() (%s); asking again",
                    exc,
                    extra={"spider": scheduler.spider},
                )
                await asyncio.sleep(_WAIT_POLL)
