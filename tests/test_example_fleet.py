"""The spider kit on the fleet: each example spider crawls the test site with two nodes, each
page once, its items in MongoDB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import WAIT_FOR_SEED

if TYPE_CHECKING:
    import pymongo.database

    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl


def _run_two_nodes(fleet: Fleet) -> None:
    fleet.start_node(**WAIT_FOR_SEED)
    fleet.start_node(**WAIT_FOR_SEED)
    # both step before the seed goes in: a crawl of two seconds is over before a late node
    fleet.wait_ready()


def _assert_two_nodes_finished(fleet: Fleet, timeout: float = 180) -> None:
    assert fleet.wait(timeout) == [0, 0], fleet.log(0)[-3000:] + fleet.log(1)[-3000:]
    for index in (0, 1):
        node = fleet.stats(index)
        assert node["finish_reason"] == "finished"
        assert node.get("frontier/leased", 0) > 0, f"node{index} took no work"


def test_the_schema_org_spider_stores_every_product_of_a_shop_it_was_only_given_the_url_of(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(products=120, js_share=0.1, latency_ms=30)
    catalogue = shop.catalogue()
    fleet.spider = "schemaorg"
    _run_two_nodes(fleet)
    fleet.seed(shop.url("/"))
    _assert_two_nodes_finished(fleet)

    hits = shop.stats()["hits"]
    assert max(hits.values()) == 1, "a page was fetched twice"
    # Pages built by JavaScript publish no data in their HTML: no product from them.
    with_data = {shop.url(p["url"]) for p in catalogue["products"] if p["kind"] != "js"}
    stored = {doc["_id"] for doc in mongo.products.find({}, {"_id": 1})}
    assert stored == with_data
    assert mongo.rejects.count_documents({}) == 0


def test_the_json_api_spider_pages_the_catalogue_with_json_requests_and_cb_kwargs(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(products=150, latency_ms=50)
    catalogue = shop.catalogue()
    fleet.spider = "catalogue_api"
    fleet.spider_args = {"api": shop.base_url}
    # A category's pages come one after the other: few nodes' worth of work at a time.
    fleet.settings = {"CONCURRENT_REQUESTS": 2, "FRONTIER_PREFETCH": 0}
    _run_two_nodes(fleet)
    _assert_two_nodes_finished(fleet)

    api_hits = shop.stats()["api_hits"]
    pages = {f"{c['slug']}/{n}" for c in catalogue["categories"] for n in range(1, c["pages"] + 1)}
    assert api_hits == {"categories": 1, **dict.fromkeys(pages, 1)}, "each API page once"
    # The API serves each product's true price (a malformed product is malformed in HTML only).
    stored = {doc["_id"] for doc in mongo.products.find({}, {"_id": 1})}
    assert stored == {shop.url(p["url"]) for p in catalogue["products"]}
    assert mongo.rejects.count_documents({}) == 0
    assert shop.stats()["product_hits"] == {}, "no HTML page was fetched"


@pytest.mark.parametrize("spider", ["articles", "article_sitemap"])
def test_the_article_spiders_store_every_article_once(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], spider: str
) -> None:
    """A CrawlSpider over listings and tags, and a SitemapSpider from robots.txt."""
    shop = make_shop(products=10, articles=60, latency_ms=30)
    fleet.spider = spider
    fleet.spider_args = {"site": shop.base_url}
    # A small site: fewer downloads at once per node, so both nodes get some.
    fleet.settings = {"CONCURRENT_REQUESTS": 4, "FRONTIER_PREFETCH": 0}
    _run_two_nodes(fleet)
    _assert_two_nodes_finished(fleet)

    stats = shop.stats()
    assert {k: v for k, v in stats["hits"].items() if v > 1} == {}, "a page was fetched twice"
    articles = shop.article_urls()
    assert {shop.url(path) for path in stats["article_hits"]} == articles
    stored = list(mongo.articles.find({}, {"url": 1, "title": 1, "tags": 1}))
    assert {doc["url"] for doc in stored} == articles
    assert all(doc["title"] and doc["tags"] for doc in stored)
