"""Scrapy's and scrapy-redis' knobs, honoured in real crawls of two nodes: seeds in a set,
SCHEDULER_PERSIST, DUPEFILTER_DEBUG, download_slot, MAX_IDLE_TIME_BEFORE_CLOSE."""

from __future__ import annotations

import re
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import ROOT, wait_for

if TYPE_CHECKING:
    import pymongo.database
    import redis

    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl
PROJECT = ROOT / "tests" / "own_project"


def _books(fleet: Fleet, tmp_path: Any, spider: str = "books", **settings: Any) -> None:
    fleet.cwd = PROJECT
    fleet.spider = spider
    fleet.settings = {
        "MONGO_URI": fleet.mongo_url,
        "MONGO_DATABASE": fleet.mongo_db,
        "MONGO_JOURNAL_DIR": str(tmp_path / "journal"),
        **settings,
    }


def test_seeds_pushed_to_a_set_with_redis_start_urls_as_set(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any],
    redis_client: redis.Redis, tmp_path: Any,
) -> None:  # fmt: skip
    shop = make_shop(products=10, books=60)
    _books(fleet, tmp_path, REDIS_START_URLS_AS_SET=True)
    genres = [shop.url(g["url"]) for g in shop.catalogue()["genres"]]
    try:
        redis_client.sadd("books:start_urls", *genres)
        fleet.start_node()
        fleet.start_node()
        assert fleet.wait(120) == [0, 0]
    finally:
        redis_client.delete("books:start_urls")
    assert {shop.url(p) for p in shop.stats()["book_hits"]} == shop.book_urls()
    assert max(shop.stats()["hits"].values()) == 1
    assert mongo.books.count_documents({}) == 60
    accepted = sum(fleet.stat(i, "frontier/seeds/accepted") for i in (0, 1))
    assert accepted == len(genres)


def test_scheduler_persist_off_deletes_the_finished_crawl_but_not_its_dead_letters(
    fleet: Fleet, make_shop: Any, redis_client: redis.Redis, tmp_path: Any
) -> None:
    shop = make_shop(products=30, broken_share=0.1)
    fleet.seed(shop.url("/"))
    fleet.settings = {"SCHEDULER_PERSIST": False, "RETRY_TIMES": 0}
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0]
    keys = fleet.keys
    assert not redis_client.exists(keys.dupefilter), "the seen-set is gone"
    assert not redis_client.exists(keys.queued, keys.allowed, keys.start)
    assert redis_client.llen(keys.dead) == len(shop.stats()["expected"]["broken"])
    assert "SCHEDULER_PERSIST is off: deleted the finished crawl" in fleet.log(0) + fleet.log(1)


def test_dupefilter_debug_logs_every_duplicate_and_counts_it(
    fleet: Fleet, make_shop: Any, tmp_path: Any
) -> None:
    shop = make_shop(products=120, latency_ms=20)
    fleet.settings = {"LOG_LEVEL": "DEBUG"}
    fleet.start_node(DUPEFILTER_DEBUG=True)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0]
    # A node without DUPEFILTER_DEBUG, seeded with pages the fleet has seen: the
    # seen-set is shared, so all are duplicates; Scrapy logs only the first.
    fleet.start_node()
    fleet.seed(shop.url("/"), shop.url("/product/1"), shop.url("/product/2"))
    assert fleet.wait(120) == [0, 0]
    debug, plain = fleet.log(0), fleet.log(1)
    lines = re.findall(r"Filtered duplicate request: <[^>]+> \(seen by the fleet\)", debug)
    assert len(lines) == fleet.stat(0, "dupefilter/filtered") > 0
    assert plain.count("Filtered duplicate request") == 1, "the first one only, as Scrapy does"
    assert "see DUPEFILTER_DEBUG to show all duplicates" in plain
    assert fleet.stat(1, "dupefilter/filtered") == 3


def test_a_requests_download_slot_is_its_politeness_unit_for_the_fleet(
    fleet: Fleet, make_shop: Any, redis_client: redis.Redis, tmp_path: Any
) -> None:
    shop = make_shop(products=10, books=40)
    _books(fleet, tmp_path, spider="books_slot")
    fleet.spider_args = {"site": shop.base_url}
    fleet.settings["DOWNLOAD_SLOTS"] = {"book-shop": {"concurrency": 2}}
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0]
    leases = {k.decode(): int(v) for k, v in redis_client.hgetall(fleet.keys.leases).items()}
    pages = sum(shop.stats()["hits"].values()) - 1  # robots.txt
    site = shop.base_url.removeprefix("http://")
    assert leases == {site: 1, "book-shop": pages - 1}, "the start page is the host's"
    assert redis_client.hget(fleet.keys.limits, "book-shop") == b"0.0 2"


def test_max_idle_time_before_close_zero_keeps_the_node_up(
    fleet: Fleet, make_shop: Any, tmp_path: Any
) -> None:
    shop = make_shop(products=10)
    fleet.seed(shop.url("/"))
    node = fleet.start_node(MAX_IDLE_TIME_BEFORE_CLOSE=0)
    wait_for(lambda: len(shop.stats()["product_hits"]) == 10, 60, "the crawl")
    time.sleep(4)  # FRONTIER_IDLE_GRACE is 1 s in tests: it would have closed by now
    assert node.poll() is None, "scrapy-redis' 0: wait for more seeds"
    node.send_signal(signal.SIGINT)
    assert node.wait(30) == 0
