"""Several real ``scrapy crawl`` nodes share one frontier and one MongoDB."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl

_CRAWLED = re.compile(r"Crawled \(\d+\) <GET ([^>]+)>")


def test_two_nodes_fetch_every_product_once(fleet: Fleet, make_shop, mongo) -> None:
    # `make demo` crawls 2000; 500 share out as well between two nodes
    shop = make_shop(products=500)
    fleet.start_node()
    fleet.start_node()
    fleet.seed(shop.url("/"))
    assert fleet.wait(240) == [0, 0]

    stats = shop.stats()
    assert len(stats["product_hits"]) == 500
    assert set(stats["product_hits"].values()) == {1}, "a product was fetched twice"
    assert max(stats["hits"].values()) == 1, "a page was fetched twice"
    assert mongo.products.count_documents({}) == 500
    ids = {doc["sku"] for doc in mongo.products.find({}, {"sku": 1})}
    assert len(ids) == 500
    for index in (0, 1):
        stats = fleet.stats(index)
        assert stats["finish_reason"] == "finished"
        assert stats["downloader/response_count"] > 100, f"node{index} did little work"


def test_listing_pages_are_fetched_before_product_pages(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=40)
    catalogue = shop.catalogue()
    listings = [c["url"] for c in catalogue["categories"]]
    products = [p["url"] for p in catalogue["products"][:6]]
    # Queued together: plain product seeds first, JSON listing seeds after.
    fleet.seed(*(shop.url(p) for p in products))
    fleet.seed(*(json.dumps({"url": shop.url(u), "priority": 10}) for u in listings))
    fleet.start_node(
        CONCURRENT_REQUESTS=1, FRONTIER_PREFETCH=0, FRONTIER_SEED_BATCH=50, LOG_LEVEL="DEBUG"
    )
    assert fleet.wait(120) == [0]

    order = [urlsplit(url).path for url in _CRAWLED.findall(fleet.log(0))]
    kinds = ["product" if path.startswith("/product/") else "listing" for path in order]
    assert kinds.count("product") == 40
    first_product = kinds.index("product")
    assert "listing" not in kinds[first_product:], order
    assert kinds.count("listing") >= len(listings)
