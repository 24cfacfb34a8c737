"""What project/frontier/engine.py needs from Scrapy's private engine slot, checked on the
installed Scrapy: when a release changes it, this fails and says what to look at."""

from __future__ import annotations

import asyncio
import inspect

import scrapy
from scrapy import Spider
from scrapy.core import engine as scrapy_engine
from scrapy.utils.test import get_crawler

from project.frontier.engine import requests_in_progress, wake_engine

_HINT = (
    f"Scrapy {scrapy.__version__} changed the engine slot that project/frontier/engine.py reads"
    " (ExecutionEngine._slot.inprogress / .nextcall): the frontier acks leases by it. Adapt"
    " engine.py before raising the Scrapy pin in pyproject.toml."
)


def test_the_engine_slot_still_has_inprogress_and_nextcall() -> None:
    slot = getattr(scrapy_engine, "_Slot", None)
    assert slot is not None, _HINT
    source = inspect.getsource(slot)
    assert "self.inprogress" in source, _HINT
    assert "self.nextcall" in source, _HINT
    assert "self._slot" in inspect.getsource(scrapy_engine.ExecutionEngine), _HINT


class _Probe(Spider):
    name = "probe"
    start_urls = ["data:,hello"]
    seen: list[tuple[bool, bool]] = []

    def parse(self, response):
        in_progress = requests_in_progress(self.crawler)
        wake_engine(self.crawler)  # must not raise
        type(self).seen.append((response.request in in_progress, len(in_progress) == 1))


def test_a_request_is_in_progress_while_its_callback_runs() -> None:
    """A real in-process crawl: the frontier's view of the engine during a callback."""
    crawler = get_crawler(_Probe, {"LOG_LEVEL": "WARNING"})

    async def main() -> None:
        await crawler.crawl_async()

    asyncio.run(main())
    assert _Probe.seen == [(True, True)], _HINT
    assert requests_in_progress(crawler) == set(), "after the crawl, nothing is in progress"


def test_robots_txt_middleware_still_keeps_parsers_by_netloc() -> None:
    """project/frontier/robots.py's ExpiringRobotsTxtMiddleware forgets entries of this dict."""
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware

    source = inspect.getsource(RobotsTxtMiddleware)
    hint = (
        f"Scrapy {scrapy.__version__} changed RobotsTxtMiddleware._parsers, which"
        " ExpiringRobotsTxtMiddleware expires: adapt project/frontier/robots.py"
    )
    assert "self._parsers[netloc]" in source, hint
    assert "async def robot_parser(self, request" in source, hint
