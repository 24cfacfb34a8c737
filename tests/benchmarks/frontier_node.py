"""One benchmark crawler node: ``python -m tests.benchmarks.frontier_node VARIANT OUT.json``.

VARIANT is ``memory`` (Scrapy's in-memory scheduler, one process), ``stock``
(scrapy-redis 0.9.1 as shipped) or ``fleet`` (fleetcrawl's frontier). The
spider logic is the products spider's in every case. Figures cover the span
from the first to the last response, so start-up and idle waits don't count.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

from scrapy import Request, signals
from scrapy.crawler import CrawlerProcess
from scrapy.utils.project import get_project_settings
from scrapy_redis.spiders import RedisSpider

from project.addon import FleetAddon
from spiders.products import ProductsSpider


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Probe:
    """Records time and CPU at the first and last response."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] = (0.0, 0.0)
        self.pages = 0

    def response(self, **_: Any) -> None:
        now = (time.monotonic(), _cpu())
        if self.first is None:
            self.first = now
        self.last = now
        self.pages += 1

    def closed(self, spider: Any, reason: str) -> None:
        first = self.first or self.last
        with open(self.out, "w") as handle:
            json.dump(
                {
                    "pages": self.pages,
                    "seconds": self.last[0] - first[0],
                    "cpu": self.last[1] - first[1],
                    "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                    "reason": reason,
                },
                handle,
            )


class MemoryProducts(ProductsSpider):
    name = "products"

    async def start(self):  # type: ignore[override]
        yield Request(os.environ["BENCH_SEED"], dont_filter=True)


class StockProducts(RedisSpider):  # type: ignore[misc]
    name = "products"
    parse = ProductsSpider.parse
    parse_listing = ProductsSpider.parse_listing
    parse_product = ProductsSpider.parse_product
    _follow = ProductsSpider._follow  # the same link handling, bad hrefs included


def main() -> None:
    variant, out = sys.argv[1], sys.argv[2]
    settings = get_project_settings()
    # The add-on adds what a project does not name: switch the pipelines off by name.
    settings.set(
        "ITEM_PIPELINES",
        {"pipelines.validation.ValidationPipeline": None, "pipelines.mongo.MongoPipeline": None},
    )
    settings.set("LOG_LEVEL", "WARNING")
    settings.set("CONCURRENT_REQUESTS", int(os.environ.get("BENCH_CONCURRENCY", "16")))
    settings.set("CONCURRENT_REQUESTS_PER_DOMAIN", int(os.environ.get("BENCH_CONCURRENCY", "16")))
    settings.set("FRONTIER_IDLE_GRACE", 1.0)
    # This measures the frontier: no fleet-wide politeness cap, as stock has none.
    settings.set("FRONTIER_SITE_CONCURRENCY", 0)
    for key, value in json.loads(os.environ.get("BENCH_SETTINGS", "{}")).items():
        settings.set(key, value)
    spider: type[Any] = ProductsSpider
    if variant != "fleet":
        # The add-on refuses another scheduler: wire the fleet's components in here, as the
        # add-on would, then swap the scheduler (the baselines keep everything else the same).
        FleetAddon().update_settings(settings)
        settings.set("ADDONS", {})
    if variant == "memory":
        settings.set("SCHEDULER", "scrapy.core.scheduler.Scheduler")
        settings.set("DUPEFILTER_CLASS", "scrapy.dupefilters.RFPDupeFilter")
        spider = MemoryProducts
    elif variant == "stock":
        settings.set("SCHEDULER", "scrapy_redis.scheduler.Scheduler")
        settings.set("DUPEFILTER_CLASS", "scrapy_redis.dupefilter.RFPDupeFilter")
        settings.set("MAX_IDLE_TIME_BEFORE_CLOSE", 2)
        settings.set(
            "DOWNLOADER_MIDDLEWARES",
            {
                "project.frontier.retry.FrontierRetryMiddleware": None,
                "project.frontier.robots.RobotsCacheMiddleware": None,
                "project.rendering.middleware.RenderingMiddleware": None,
                "scrapy.downloadermiddlewares.retry.RetryMiddleware": 550,
            },
        )
        spider = StockProducts
    probe = _Probe(out)
    process = CrawlerProcess(settings, install_root_handler=True)
    crawler = process.create_crawler(spider)
    crawler.signals.connect(probe.response, signal=signals.response_received)
    crawler.signals.connect(probe.closed, signal=signals.spider_closed)
    process.crawl(crawler)
    process.start()


if __name__ == "__main__":
    main()
