"""A node never outruns its store: while too much waits to be stored, it downloads nothing more
(project/storage/backlog.py), so what it holds in memory is bounded whatever MongoDB's speed."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from scrapy.signalmanager import SignalManager
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from project.frontier.signals import store_backpressure
from project.storage.backlog import StoreBacklog
from tests.tcp_proxy import TcpProxy

if TYPE_CHECKING:
    from project.ops.services import ServicesConfig
    from tests.fleet import Fleet


def test_the_backlog_falls_behind_past_a_bound_and_catches_up_at_half_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = MemoryStatsCollector(get_crawler())
    signals = SignalManager()
    heard: list[bool] = []
    signals.connect(lambda behind: heard.append(behind), signal=store_backpressure, weak=False)
    backlog = StoreBacklog(stats, max_records=10, max_bytes=10_000, signals=signals)
    with caplog.at_level(logging.INFO, logger="project.storage.backlog"):
        for _ in range(10):
            backlog.added(100)
        assert not backlog.behind
        backlog.added(100)  # the 11th
        assert backlog.behind
        assert heard == [True]
        for _ in range(5):
            backlog.done(100)
        assert backlog.behind  # 6 left: not half yet
        backlog.done(100)
        assert not backlog.behind
        assert heard == [True, False]
        backlog.added(20_000)  # one record over the byte bound
        assert backlog.behind
    assert stats.get_value("mongo/backpressure") == 2
    assert stats.get_value("mongo/waiting_max") == 11
    assert stats.get_value("mongo/waiting") == 6
    assert stats.get_value("mongo/behind") == 1
    assert caplog.text.count("The store is behind: 11 items") == 1
    assert "The store caught up after" in caplog.text


@pytest.mark.crawl
def test_a_node_whose_store_is_slow_holds_its_downloads_and_stores_everything(
    fleet: Fleet, make_shop: Any, mongo: Any, services: ServicesConfig
) -> None:
    """MongoDB answers each reply 0.2 s late (a proxy) in batches of 10: the shop is far faster.
    The node stops downloading while 30 items wait, leases no more meanwhile, and ends with
    every product stored. Before the bound it held every response and lease until the slow
    store took its items."""
    products = 200
    shop = make_shop(products=products, latency_ms=0)
    at = urlsplit(services.mongo_url)
    with TcpProxy((at.hostname or "127.0.0.1", at.port or 27017), delay=0.2) as proxy:
        fleet.start_node(
            MONGO_URI=proxy.url("mongodb", "/"),
            MONGO_BATCH_SIZE=10,
            MONGO_MAX_WAITING=30,
            CONCURRENT_REQUESTS=8,
        )
        fleet.seed(shop.url("/"))
        leased = 0
        deadline = time.monotonic() + 240
        with fleet.client() as client:
            while fleet.procs[0].poll() is None and time.monotonic() < deadline:
                leased = max(leased, int(client.zcard(fleet.keys.inflight)))
                time.sleep(0.05)
        assert fleet.wait(30) == [0], fleet.log(0)[-3000:]
    assert mongo.products.count_documents({}) == products
    stats = fleet.stats(0)
    assert stats["mongo/backpressure"] >= 1
    # the bound, and what the downloads under way when it was crossed brought
    assert stats["mongo/waiting_max"] <= 30 + 8 * 2, stats["mongo/waiting_max"]
    assert stats["mongo/waiting"] == 0
    # leases held: pages whose items wait (one product each), downloads, what is leased ahead
    assert leased <= 30 + 8 + 8 * 2, leased
    log = fleet.log(0)
    assert "The store is behind:" in log
    assert "The store caught up after" in log
