"""MongoStore against the suite's FerretDB: upserts, change counts, durability, journal replay."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from datetime import UTC
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from project.ops.services import free_port
from project.schema import Product
from project.storage.config import MongoConfig
from project.storage.journal import Journal, journal_backlog
from project.storage.placement import ItemPlacer
from project.storage.store import MongoStore
from tests.test_schema import VALID

if TYPE_CHECKING:
    from pathlib import Path

    from pymongo.database import Database
    from scrapy.statscollectors import StatsCollector

    from project.ops.services import ServicesConfig


class _ShopSpider(Spider):
    name = "shop"


def make_store(
    uri: str, database: str, journal: Path, **settings: Any
) -> tuple[MongoStore, StatsCollector]:
    """A store built the way the pipelines build it, and its crawler's stats."""
    crawler = get_crawler(
        _ShopSpider,
        {
            "MONGO_URI": uri,
            "MONGO_DATABASE": database,
            "MONGO_JOURNAL_DIR": str(journal),
            "MONGO_FLUSH_INTERVAL": 0.2,
            "MONGO_SERVER_SELECTION_TIMEOUT": 1.0,
            "RUNS_CRAWL_ID": "unit",
            # a store closing while MongoDB is away gives up soon (tests that wait say so)
            "MONGO_DRAIN_TIMEOUT": 0.5,
            **settings,
        },
    )
    assert crawler.stats is not None
    return MongoStore.from_crawler(crawler), crawler.stats


def make_product(number: int, **changes: Any) -> Product:
    """Product *number* of a made-up shop, with *changes* validated in."""
    data = {
        **VALID,
        "url": f"http://shop.test/product/{number}?ref=x",
        "canonical_url": f"http://shop.test/product/{number}",
        "sku": f"SKU-{number:06d}",
    }
    return Product.model_validate({**data, **changes})


def test_store_upserts_and_counts_changes(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    async def crawl(products: list[Product]) -> dict[str, Any]:
        store, stats = make_store(
            services.mongo_url, mongo.name, tmp_path / "j", MONGO_BATCH_SIZE=10
        )
        await store.open()
        await asyncio.gather(*(store.save_product(p) for p in products))
        await store.close()
        return stats.get_stats()

    first = asyncio.run(crawl([make_product(n) for n in range(25)]))
    before = {d["_id"]: d for d in mongo.products.find()}
    second = asyncio.run(
        crawl([make_product(n, price="1.00") if n < 5 else make_product(n) for n in range(25)])
    )
    after = {d["_id"]: d for d in mongo.products.find()}
    index_keys = [list(index["key"]) for index in mongo.products.list_indexes()]

    assert (
        first.get("mongo/inserted"),
        first.get("mongo/updated"),
        first.get("mongo/unchanged"),
    ) == (25, None, None)
    assert first["mongo/batches"] == 3
    assert (second.get("mongo/inserted"), second["mongo/updated"], second["mongo/unchanged"]) == (
        None,
        5,
        20,
    )
    assert ["sku"] in index_keys
    assert len(after) == 25
    for key, doc in after.items():
        assert doc["first_seen"] == before[key]["first_seen"]
        assert doc["last_seen"] > before[key]["last_seen"]
    changed = after["http://shop.test/product/1"]
    assert changed["price"] == "1.00"
    assert changed["content_hash"] == make_product(1, price="1.00").content_hash()
    assert (
        after["http://shop.test/product/9"]["content_hash"]
        == before["http://shop.test/product/9"]["content_hash"]
    )


def test_save_returns_once_the_product_is_in_mongodb(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    async def save() -> None:
        store, _ = make_store(
            services.mongo_url,
            mongo.name,
            tmp_path / "j",
            MONGO_BATCH_SIZE=1000,
            MONGO_FLUSH_INTERVAL=0.2,
        )
        await store.open()
        await store.save_product(make_product(1))
        assert mongo.products.count_documents({}) == 1
        await store.close()

    asyncio.run(save())


# pymongo 4.20 leaks the socket of a monitor check that AsyncMongoClient.close() interrupts
# while it connects to a server that is down; it is collected (gc.collect() below) in this test.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_store_journals_while_unreachable_and_replays_at_next_start(
    services: ServicesConfig,
    mongo: Database[Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = tmp_path / "journal"
    dead = f"mongodb://fleet:s3cret@127.0.0.1:{free_port()}"

    async def run(uri: str, products: list[Product]) -> dict[str, Any]:
        store, stats = make_store(uri, mongo.name, journal)
        await store.open()
        await asyncio.gather(*(store.save_product(p) for p in products))
        await store.save_reject(
            {"url": "http://shop.test/product/99", "price": None}, {"price": ["missing"]}
        )
        await store.close()
        return stats.get_stats()

    with caplog.at_level(logging.INFO, logger="project.storage.store"):
        down = asyncio.run(run(dead, [make_product(n) for n in range(30)]))
    gc.collect()
    assert down["mongo/journaled"] == 31
    assert journal_backlog(journal) == 31
    assert "MongoDB unreachable" in caplog.text
    assert "s3cret" not in caplog.text

    up = asyncio.run(run(services.mongo_url, [make_product(n) for n in range(20, 40)]))
    assert journal_backlog(journal) == 0
    # Items saved while the old journal replays are journaled too (replays keep the order).
    assert up["mongo/replayed"] == 31 + up.get("mongo/journaled", 0)
    assert up["mongo/inserted"] == 40
    assert mongo.products.count_documents({}) == 40
    assert mongo.rejects.count_documents({}) == 1


def _book_record(database: str, seen: float) -> dict[str, Any]:
    """A journal record of one item of a collection of its own, as nodes write them."""
    return {
        "db": database,
        "kind": "item",
        "collection": "books",
        "type": "BookItem",
        "id": "isbn-1",
        "doc": {"title": "Dune"},
        "hash": "h",
        "seen": seen,
        "crawl_id": "c",
    }


def test_a_journal_left_by_an_older_node_replays_its_products_into_products(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    journal, seen, product = tmp_path / "journal", time.time(), make_product(1)
    # A record as nodes wrote them before records named their collection.
    old = {
        "db": mongo.name,
        "kind": "product",
        "id": product.canonical_url,
        "doc": {**product.content(), "url": product.url, "rendered": product.rendered},
        "hash": product.content_hash(),
        "seen": seen,
        "crawl_id": "old-crawl",
    }
    item = _book_record(mongo.name, seen)
    malformed = [
        {**item, "collection": "system.books"},  # a collection MongoDB refuses
        {**item, "collection": None},  # an item record names its collection
        {**item, "kind": "product", "collection": "a$b"},
    ]  # fmt: skip
    written = Journal(journal, database=mongo.name)
    written.open()
    written.append([old, item, *malformed])
    written.close()

    async def replay() -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, journal)
        await store.open()
        await store.close()
        return stats.get_stats()

    stats = asyncio.run(replay())
    assert journal_backlog(journal) == 0
    stored = mongo.products.find_one({"_id": product.canonical_url})
    assert stored is not None
    assert (stored["crawl_id"], stored["price"], stored["url"]) == (
        "old-crawl",
        "19.99",
        product.url,
    )
    book = mongo.books.find_one({"_id": "isbn-1"})
    assert book is not None
    assert (book["title"], book["content_hash"], book["crawl_id"]) == ("Dune", "h", "c")
    assert (stats["mongo/replayed"], stats["mongo/journal_malformed"]) == (2, 3)
    assert (stats["mongo/products/inserted"], stats["mongo/books/inserted"]) == (1, 1)


def test_records_of_one_millisecond_are_applied_in_submission_order(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    moment = int(time.time()) + 0.0001  # + 0.0002 is the same millisecond

    async def run(saves: list[tuple[str, float]]) -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, tmp_path / "j")
        await store.open()
        await asyncio.gather(
            *(store.save_product(make_product(1, price=p), seen=s) for p, s in saves)
        )
        await store.close()
        return stats.get_stats()

    first = asyncio.run(run([("1.00", moment), ("2.00", moment + 0.0002)]))
    assert (first["mongo/inserted"], first["mongo/updated"]) == (1, 1)
    assert "mongo/stale" not in first
    (doc,) = mongo.products.find()
    assert doc["price"] == "2.00", "the later of one millisecond wins"

    second = asyncio.run(run([("3.00", moment), ("4.00", moment + 1), ("5.00", moment + 1.0002)]))
    assert (second["mongo/stale"], second["mongo/updated"]) == (1, 2), "the stored ms: stale"
    (doc,) = mongo.products.find()
    assert (doc["price"], doc["content_hash"]) == (
        "5.00",
        make_product(1, price="5.00").content_hash(),
    )


def test_a_content_update_keeps_the_earliest_first_seen(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    now = time.time()
    placer = ItemPlacer(MongoConfig.from_settings(Settings({"MONGO_DATABASE": mongo.name})), "shop")

    async def run(saves: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, tmp_path / "j")
        await store.open()
        await asyncio.gather(*(store.save_item(placer.place(item), seen=s) for item, s in saves))
        await store.close()
        return stats.get_stats()

    run_first = [({"url": "http://shop.test/1", "a": 1, "b": 2}, now - 100)]
    asyncio.run(run(run_first))
    stats = asyncio.run(
        run([
            ({"url": "http://shop.test/1", "a": 0}, now - 200),  # a late replay: stale
            ({"url": "http://shop.test/1", "a": 3}, now),
        ])
    )  # fmt: skip
    assert (stats["mongo/stale"], stats["mongo/updated"]) == (1, 1)
    doc = mongo.shop.find_one({"_id": "http://shop.test/1"})
    assert doc is not None
    assert (doc["a"], "b" in doc) == (3, False), "the content is replaced"
    assert doc["first_seen"].replace(tzinfo=UTC).timestamp() == pytest.approx(now - 200, abs=0.002)
    assert doc["last_seen"].replace(tzinfo=UTC).timestamp() == pytest.approx(now, abs=0.002)


@pytest.mark.parametrize(
    "seen", [1e300, -1e300, float("inf"), float("-inf"), float("nan"), 10**30, True, "1"]
)
def test_a_journal_record_seen_at_no_storable_time_is_dropped(
    services: ServicesConfig,
    mongo: Database[Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    seen: object,
) -> None:
    journal, product = tmp_path / "journal", make_product(1)
    good = _book_record(mongo.name, time.time())
    bad_product = {
        "db": mongo.name,
        "kind": "product",
        "collection": "products",
        "id": product.canonical_url,
        "doc": {**product.content(), "url": product.url, "rendered": product.rendered},
        "hash": product.content_hash(),
        "seen": seen,
        "crawl_id": "c",
    }
    bad_reject = {"db": mongo.name, "kind": "reject", "id": "c|x", "doc": {}, "seen": seen}
    written = Journal(journal, database=mongo.name)
    written.open()
    written.append([bad_product, {**good, "id": "isbn-2", "seen": seen}, bad_reject, good])
    written.close()

    async def replay() -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, journal)
        await store.open()
        await store.close()
        return stats.get_stats()

    with caplog.at_level(logging.ERROR, logger="project.storage.store"):
        stats = asyncio.run(replay())
    assert journal_backlog(journal) == 0, "the replay finished"
    assert (stats["mongo/journal_malformed"], stats["mongo/replayed"]) == (3, 1)
    assert "dropping 3 malformed records" in caplog.text
    assert [d["_id"] for d in mongo.books.find()] == ["isbn-1"]
    assert mongo.products.count_documents({}) == 0
    assert mongo.rejects.count_documents({}) == 0
