"""What users run today: a stock scrapy-redis ``RedisSpider`` on its shared scheduler.

Run by ``tests.benchmarks.startup`` as ``scrapy runspider stock.py`` outside the project
(``REDIS_URL`` from the environment); the benchmark times its first request's arrival at the
test shop. scrapy-redis 0.9.1 reads its start URLs in ``start_requests()``, which Scrapy 2.19
no longer calls, and at every ``spider_idle``: it reads them at the engine's first idle
signal, one turn of the loop after ``start()`` is used up.
"""

from __future__ import annotations

import os
from typing import Any

from bare import TRIMMED  # first: it imports Scrapy's TLS context factory early
from scrapy_redis.spiders import RedisSpider


class Stock(RedisSpider):
    name = "stock"
    custom_settings = {
        **TRIMMED,
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
