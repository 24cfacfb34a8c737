"""Spiders written the way Scrapy's and scrapy-redis' documentation write them run unchanged on
the fleet: two nodes crawl a site neither has seen, each page once, every item in MongoDB once."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import ROOT, wait_for

if TYPE_CHECKING:
    import pymongo.database
    import redis

    from tests.fleet import Fleet

PROJECT = ROOT / "tests" / "own_project"
BOOKS = 300

#: spider -> (the key its seed is pushed to, or None: it seeds itself; its -a arguments)
_SPIDERS: dict[str, tuple[str | None, dict[str, str]]] = {
    # scrapy-redis' README: a RedisSpider with a redis_key, dict items
    "books": ("books:start_urls", {}),
    # scrapy-redis' example project: a RedisCrawlSpider, allowed_domains = filter(...)
    "books_crawl": ("books_crawl:start_urls", {"domain": "127.0.0.1"}),
    # plain Scrapy: start_urls, seeded once for the fleet by whichever node starts first
    "books_plain": (None, {"site": "{site}"}),
    # plain Scrapy: sitemaps named by robots.txt, an index, a gzip child
    "books_sitemap": (None, {"site": "{site}"}),
}


@pytest.mark.crawl
@pytest.mark.parametrize("spider", sorted(_SPIDERS))
def test_a_stock_spider_crawls_a_new_site_with_two_nodes_once_and_stores_every_item(
    fleet: Fleet,
    make_shop: Any,
    mongo: pymongo.database.Database[Any],
    redis_client: redis.Redis,
    tmp_path: Any,
    spider: str,
) -> None:
    # 200 ms a page: the crawl outlasts the second node's start, so both take part
    shop = make_shop(products=20, books=BOOKS, latency_ms=200)
    seed_key, args = _SPIDERS[spider]
    site = shop.url("/").rstrip("/")
    fleet.cwd = PROJECT
    fleet.spider = spider
    fleet.spider_args = {name: value.format(site=site) for name, value in args.items()}
    fleet.settings = {
        "MONGO_URI": fleet.mongo_url,
        "MONGO_DATABASE": fleet.mongo_db,
        "MONGO_JOURNAL_DIR": str(tmp_path / "journal"),
    }
    try:
        fleet.start_node()
        fleet.start_node()
        if seed_key is not None:
            redis_client.lpush(seed_key, f"{site}/books/")
        codes = fleet.wait(180)
    finally:
        if seed_key is not None:
            redis_client.delete(seed_key)
    assert codes == [0, 0], fleet.log(0)[-3000:] + fleet.log(1)[-3000:]

    stats = shop.stats()
    books = {url.removeprefix(site) for url in shop.book_urls()}
    assert set(stats["book_hits"]) == books, "a book page was not fetched"
    twice = {path: n for path, n in stats["hits"].items() if n > 1}
    assert twice == {}, "fetched more than once"
    stored = list(mongo[spider].find({}, {"url": 1}))
    assert len(stored) == BOOKS
    assert {doc["url"] for doc in stored} == shop.book_urls()
    for index in (0, 1):
        node = fleet.stats(index)
        assert node["finish_reason"] == "finished"
        assert node.get("frontier/leased", 0) > 0, f"node{index} took no work from the frontier"
    pages = sum(stats["hits"].values())
    items = sum(fleet.stat(i, "item_scraped_count") for i in (0, 1))
    # What each crawl did: pytest -s tests/test_own_spiders.py
    print(f"\n{spider}: pages {pages}, items {items}, in MongoDB {len(stored)}, twice {len(twice)}")


@pytest.mark.crawl
def test_a_start_url_that_pages_link_before_start_yields_it_is_fetched_once(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Any
) -> None:
    """start_urls are dont_filter, so tomorrow's crawl fetches them again; within one run the
    pages of a seed pushed to Redis may link the start URL before start() yields it."""
    shop = make_shop(products=5, books=40)
    site = shop.url("/").rstrip("/")
    genre = shop.catalogue()["genres"][0]["url"]
    fleet.cwd = PROJECT
    fleet.spider = "books_late_start"
    fleet.spider_args = {"site": site, "delay": "2"}
    fleet.settings = _mongo_settings(fleet, tmp_path)
    fleet.seed(shop.url(genre))
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0], fleet.log(0)[-3000:] + fleet.log(1)[-3000:]

    hits = shop.stats()["hits"]
    assert hits["/books/"] == 1
    assert {path: n for path, n in hits.items() if n > 1} == {}
    assert mongo.books_late_start.count_documents({}) == 40
    started = [i for i in (0, 1) if fleet.stats(i).get("frontier/start/ran_here")]
    assert len(started) == 1
    assert fleet.stat(started[0], "frontier/start/requests") == 1


def _product_id(url: str) -> int:
    match = re.search(r"/product/(\d+)", url)
    assert match is not None, url
    return int(match[1])


def _mongo_settings(fleet: Fleet, tmp_path: Any) -> dict[str, Any]:
    return {
        "MONGO_URI": fleet.mongo_url,
        "MONGO_DATABASE": fleet.mongo_db,
        "MONGO_JOURNAL_DIR": str(tmp_path / "journal"),
    }


@pytest.mark.crawl
def test_errbacks_see_only_final_failures_and_every_item_type_is_stored(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Any
) -> None:
    """A plain Spider: follow_all, cb_kwargs, an errback, a dataclass, attrs and scrapy.Item."""
    shop = make_shop(
        products=80, flaky_share=0.15, flaky_failures=2, broken_share=0.1, latency_ms=200
    )
    expected = shop.stats()["expected"]
    fleet.cwd = PROJECT
    fleet.spider = "shop_pages"
    fleet.spider_args = {"site": shop.url("/").rstrip("/")}
    fleet.settings = {
        **_mongo_settings(fleet, tmp_path),
        "RETRY_TIMES": 2,
        "FRONTIER_RETRY_BACKOFF_BASE": 0.2,
    }
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(180) == [0, 0]

    failed = list(mongo.failed_pages.find({}, {"url": 1, "error": 1}))
    failed_ids = {_product_id(doc["url"]) for doc in failed}
    assert failed_ids == set(expected["broken"]), "only pages that failed for good"
    calls = sum(fleet.stat(i, "shop_pages/errback_calls") for i in (0, 1))
    assert calls == len(failed), "an errback per final failure, none per retry"
    assert {doc["error"] for doc in failed} == {"HttpError"}
    retries = sum(fleet.stat(i, "retry/count") for i in (0, 1))
    assert retries >= 2 * (len(expected["flaky"]) + len(expected["broken"]))
    assert sum(fleet.stat(i, "retry/max_reached") for i in (0, 1)) == len(failed)
    products = {doc["url"] for doc in mongo.shop_products.find({}, {"url": 1})}
    stored_ids = {_product_id(url) for url in products}
    assert set(expected["flaky"]) <= stored_ids, "a flaky page is stored after its retries"
    assert all(
        doc["listing"].startswith(shop.url("/category/")) for doc in mongo.shop_products.find()
    )
    assert mongo.listing_pages.count_documents({}) > 0
    for index in (0, 1):
        node = fleet.stats(index)
        assert node["scheduler/enqueued"] > 0
        assert node["scheduler/dequeued"] > 0


def _slow_start(fleet: Fleet, shop: Any, tmp_path: Any, pause: str) -> None:
    """Node 0 claims start() of 20 requests *pause* seconds apart, then node 1 starts."""
    fleet.cwd = PROJECT
    fleet.spider = "slow_start"
    fleet.spider_args = {"site": shop.base_url, "products": "20", "pause": pause}
    fleet.settings = _mongo_settings(fleet, tmp_path)
    fleet.start_node()
    wait_for(lambda: "runs start() for the fleet" in fleet.log(0), 30, "node0 to claim start()")
    fleet.start_node()


@pytest.mark.crawl
def test_a_slow_start_is_waited_for_and_seeds_the_fleet_once(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Any
) -> None:
    shop = make_shop(products=20)
    _slow_start(fleet, shop, tmp_path, "0.3")
    assert fleet.wait(120) == [0, 0]
    assert "Another node runs start() for this crawl: waiting" in fleet.log(1)
    hits = shop.stats()["product_hits"]
    assert sorted(hits.values()) == [1] * 20, "each start request fetched once, by either node"
    assert mongo.slow_start.count_documents({}) == 20
    assert fleet.stats(0)["frontier/start/requests"] == 20
    assert fleet.stats(1)["frontier/start/ran_here"] is False


@pytest.mark.slow("waits out the killed node's claim on start() before the other takes it")
@pytest.mark.crawl
def test_a_node_killed_in_the_middle_of_start_hands_it_to_a_waiting_node(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Any
) -> None:
    shop = make_shop(products=20)
    _slow_start(fleet, shop, tmp_path, "0.5")
    wait_for(lambda: "waiting for it to end" in fleet.log(1), 30, "node1 to wait")
    time.sleep(2)
    fleet.kill(0)
    assert fleet.wait(120)[1] == 0
    assert "This node runs start() for the fleet" in fleet.log(1), "the claim expired to node1"
    hits = shop.stats()["product_hits"]
    assert set(hits) == {str(n) for n in range(1, 21)}, "no start request lost"
    assert mongo.slow_start.count_documents({}) == 20


@pytest.mark.crawl
def test_a_start_that_raises_ends_the_claim_and_the_fleet_finishes_what_it_yielded(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Any
) -> None:
    shop = make_shop(products=5)
    fleet.cwd = PROJECT
    fleet.spider = "broken_start"
    # it raises 4 s after its requests: node1 starts while node0 runs it
    fleet.spider_args = {"site": shop.base_url, "pause": "4"}
    fleet.settings = _mongo_settings(fleet, tmp_path)
    fleet.start_node()
    wait_for(lambda: "runs start() for the fleet" in fleet.log(0), 30, "node0 to claim start()")
    fleet.start_node()
    assert fleet.wait(60) == [0, 0], "nobody waits for a start() that failed"
    assert sorted(shop.stats()["product_hits"]) == ["1", "2", "3"]
    assert mongo.broken_start.count_documents({}) == 3
    assert "the product list went away" in fleet.log(0)
    assert "Another node runs start() for this crawl: waiting" in fleet.log(1)
    assert fleet.stats(0)["frontier/start/ran_here"] is True
    assert fleet.stats(1)["frontier/start/ran_here"] is False
