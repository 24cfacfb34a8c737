"""Every item type through ValidationPipeline and MongoPipeline into the suite's FerretDB.

Pipelines are built as Scrapy builds them (``get_crawler`` and ``build_from_crawler``) and run
on an asyncio loop, as the store's own tests do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import json
import logging
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import scrapy
from pydantic import BaseModel, field_validator
from scrapy import Spider
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from pipelines.mongo import MongoPipeline
from pipelines.validation import ValidationPipeline
from project.items import ProductItem
from project.ops.services import free_port
from project.schema import Product
from project.storage.errors import ItemRejectedError
from project.storage.journal import journal_backlog
from tests.hostile_values import HostileDict, HostileInt, HostileMapping
from tests.test_schema import VALID

if TYPE_CHECKING:
    from pathlib import Path

    from pymongo.database import Database
    from scrapy.crawler import Crawler

    from project.ops.services import ServicesConfig

# pymongo 4.20 leaks the socket of a monitor check that AsyncMongoClient.close() interrupts
# while it connects to a server that is down (the tests that journal against a dead port).
_SOCKET_LEAK = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


# -- item types of a made-up catalogue ---------------------------------------------------------


@dataclasses.dataclass
class BookItem:
    url: str | None
    title: Any = "Dune"
    price: Any = Decimal("9.99")
    tags: Any = dataclasses.field(default_factory=lambda: {"sf", "classic"})
    published: Any = datetime.date(1965, 8, 1)
    isbn: Any = "978-0441013593"


class ArticleItem(scrapy.Item):
    url = scrapy.Field()
    title = scrapy.Field()
    authors = scrapy.Field()


@attrs.define
class JobPosting:
    url: str
    title: str
    salary: tuple[int, int] = (50_000, 70_000)


class Review(BaseModel):
    url: str
    stars: int
    posted: datetime.datetime = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)


class BookModel(BaseModel):
    """A book that passed validation: a title, a positive price."""

    url: str
    title: str
    price: Decimal
    isbn: str | None = None

    @field_validator("title")
    @classmethod
    def _title(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("empty")
        return value.strip()

    @field_validator("price")
    @classmethod
    def _price(cls, value: Decimal) -> Decimal:
        if value <= 0:
            raise ValueError("must be > 0")
        return value


class CatalogSpider(Spider):
    name = "catalog"


class RejectsSpider(Spider):
    name = "rejects"  # its dicts would go to the rejects collection


class BooksSpider(Spider):
    name = "books"  # its dicts go to books, as BookItems do by default


@dataclasses.dataclass
class Pipelines:
    crawler: Crawler
    validation: ValidationPipeline | None
    mongo: MongoPipeline

    @property
    def stats(self) -> dict[str, Any]:
        assert self.crawler.stats is not None
        return self.crawler.stats.get_stats()

    async def run(self, items: list[Any]) -> list[Any]:
        """Open, put *items* through both pipelines at once, close; each item's outcome."""
        if self.validation is not None:
            await self.validation.open_spider()
        await self.mongo.open_spider()

        async def one(item: Any) -> Any:
            try:
                if self.validation is not None:
                    item = await self.validation.process_item(item)
                return await self.mongo.process_item(item)
            except DropItem as exc:
                return exc

        outcomes = await asyncio.gather(*(one(item) for item in items))
        await self.mongo.close_spider()
        if self.validation is not None:
            await self.validation.close_spider()
        return outcomes


def pipelines(
    uri: str, database: str, journal: Path, spider: type[Spider] = CatalogSpider, **settings: Any
) -> Pipelines:
    crawler = get_crawler(
        spider,
        {
            "MONGO_URI": uri,
            "MONGO_DATABASE": database,
            "MONGO_JOURNAL_DIR": str(journal),
            "MONGO_DRAIN_TIMEOUT": 0.5,
            "MONGO_FLUSH_INTERVAL": 0.2,
            "MONGO_SERVER_SELECTION_TIMEOUT": 1.0,
            "RUNS_CRAWL_ID": "unit",
            **settings,
        },
    )
    try:
        validation = build_from_crawler(ValidationPipeline, crawler)
    except NotConfigured:
        validation = None
    return Pipelines(crawler, validation, build_from_crawler(MongoPipeline, crawler))


def crawl(services: ServicesConfig, mongo: Database[Any], journal: Path, items: list[Any],
          **settings: Any) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
    run = pipelines(services.mongo_url, mongo.name, journal, **settings)
    outcomes = asyncio.run(run.run(items))
    return outcomes, run.stats


def catalogue(edition: int = 1) -> list[Any]:
    """One item of each type itemadapter supports; *edition* 2 changes the book."""
    return [
        BookItem("http://books.test/dune?ref=home", price=Decimal("9.99") * edition),
        ArticleItem(url="http://news.test/a/1", title="Launch", authors=["ann", "bo"]),
        JobPosting("http://jobs.test/j/1", "Engineer"),
        Review(url="http://reviews.test/r/1", stars=5),
        {"url": "http://shop.test/thing/1", "name": "thing", "weight": Decimal("1.5")},
    ]


def _without_times(doc: dict[str, Any]) -> dict[str, Any]:
    """The item's own fields and its crawl (the spider that stored it is checked once, below)."""
    skip = ("first_seen", "last_seen", "written_at", "content_hash", "source_spider")
    return {k: v for k, v in doc.items() if k not in skip}


# -- every type is stored, with change tracking ---------------------------------------------


def test_every_item_type_is_stored_once_in_its_collection_by_its_id(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    outcomes, first = crawl(services, mongo, tmp_path / "j", catalogue())
    assert not [o for o in outcomes if isinstance(o, Exception)]
    before = {c: {d["_id"]: d for d in mongo[c].find()} for c in mongo.list_collection_names()}
    time.sleep(0.01)
    _, second = crawl(services, mongo, tmp_path / "j", catalogue(edition=2))
    after = {c: {d["_id"]: d for d in mongo[c].find()} for c in mongo.list_collection_names()}

    assert set(after) == {"books", "articles", "job_postings", "reviews", "catalog", "rejects",
                          "products", "changes"}  # fmt: skip
    # the second crawl's rewritten items: each changed field is one change document
    changed = {(c["collection"], c["item_id"]) for c in after.pop("changes").values()}
    assert len(changed) == second["mongo/updated"]
    assert {c: list(docs) for c, docs in after.items() if docs} == {
        "books": ["http://books.test/dune?ref=home"],
        "articles": ["http://news.test/a/1"],
        "job_postings": ["http://jobs.test/j/1"],
        "reviews": ["http://reviews.test/r/1"],
        "catalog": ["http://shop.test/thing/1"],  # a plain dict: the spider's collection
    }
    assert _without_times(after["books"]["http://books.test/dune?ref=home"]) == {
        "_id": "http://books.test/dune?ref=home",
        "url": "http://books.test/dune?ref=home",
        "title": "Dune",
        "price": "19.98",  # Decimal as its text, as a product's price
        "tags": ["classic", "sf"],
        "published": "1965-08-01",
        "isbn": "978-0441013593",
        "crawl_id": "unit",
    }
    assert after["books"]["http://books.test/dune?ref=home"]["source_spider"] == "catalog"
    assert after["job_postings"]["http://jobs.test/j/1"]["salary"] == [50_000, 70_000]
    assert after["reviews"]["http://reviews.test/r/1"]["posted"] == "2024-05-01T12:00:00Z"
    assert after["articles"]["http://news.test/a/1"]["authors"] == ["ann", "bo"]

    assert (first["mongo/inserted"], first.get("mongo/updated"), first.get("mongo/unchanged")) == (
        5,
        None,
        None,
    )
    for collection in ("books", "articles", "job_postings", "reviews", "catalog"):
        assert first[f"mongo/{collection}/inserted"] == 1
    assert (second.get("mongo/inserted"), second["mongo/updated"], second["mongo/unchanged"]) == (
        None,
        1,
        4,
    )
    assert second["mongo/books/updated"] == 1
    assert second["mongo/catalog/unchanged"] == 1
    for collection, docs in after.items():
        for key, doc in docs.items():
            assert doc["first_seen"] == before[collection][key]["first_seen"]
            assert doc["last_seen"] > before[collection][key]["last_seen"]
            changed = collection == "books"
            assert (doc["content_hash"] != before[collection][key]["content_hash"]) == changed


def test_mongo_collections_and_mongo_id_fields_are_honoured(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    settings = {
        "MONGO_COLLECTIONS": {"BookItem": "library", "dict": "things",
                              "tests.test_pipelines_items.ArticleItem": "press"},
        "MONGO_ID_FIELDS": {"BookItem": ["isbn", "price"], "dict": "sku"},
    }  # fmt: skip
    items = [
        BookItem("http://books.test/1"),
        BookItem("http://books.test/other-url-same-book"),
        {"sku": 7, "name": "seven"},
        {"sku": "a|b", "name": "pipe"},
        ArticleItem(url="http://news.test/a/1", title="t"),
    ]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", items, **settings)
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert [d["_id"] for d in mongo.library.find()] == ["978-0441013593|9.99"]
    assert sorted(d["_id"] for d in mongo.things.find()) == ["7", "a|b"]
    assert [d["_id"] for d in mongo.press.find()] == ["http://news.test/a/1"]
    # One book under two URLs: one document, the later record's content (its url) written,
    # even in the millisecond of the first. Not a URL id: no overwrite warning.
    assert stats["mongo/library/inserted"] == stats["mongo/library/updated"] == 1
    assert [d["url"] for d in mongo.library.find()] == ["http://books.test/other-url-same-book"]
    assert "mongo/library/overwritten" not in stats
    assert "books" not in mongo.list_collection_names()


def test_an_identical_item_without_a_url_is_stored_once(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    items = [{"name": "x", "n": 1}, {"n": 1, "name": "x"}, {"name": "x", "n": 2}]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", items)
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert mongo.catalog.count_documents({}) == 2
    assert stats["mongo/id_from_content"] == 3
    assert (stats["mongo/inserted"], stats["mongo/unchanged"]) == (2, 1)
    for doc in mongo.catalog.find():
        assert doc["_id"] == doc["content_hash"]


def test_products_keep_todays_collection_id_and_shape(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    item = ProductItem(**{**VALID, "price": "1.234,56 €", "currency": None})
    outcomes, stats = crawl(services, mongo, tmp_path / "j", [item])
    assert type(outcomes[0]).__name__ == "Product"
    doc = mongo.products.find_one()
    assert doc is not None
    assert set(doc) == {
        "_id", "canonical_url", "name", "price", "currency", "sku", "availability",
        "description", "breadcrumb", "image_urls", "url", "rendered", "content_hash",
        "crawl_id", "first_seen", "last_seen", "written_at", "source_spider",
    }  # fmt: skip
    assert (doc["_id"], doc["price"], doc["currency"]) == (
        "http://shop.test/product/7",
        "1234.56",
        "EUR",  # filled from the price text
    )
    assert stats["mongo/products/inserted"] == stats["mongo/inserted"] == 1


def test_an_item_whose_url_is_not_an_absolute_http_url_is_named_by_its_content(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    items = [
        {"url": "/book/1", "title": "one"},
        {"url": "/book/1", "title": "two"},
        {"url": "n/a", "title": "three"},
        {"url": "mailto:shop@books.test", "title": "four"},
        {"url": "http://books.test/5", "title": "five"},
    ]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", items)
    assert outcomes == items
    docs = {d["title"]: d for d in mongo.catalog.find()}
    assert set(docs) == {"one", "two", "three", "four", "five"}, "none overwrote another"
    for title in ("one", "two", "three", "four"):
        assert docs[title]["_id"] == docs[title]["content_hash"]
    assert docs["five"]["_id"] == "http://books.test/5"
    assert stats["mongo/id_from_content"] == 4
    assert stats["mongo/catalog/inserted"] == 5


def test_items_of_one_page_sharing_a_url_id_are_a_warning_and_a_count(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page, other = "http://shop.test/list?page=1", "http://shop.test/list?page=2"
    items: list[Any] = [
        *({"url": page, "name": f"thing {n}"} for n in range(3)),
        *({"url": other, "name": f"thing {n}"} for n in range(3)),
        *(BookItem(page, title=f"book {n}") for n in range(2)),
        {"url": "http://shop.test/same", "name": "same"},
        {"url": "http://shop.test/same", "name": "same"},  # identical: nothing lost
    ]
    with caplog.at_level(logging.WARNING, logger="project.storage.writes"):
        outcomes, stats = crawl(services, mongo, tmp_path / "j", items, MONGO_BATCH_SIZE=3)
    assert not [o for o in outcomes if isinstance(o, Exception)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, "one per item type and collection, not one per batch or id"
    assert warnings[0].startswith(
        "3 different dict items share _id http://shop.test/list?page=1: they overwrite each"
        " other; set MONGO_ID_FIELDS"
    ), warnings
    assert warnings[1].startswith("2 different BookItem items share _id " + page), warnings
    assert stats["mongo/catalog/overwritten"] == 4
    assert stats["mongo/books/overwritten"] == 1
    assert mongo.catalog.find_one({"_id": page})["name"] == "thing 2", "the last one seen"
    assert mongo.books.find_one({"_id": page})["title"] == "book 1"


def test_a_second_item_type_defaulting_to_a_collection_is_refused(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = pipelines(services.mongo_url, mongo.name, tmp_path / "j", spider=BooksSpider)
    items = [
        {"url": "http://books.test/1", "title": "a dict"},
        BookItem("http://books.test/1"),
        BookItem("http://books.test/2"),
        ProductItem(**VALID),
    ]
    with caplog.at_level(logging.ERROR, logger="pipelines.mongo"):
        outcomes = asyncio.run(run.run(items))
    assert outcomes[0] == items[0]
    for outcome in outcomes[1:3]:
        assert isinstance(outcome, DropItem)
        assert "MONGO_COLLECTIONS" in str(outcome)
    assert type(outcomes[3]).__name__ == "Product", "products are unaffected"
    assert [d["title"] for d in mongo.books.find()] == ["a dict"], "the book did not overwrite it"
    assert mongo.products.count_documents({}) == 1
    assert run.stats["mongo/unplaceable/collection_shared"] == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "BookItem (collection_shared)" in errors[0]
    assert "MONGO_COLLECTIONS" in errors[0]
    rejects = {d["_id"] for d in mongo.rejects.find()}
    assert rejects == {"unit|BookItem|http://books.test/1", "unit|BookItem|http://books.test/2"}


def test_a_content_update_replaces_the_content(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    first = {"url": "http://shop.test/1", "name": "thing", "sale": "-10%", "sizes": [1, 2]}
    crawl(services, mongo, tmp_path / "j", [first, {"url": "http://shop.test/2", "n": 1}])
    before = mongo.catalog.find_one({"_id": "http://shop.test/1"})
    time.sleep(0.01)
    second = {"url": "http://shop.test/1", "name": "thing", "sizes": [2]}
    _, stats = crawl(
        services, mongo, tmp_path / "j", [second, {"url": "http://shop.test/2", "n": 1}]
    )
    after = mongo.catalog.find_one({"_id": "http://shop.test/1"})
    assert stats["mongo/catalog/updated"] == stats["mongo/catalog/unchanged"] == 1
    assert before is not None
    assert after is not None
    assert _without_times(after) == {
        "_id": "http://shop.test/1",
        "url": "http://shop.test/1",
        "name": "thing",
        "sizes": [2],
        "crawl_id": "unit",
    }, "a field the item no longer has is gone"
    assert after["first_seen"] == before["first_seen"]
    assert after["last_seen"] > before["last_seen"]


def test_an_empty_field_name_is_stored_as_an_underscore_and_updated(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    _, first = crawl(services, mongo, tmp_path / "j", [{"url": "http://shop.test/1", "": 1}])
    time.sleep(0.01)
    outcomes, second = crawl(
        services, mongo, tmp_path / "j", [{"url": "http://shop.test/1", "\x00": 2}]
    )
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert first["mongo/escaped_keys"] == 1
    assert second["mongo/updated"] == 1
    doc = mongo.catalog.find_one({"_id": "http://shop.test/1"})
    assert doc is not None
    assert (doc["_"], "" in doc) == (2, False)


class Chapter(BaseModel):
    url: str
    next: Chapter | None = None


def test_an_item_whose_own_code_raises_is_a_reject_not_a_crash(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    looped = Chapter(url="http://books.test/loop")
    looped.next = looped
    hostile = [
        looped,
        {"url": "http://shop.test/int", "n": HostileInt(3)},
        {"url": "http://shop.test/mapping", "m": HostileMapping()},
        {"url": "http://shop.test/dict", "d": HostileDict(a=1)},
        HostileMapping(),  # not an item at all
    ]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", [*hostile, {"url": "http://a.test/"}])
    assert outcomes[5] == {"url": "http://a.test/"}
    for outcome in outcomes[:5]:
        assert isinstance(outcome, DropItem), outcome
    assert all(isinstance(o, ItemRejectedError) for o in outcomes[:4])
    rejects = {d["item_type"]: d for d in mongo.rejects.find()}
    assert set(rejects) == {"Chapter", "dict", "HostileMapping"}
    assert rejects["Chapter"]["reasons"]["document"][0].startswith(
        "Chapter cannot be serialised: ValueError: Circular reference"
    )
    assert rejects["Chapter"]["url"] == "http://books.test/loop"
    assert stats["mongo/rejected/DocumentError"] == 4
    dicts = mongo.rejects.find({"item_type": "dict"})
    assert sorted(d["reasons"]["document"][0] for d in dicts) == [
        "d: reading it raised RuntimeError: no items for you",
        "m: reading it raised RuntimeError: no items for you",
        "n: reading it raised RuntimeError: no int for you",
    ]
    assert rejects["HostileMapping"]["item"] == {"item": "<HostileMapping>"}
    shown = mongo.rejects.find_one({"_id": "unit|dict|http://shop.test/dict"})
    assert shown is not None
    assert shown["item"] == {"url": "http://shop.test/dict", "d": "<HostileDict>"}
    assert stats["mongo/unplaceable/not_an_item"] == 1
    assert [d["_id"] for d in mongo.catalog.find()] == ["http://a.test/"]


# -- what cannot be stored costs only itself ------------------------------------------------


def test_an_unplaceable_item_is_an_error_a_count_a_reject_and_a_drop(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    items = [
        BookItem("http://books.test/1", isbn=None),
        BookItem("http://books.test/2", isbn=["not", "scalar"]),
        BookItem("http://books.test/3", isbn=""),
        BookItem("http://books.test/4", isbn=None),
        BookItem("http://books.test/5"),
        {"url": "http://shop.test/1", "crawl_id": "mine"},
    ]
    with caplog.at_level(logging.ERROR, logger="pipelines.mongo"):
        outcomes, stats = crawl(
            services, mongo, tmp_path / "j", items, MONGO_ID_FIELDS={"BookItem": "isbn"}
        )
    dropped = [o for o in outcomes if isinstance(o, DropItem)]
    assert len(dropped) == 5
    assert (
        str(outcomes[0])
        == "cannot store BookItem: its id field 'isbn' (MONGO_ID_FIELDS) is missing"
    )
    assert isinstance(outcomes[4], BookItem)
    assert stats["mongo/unplaceable"] == 5
    assert stats["mongo/unplaceable/id_missing"] == 2
    assert stats["mongo/unplaceable/id_not_scalar"] == 1
    assert stats["mongo/unplaceable/id_empty"] == 1
    assert stats["mongo/unplaceable/reserved_field"] == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 4, "one ERROR per type and reason, not one per item"
    assert any("BookItem (id_missing)" in e and "'isbn'" in e for e in errors), errors
    rejects = {d["_id"]: d for d in mongo.rejects.find()}
    assert set(rejects) == {
        *(f"unit|BookItem|http://books.test/{n}" for n in range(1, 5)),
        "unit|dict|http://shop.test/1",
    }
    reject = rejects["unit|BookItem|http://books.test/2"]
    assert reject["reasons"] == {
        "placement": ["its id field 'isbn' (MONGO_ID_FIELDS) is a list, not text or a number"]
    }
    assert (reject["item_type"], reject["item"]["isbn"], reject["url"]) == (
        "BookItem",
        ["not", "scalar"],
        "http://books.test/2",
    )
    assert mongo.books.count_documents({}) == 1


def test_an_item_for_a_reserved_collection_is_unplaceable(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    run = pipelines(services.mongo_url, mongo.name, tmp_path / "j", spider=RejectsSpider)
    outcomes = asyncio.run(run.run([{"name": "no url"}]))
    assert isinstance(outcomes[0], DropItem)
    assert "is the rejects collection" in str(outcomes[0])
    assert run.stats["mongo/unplaceable/collection_reserved"] == 1
    (reject,) = mongo.rejects.find()
    assert reject["_id"].startswith("unit|dict|sha256:"), "no URL: named by its content"
    assert reject["item"] == {"name": "no url"}


def _deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"d": value}
    return value


def test_a_value_mongodb_cannot_take_rejects_only_its_item(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    good = [{"url": f"http://shop.test/{n}", "n": n} for n in range(5)]
    bad = [
        {"url": "http://shop.test/object", "o": object()},
        {"url": "http://shop.test/large", "text": "x" * 17_000_000},
        {"url": "http://shop.test/big-int", "n": 2**70},
        {"url": "http://shop.test/surrogate", "name": "bad \ud800 name"},
        {"url": "http://shop.test/nested-arrays", "grid": [[1, 2], [3, 4]]},  # FerretDB 1.24
        {"url": "http://shop.test/too-deep", "deep": _deep(50_000)},
    ]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", good + bad)
    assert outcomes[:5] == good
    for outcome in outcomes[5:]:
        assert isinstance(outcome, ItemRejectedError), outcome
        assert "stored in rejects instead" in str(outcome)
    assert sorted(d["n"] for d in mongo.catalog.find()) == list(range(5))
    rejects = {d["_id"].rsplit("/", 1)[1]: d for d in mongo.rejects.find()}
    assert set(rejects) == {"object", "large", "big-int", "surrogate", "nested-arrays", "too-deep"}
    reasons = {key: doc["reasons"]["document"][0] for key, doc in rejects.items()}
    assert reasons["object"] == "o: cannot store a value of type object"
    assert reasons["large"].startswith("DocumentTooLarge: ")
    assert reasons["big-int"] == "n: an integer of 71 bits; BSON stores at most 64"
    assert reasons["surrogate"].startswith("UnicodeEncodeError: ")
    assert "nested arrays are not supported" in reasons["nested-arrays"]
    assert reasons["too-deep"].startswith("deep.d.d.")
    assert reasons["too-deep"].endswith("nested deeper than 100 levels")
    assert len(rejects["large"]["item"]["text"]) < 2100, "a bounded copy"
    assert all(doc["item_type"] == "dict" for doc in rejects.values())
    assert stats["mongo/rejected"] == 6
    assert stats["mongo/rejected/DocumentError"] == 3
    assert stats["mongo/inserted"] == stats["mongo/catalog/inserted"] == 5


def test_hostile_keys_huge_and_deep_values_are_stored_safely(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    hostile = {
        "url": "http://shop.test/hostile",
        "$where": "sleep(1000)",
        "a.b": {"c.d": 1, "$gt": ""},
        "nul\x00key": "x",
        "text": "y" * 1_000_000,
        "deep": _deep(90),
        "many": list(range(100_000)),
    }
    outcomes, stats = crawl(services, mongo, tmp_path / "j", [hostile])
    assert outcomes == [hostile]
    doc = mongo.catalog.find_one({"_id": "http://shop.test/hostile"})
    assert doc is not None
    assert doc["\uff04where"] == "sleep(1000)"
    assert doc["a\uff0eb"] == {"c\uff0ed": 1, "\uff04gt": ""}
    assert doc["nulkey"] == "x"
    assert len(doc["text"]) == 1_000_000
    assert len(doc["many"]) == 100_000
    assert stats["mongo/escaped_keys"] == 5
    assert mongo.catalog.count_documents({"sleep": {"$exists": True}}) == 0


# -- the journal -------------------------------------------------------------------------------


@_SOCKET_LEAK
def test_a_journaled_item_of_any_type_is_replayed_once_mongodb_is_back(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    dead = f"mongodb://127.0.0.1:{free_port()}"
    down = pipelines(dead, mongo.name, journal)
    outcomes = asyncio.run(down.run([*catalogue(), {"url": "http://shop.test/bad", "o": object()}]))
    gc.collect()
    assert not any(isinstance(o, Exception) for o in outcomes[:5]), "journaled: durable"
    assert isinstance(outcomes[5], ItemRejectedError)
    assert down.stats["mongo/journaled"] == 6  # five items and a reject
    assert journal_backlog(journal) == 6

    up = pipelines(services.mongo_url, mongo.name, journal)
    asyncio.run(up.run([]))
    assert journal_backlog(journal) == 0
    assert up.stats["mongo/replayed"] == 6
    assert up.stats["mongo/inserted"] == 5
    for collection, key in [
        ("books", "http://books.test/dune?ref=home"),
        ("articles", "http://news.test/a/1"),
        ("job_postings", "http://jobs.test/j/1"),
        ("reviews", "http://reviews.test/r/1"),
        ("catalog", "http://shop.test/thing/1"),
    ]:
        doc = mongo[collection].find_one({"_id": key})
        assert doc is not None, collection
        assert doc["crawl_id"] == "unit"
        assert up.stats[f"mongo/{collection}/inserted"] == 1
    assert mongo.rejects.count_documents({"_id": "unit|dict|http://shop.test/bad"}) == 1


class BookProduct(Product):
    """Books validated into the product schema, stored in their own collection."""


@_SOCKET_LEAK
def test_a_product_stored_outside_products_is_journaled_as_an_item(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    settings = {
        "VALIDATION_MODELS": {"dict": "tests.test_pipelines_items.BookProduct"},
        "MONGO_COLLECTIONS": {"dict": "library"},
    }
    down = pipelines(f"mongodb://127.0.0.1:{free_port()}", mongo.name, journal, **settings)
    outcomes = asyncio.run(down.run([dict(VALID), ProductItem(**VALID)]))
    gc.collect()
    assert [type(o).__name__ for o in outcomes] == ["BookProduct", "Product"]
    records = [json.loads(line) for segment in sorted(journal.rglob("*.jsonl"))
               for line in segment.read_text().splitlines()]  # fmt: skip
    assert sorted((r["kind"], r["collection"]) for r in records) == [
        ("item", "library"),
        ("product", "products"),
    ], "a node of the previous version replays only product records into products"

    up = pipelines(services.mongo_url, mongo.name, journal, **settings)
    asyncio.run(up.run([]))
    assert up.stats["mongo/replayed"] == 2
    assert mongo.library.count_documents({"_id": "http://shop.test/product/7"}) == 1
    assert mongo.products.count_documents({"_id": "http://shop.test/product/7"}) == 1


# -- validation of any type --------------------------------------------------------------------

_BOOKS = {"BookItem": "tests.test_pipelines_items.BookModel"}


def test_validation_models_validate_any_item_type(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    items = [
        BookItem("http://books.test/ok", title="  Dune "),
        BookItem("http://books.test/no-title", title=" "),
        BookItem("http://books.test/free", title="", price=Decimal(0)),
        BookItem(None, title=None),
        ArticleItem(url="http://news.test/a/1", title="not validated"),
        ProductItem(**VALID),
    ]
    outcomes, stats = crawl(services, mongo, tmp_path / "j", items, VALIDATION_MODELS=_BOOKS)
    assert isinstance(outcomes[0], BookModel), "the model instance goes on"
    assert [type(o) for o in outcomes[1:4]] == [DropItem] * 3
    assert (
        str(outcomes[1])
        == "invalid BookItem http://books.test/no-title (title: Value error, empty)"
    )
    assert isinstance(outcomes[4], ArticleItem)
    assert type(outcomes[5]).__name__ == "Product"

    # Stored in the collection of the type it came from, as the model writes it.
    (book,) = mongo.books.find()
    assert _without_times(book) == {
        "_id": "http://books.test/ok",
        "url": "http://books.test/ok",
        "title": "Dune",
        "price": "9.99",
        "isbn": "978-0441013593",
        "crawl_id": "unit",
    }
    assert "book_models" not in mongo.list_collection_names()
    assert mongo.products.count_documents({}) == 1
    assert stats["validation/passed"] == 2
    assert stats["validation/dropped"] == stats["validation/dropped/BookItem"] == 3
    assert stats["validation/errors/title"] == 3
    assert stats["validation/errors/price"] == 1
    assert stats["validation/errors/url"] == 1
    rejects = {d["_id"]: d for d in mongo.rejects.find()}
    free = rejects["unit|BookItem|http://books.test/free"]
    assert free["reasons"] == {
        "title": ["Value error, empty"],
        "price": ["Value error, must be > 0"],
    }
    assert (free["item_type"], free["item"]["price"], free["crawl_id"]) == ("BookItem", "0", "unit")
    (nameless,) = [d for key, d in rejects.items() if "sha256:" in key]
    assert nameless["url"] == ""
    assert set(nameless["reasons"]) == {"url", "title"}


def test_with_validation_off_mongopipeline_validates_mapped_types_itself(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    items = [BookItem("http://books.test/ok"), BookItem("http://books.test/bad", title=" ")]
    outcomes, stats = crawl(
        services, mongo, tmp_path / "j", items, VALIDATION_MODELS=_BOOKS, VALIDATION_ENABLED=False
    )
    assert isinstance(outcomes[0], BookModel)
    assert isinstance(outcomes[1], DropItem)
    assert str(outcomes[1]) == "invalid BookItem http://books.test/bad (title)"
    assert [d["_id"] for d in mongo.books.find()] == ["http://books.test/ok"]
    assert mongo.rejects.count_documents({}) == 0, "as for products: no reject record"
    assert "validation/dropped" not in stats


def test_a_pydantic_item_mapped_to_its_own_model_is_validated_once(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    calls: list[str] = []

    class CountedReview(Review):
        @field_validator("stars")
        @classmethod
        def _count(cls, value: int) -> int:
            calls.append("validated")
            return value

    globals()["CountedReview"] = CountedReview  # importable by its dotted path
    try:
        outcomes, _ = crawl(
            services,
            mongo,
            tmp_path / "j",
            [CountedReview(url="http://reviews.test/1", stars=4)],
            VALIDATION_MODELS={"CountedReview": "tests.test_pipelines_items.CountedReview"},
        )
    finally:
        del globals()["CountedReview"]
    assert isinstance(outcomes[0], CountedReview)
    assert len(calls) == 2, "once when built, once by ValidationPipeline; not by MongoPipeline"
    assert mongo.counted_reviews.count_documents({}) == 1


def test_an_item_too_deep_to_validate_is_a_reject_not_a_crash(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    deep = {"url": "http://books.test/deep", "title": "t", "price": "1", "extra": _deep(50_000)}
    outcomes, stats = crawl(
        services,
        mongo,
        tmp_path / "j",
        [deep, {"url": "http://books.test/ok", "title": "t", "price": "2"}],
        VALIDATION_MODELS={"dict": "tests.test_pipelines_items.BookModel"},
    )
    assert isinstance(outcomes[0], DropItem)
    assert isinstance(outcomes[1], BookModel)
    assert stats["validation/dropped/dict"] == 1
    reject = mongo.rejects.find_one({"_id": "unit|dict|http://books.test/deep"})
    assert reject is not None
    assert reject["reasons"] == {"__root__": ["nested too deeply to validate"]}
    assert "<too deep>" in str(reject["item"]["extra"]), "a bounded copy"
    assert [d["_id"] for d in mongo.catalog.find()] == ["http://books.test/ok"]
