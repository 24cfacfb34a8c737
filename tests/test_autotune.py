"""FLEET_AUTOTUNE: a node finds the concurrency a site's latency knee allows, by measurement."""

from __future__ import annotations

import concurrent.futures
import re
import statistics
import time
import urllib.request

import pytest
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from project.frontier.autotune import Autotune, AutotuneConfig


def _fetch(url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        response.read()


@pytest.mark.crawl
def test_the_shop_serves_knee_requests_at_once_and_queues_the_rest(make_shop) -> None:
    shop = make_shop(products=20, latency_ms=200, knee=4)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(_fetch, [shop.url(f"/product/{i}") for i in range(1, 17)]))
    took = time.monotonic() - started
    # 16 requests, 4 at a time, 0.2 s each: four turns
    assert 0.75 < took < 3.0, took


def _tuner(**settings: object) -> Autotune:
    crawler = get_crawler(settings_dict={"FLEET_AUTOTUNE": True, **settings})
    stats = MemoryStatsCollector(crawler)
    return Autotune(AutotuneConfig.from_settings(crawler.settings), 64, stats)


def _window(tuner: Autotune, now: float, latency: float) -> int:
    tuner.in_flight(tuner.limit)  # every permit used
    for _ in range(20):
        tuner.download_ended(latency)
    return tuner.tick(now)


def test_the_limit_grows_at_the_latency_floor_and_settles_at_the_knee() -> None:
    """A site that serves 16 at once, 0.1 s each: past 16, latency grows with concurrency."""
    tuner = _tuner(FLEET_AUTOTUNE_START=2, FLEET_AUTOTUNE_WINDOW=1)
    limits = []
    start = time.monotonic()
    for second in range(1, 901):
        latency = 0.1 * max(1.0, tuner.limit / 16)
        limits.append(_window(tuner, start + second, latency))
    assert limits[0] == 3
    # half an hour of 2 s windows: no creep (a node held past the knee takes its own
    # queueing for the floor without the probes), a quarter off every 30th window
    last = limits[-300:]
    assert 15 <= statistics.mean(last) <= 19, last
    assert max(last) <= 20, last
    assert min(last) >= 12, last


def test_an_idle_limit_holds_and_an_overloaded_node_backs_off() -> None:
    tuner = _tuner(FLEET_AUTOTUNE_START=10, FLEET_AUTOTUNE_WINDOW=1)
    start = time.monotonic()
    tuner.in_flight(2)  # the sites, not the limit, bound the node
    for _ in range(20):
        tuner.download_ended(0.1)
    assert tuner.tick(start + 1) == 10
    tuner._lags[:] = [0.5] * 10  # the event loop ran half a second late, again and again
    assert _window(tuner, start + 2, 0.1) == 9
    assert tuner.tick(start + 2.5) == 9, "no window passed"


@pytest.mark.crawl
@pytest.mark.slow("the tuner climbs from 2 to the knee one window at a time")
def test_a_node_tunes_itself_to_the_shops_knee(fleet, make_shop, mongo) -> None:
    shop = make_shop(products=600, latency_ms=150, knee=8)
    fleet.start_node(
        FLEET_AUTOTUNE=True,
        FLEET_AUTOTUNE_START=2,
        FLEET_AUTOTUNE_WINDOW=1.0,
        CONCURRENT_REQUESTS=32,
        CONCURRENT_REQUESTS_PER_DOMAIN=32,
        FRONTIER_SITE_CONCURRENCY=32,
    )
    fleet.seed(shop.url("/"))
    assert fleet.wait(180) == [0]
    assert mongo.products.count_documents({}) == 600
    limit = fleet.stat(0, "autotune/limit")
    moves = re.findall(r"Autotune: (\d+) downloads at once", fleet.log(0))
    print("limit at the end:", limit, "moves:", moves)
    assert 6 <= limit <= 12, (limit, moves)
