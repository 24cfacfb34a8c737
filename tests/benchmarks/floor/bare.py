"""The start-up floor of plain Scrapy: one hard-coded URL (``FLOOR_URL``).

Run by ``tests.benchmarks.startup`` as ``scrapy runspider bare.py`` outside the project,
alone, or with ``-s ITEM_PIPELINES={"clients.ClientsPipeline": 300}``: the floor of any
node that shares work in Redis and stores in MongoDB, which imports both clients and
connects before its first request. The benchmark times its first request's arrival at the
test shop.
"""

from __future__ import annotations

import os
from typing import Any

import scrapy

# Imported first, as fleetcrawl's project/settings.py does (see there): imported later, by the
# download handler, Scrapy's TLS context factory costs 0.2-0.3 s more (inspect.stack() in its
# deprecated aliases), which would inflate the floor.
import scrapy.core.downloader.contextfactory

#: As a fleetcrawl node has them (project/addon.py): no telnet console, Scrapy 2.19's remote
#: control neither on nor imported (its imports took about 0.1 s here), INFO logs.
TRIMMED: dict[str, Any] = {
    "TELNETCONSOLE_ENABLED": False,
    "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None},
    "LOG_LEVEL": "INFO",
}


class Bare(scrapy.Spider):
    name = "bare"
    custom_settings = TRIMMED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [os.environ["FLOOR_URL"]]

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
