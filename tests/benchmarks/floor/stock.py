"""The start-up floor of stock scrapy-redis: a RedisSpider on its shared scheduler.

Run by ``tests.benchmarks.startup`` as ``scrapy runspider stock.py`` outside the project
(``REDIS_URL`` from the environment), with ``-s ITEM_PIPELINES=...MongoFloorPipeline`` for
the floor of a node that stores in MongoDB too; prints when its first request reaches the
downloader (``bare.FirstRequestClock``).
"""

from __future__ import annotations

import os
from typing import Any

from bare import FirstRequestClock
from pymongo import AsyncMongoClient
from scrapy import signals
from scrapy_redis.spiders import RedisSpider


class MongoFloorPipeline:
    """What any MongoDB pipeline does at open: a client and a first round trip."""

    async def open_spider(self) -> None:
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGO_URI"])
        await self.client.admin.command("ping")

    async def close_spider(self) -> None:
        await self.client.close()

    async def process_item(self, item: Any) -> Any:
        await self.client[os.environ["MONGO_DATABASE"]].items.insert_one(dict(item))
        return item


class Stock(RedisSpider):
    name = "stock"
    custom_settings = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Stock:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(FirstRequestClock().reached, signals.request_reached_downloader,
                                weak=False)  # fmt: skip
        return spider

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
