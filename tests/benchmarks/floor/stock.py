"""What users run today: a stock scrapy-redis ``RedisSpider`` on its shared scheduler.

Run by ``tests.benchmarks.startup`` as ``scrapy runspider stock.py`` outside the project
(``REDIS_URL`` from the environment); prints when its first request reaches the downloader
(``bare.FirstRequestClock``). scrapy-redis 0.9.1 reads its start URLs in
``start_requests()``, which Scrapy 2.19 no longer calls, so it reads them at the engine's
first idle signal: its figure includes that wait.
"""

from __future__ import annotations

import os
from typing import Any

from bare import Bare, FirstRequestClock  # first: it imports Scrapy's TLS context factory early
from scrapy import signals
from scrapy_redis.spiders import RedisSpider


class Stock(RedisSpider):
    name = "stock"
    custom_settings = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "TELNETCONSOLE_ENABLED": False,
        "EXTENSIONS": Bare.custom_settings["EXTENSIONS"],
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
