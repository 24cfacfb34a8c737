"""The start-up floor of plain Scrapy: one hard-coded URL, no Redis, no store.

Run by ``tests.benchmarks.startup`` as ``scrapy runspider bare.py`` outside the project;
prints when its first request reaches the downloader.
"""

from __future__ import annotations

import os
import time
from typing import Any

import scrapy
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
    #: As a fleetcrawl node has them: no telnet console, no remote control (Scrapy 2.19).
    custom_settings = {"TELNETCONSOLE_ENABLED": False, "REMOTE_CONTROL_ENABLED": False,
                       "LOG_LEVEL": "WARNING"}  # fmt: skip

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
