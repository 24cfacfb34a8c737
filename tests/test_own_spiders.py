"""Spiders written the way Scrapy's and scrapy-redis' documentation write them run unchanged on
the fleet: two nodes crawl a site neither has seen, each page once, every item in MongoDB once
(issue 13, deliverable 1 and its "done when")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import ROOT

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


@pytest.mark.slow
@pytest.mark.parametrize("spider", sorted(_SPIDERS))
def test_a_stock_spider_crawls_a_new_site_with_two_nodes_once_and_stores_every_item(
    fleet: Fleet,
    make_shop: Any,
    mongo: pymongo.database.Database[Any],
    redis_client: redis.Redis,
    tmp_path: Any,
    spider: str,
) -> None:
    shop = make_shop(products=20, books=BOOKS)
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
    # The figures of issue 13's note: pytest -s tests/test_own_spiders.py
    print(f"\n{spider}: pages {pages}, items {items}, in MongoDB {len(stored)}, twice {len(twice)}")
