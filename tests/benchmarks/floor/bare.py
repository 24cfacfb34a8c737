"""The start-up floor of plain Scrapy: one hard-coded URL (``FLOOR_URL``).

Run by ``tests.benchmarks.startup`` as ``scrapy runspider bare.py`` outside the project,
alone, or with ``-s ITEM_PIPELINES={"clients.ClientsPipeline": 300}``: the floor of any
node that shares work in Redis and stores in MongoDB, which imports both clients and
connects before its first request. Prints when its first request reaches the downloader.
"""

from __future__ import annotations

import os
import time
from typing import Any

import scrapy

# Imported first, as fleetcrawl's project/settings.py does (see there): imported later, by the
# download handler, Scrapy's TLS context factory costs 0.2-0.4 s more (inspect.stack() in its
# deprecated aliases), which would inflate the floor.
import scrapy.core.downloader.contextfactory
from scrapy import signals


class FirstRequestClock:
    """Prints ``First request at <monotonic>`` once, when a request first reaches the downloader."""

    def __init__(self) -> None:
        self.told = False

    def reached(self, **_: Any) -> None:
        if not self.told:
            self.told = True
            print(f"First request at {time.monotonic():.4f}", flush=True)


class Bare(scrapy.Spider):
    name = "bare"
    #: As a fleetcrawl node has them: no telnet console, and Scrapy 2.19's remote control
    #: neither on nor imported (its module alone takes about 0.1 s).
    custom_settings = {"TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "WARNING",
                       "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None}}  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [os.environ["FLOOR_URL"]]

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Bare:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(FirstRequestClock().reached, signals.request_reached_downloader,
                                weak=False)  # fmt: skip
        return spider

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
