"""Validation and MongoDB pipelines: schema, journal, store, and real crawls through an outage.

Crawls run as real processes (``python -m tests.test_pipelines CONFIG``, see ``_crawl_main``):
a Twisted reactor runs once per process, and two tests kill or outlive MongoDB mid-crawl.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from pipelines.validation import ValidationConfig, ValidationPipeline
from project.items import ProductItem
from project.ops.services import ensure_ferretdb, free_port
from project.schema import Availability, Product, field_errors
from project.storage.journal import Journal, journal_backlog
from project.storage.store import DEFAULTS, MongoConfig, MongoStore
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

ROOT = Path(__file__).resolve().parent.parent


# --- a FerretDB we can stop and restart on the same port and data ----------------------------


class FerretDB:
    """A private FerretDB (SQLite backend) on a fixed port; ``stop``/``start`` keep its data."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.uri = f"mongodb://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> FerretDB:
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        with (self.directory / "ferretdb.log").open("ab") as log:
            self._process = subprocess.Popen(
                [
                    str(ensure_ferretdb()),
                    f"--listen-addr=127.0.0.1:{self.port}",
                    "--handler=sqlite",
                    f"--sqlite-url=file:{self.directory / 'data'}/",
                    f"--state-dir={self.directory}",
                    "--telemetry=disable",
                    "--log-level=error",
                    "--debug-addr=-",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while True:
            try:
                with self.client(timeout_ms=500) as client:
                    client.admin.command("ping")
                return self
            except pymongo.errors.PyMongoError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        "FerretDB did not start, see %s" % (self.directory / "ferretdb.log")
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def client(self, timeout_ms: int = 5000) -> pymongo.MongoClient[dict[str, Any]]:
        return pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=timeout_ms, tz_aware=True)


@pytest.fixture(scope="module")
def ferretdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FerretDB]:
    server = FerretDB(tmp_path_factory.mktemp("ferretdb")).start()
    yield server
    server.stop()


@pytest.fixture
def own_ferretdb(tmp_path: Path) -> Iterator[FerretDB]:
    """A FerretDB of the test's own, for tests that stop it."""
    server = FerretDB(tmp_path / "ferretdb")
    yield server
    server.stop()


@pytest.fixture
def database(ferretdb: FerretDB) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with ferretdb.client() as client:
        client.drop_database(name)


# --- the spider and how crawls run ------------------------------------------------------------


class ShopSpider(Spider):
    """Walks the test shop: categories, their paginated listings, product pages."""

    name = "shop"

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start_url

    async def start(self) -> AsyncIterator[Request]:
        if self.start_url:  # no start URL: a run that only replays the journal
            yield Request(self.start_url)

    def parse(self, response: Response) -> Iterator[Request]:
        for href in response.css("a.category-link::attr(href)").getall():
            yield response.follow(href, self.parse_listing)

    def parse_listing(self, response: Response) -> Iterator[Request]:
        for href in response.css("a.product-link::attr(href)").getall():
            yield response.follow(href, self.parse_product)
        if next_page := response.css("a.next::attr(href)").get():
            yield response.follow(next_page, self.parse_listing)

    def parse_product(self, response: Response) -> Iterator[ProductItem]:
        canonical = response.css("link[rel=canonical]::attr(href)").get()
        yield ProductItem(
            url=response.url,
            canonical_url=response.urljoin(canonical) if canonical else None,
            name=response.css(".product-name::text").get(),
            price=response.css(".price::text").get(),
            currency=response.css(".price::attr(data-currency)").get(),
            sku=response.css(".sku::text").get(),
            availability=response.css(".availability::text").get(),
            description=response.css(".description::text").get(),
            breadcrumb=response.css("ol.breadcrumb li a::text").getall(),
            image_urls=response.css("img.product-image::attr(src)").getall(),
        )


def crawl_settings(uri: str, database: str, journal: Path, **extra: Any) -> dict[str, Any]:
    return {
        "ITEM_PIPELINES": {
            "pipelines.validation.ValidationPipeline": 100,
            "pipelines.mongo.MongoPipeline": 300,
        },
        "MONGO_URI": uri,
        "MONGO_DATABASE": database,
        "MONGO_JOURNAL_DIR": str(journal),
        "MONGO_FLUSH_INTERVAL": 0.3,
        "MONGO_RETRY_MAX_DELAY": 2.0,
        "MONGO_SERVER_SELECTION_TIMEOUT": 2.0,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **extra,
    }


class Crawl:
    """A crawl running as its own process; ``stats()`` once it finished."""

    def __init__(self, directory: Path, settings: dict[str, Any], start_url: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "crawl.log"
        self.stats_path = directory / "stats.json"
        config = directory / "crawl.json"
        settings = {**settings, "LOG_FILE": str(self.log_path)}
        config.write_text(
            json.dumps(
                {"settings": settings, "start_url": start_url, "stats": str(self.stats_path)}
            )
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with (directory / "stderr.log").open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.test_pipelines", str(config)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def wait(self, timeout: float = 60) -> dict[str, Any]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        stderr = (self.log_path.parent / "stderr.log").read_text(errors="replace")
        assert code == 0, f"crawl exited with {code}:\n{self.log()[-3000:]}\n{stderr[-3000:]}"
        stats: dict[str, Any] = json.loads(self.stats_path.read_text())
        return stats

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def crawls() -> Iterator[list[Crawl]]:
    started: list[Crawl] = []
    yield started
    for crawl in started:
        crawl.kill()


def _crawl_main(config_path: str) -> None:
    from scrapy.crawler import CrawlerProcess

    config = json.loads(Path(config_path).read_text())
    process = CrawlerProcess(config["settings"])
    crawler = process.create_crawler(ShopSpider)
    process.crawl(crawler, start_url=config["start_url"])
    process.start()
    assert crawler.stats is not None
    Path(config["stats"]).write_text(json.dumps(crawler.stats.get_stats(), default=str))


def product_id(url: str) -> int:
    return int(url.split("?")[0].rstrip("/").rsplit("/", 1)[1])


# --- configuration ----------------------------------------------------------------------------


def test_config_defaults() -> None:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    config = MongoConfig.from_settings(Settings(), spider_name="shop", started=started)
    assert config == MongoConfig(
        uri="mongodb://127.0.0.1:27017",
        database="fleetcrawl",
        products_collection="products",
        rejects_collection="rejects",
        failures_collection="failures",
        batch_size=100,
        flush_interval=1.0,
        journal_dir=Path(".state/journal/shop"),
        retry_max_delay=30.0,
        server_selection_timeout=3.0,
        socket_timeout=30.0,
        crawl_id="shop-20260102T030405Z",
    )
    assert ValidationConfig.from_settings(Settings()) == ValidationConfig(
        enabled=True, store_rejects=True
    )


def test_config_reads_settings() -> None:
    settings = Settings(
        {
            "MONGO_URI": "mongodb://u:p@db:27018/?replicaSet=rs",
            "MONGO_DATABASE": "shop",
            "MONGO_BATCH_SIZE": "25",
            "MONGO_FLUSH_INTERVAL": "0.5",
            "MONGO_JOURNAL_DIR": "/var/j/{spider}",
            "CRAWL_ID": "nightly-7",
        }
    )
    config = MongoConfig.from_settings(settings, spider_name="books")
    assert (config.uri, config.database, config.batch_size, config.flush_interval) == (
        "mongodb://u:p@db:27018/?replicaSet=rs",
        "shop",
        25,
        0.5,
    )
    assert config.journal_dir == Path("/var/j/books")
    assert config.crawl_id == "nightly-7"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MONGO_URI", "http://127.0.0.1:27017"),
        ("MONGO_URI", ""),
        ("MONGO_DATABASE", ""),
        ("MONGO_BATCH_SIZE", 0),
        ("MONGO_BATCH_SIZE", "many"),
        ("MONGO_FLUSH_INTERVAL", 0),
        ("MONGO_RETRY_MAX_DELAY", "soon"),
        ("MONGO_JOURNAL_DIR", ""),
    ],
)
def test_config_rejects_unusable_values(name: str, value: object) -> None:
    with pytest.raises(NotConfigured, match=name):
        MongoConfig.from_settings(Settings({name: value}))


def test_every_setting_has_a_default() -> None:
    assert set(DEFAULTS) >= {
        "MONGO_URI", "MONGO_DATABASE", "MONGO_PRODUCTS_COLLECTION", "MONGO_REJECTS_COLLECTION",
        "MONGO_FAILURES_COLLECTION", "MONGO_BATCH_SIZE", "MONGO_FLUSH_INTERVAL", "MONGO_JOURNAL_DIR",
        "MONGO_RETRY_MAX_DELAY", "CRAWL_ID", "VALIDATION_ENABLED",
    }  # fmt: skip


def test_validation_pipeline_can_be_switched_off() -> None:
    crawler = get_crawler(Spider, {"VALIDATION_ENABLED": False})
    with pytest.raises(NotConfigured):
        ValidationPipeline.from_crawler(crawler)


# --- schema -----------------------------------------------------------------------------------

_VALID = {
    "url": "http://shop.test/product/7?utm_source=x",
    "canonical_url": "http://shop.test/product/7",
    "name": "  Sturdy   Oak Chair ",
    "price": "19.99",
    "currency": "eur",
    "sku": " SKU-000007 ",
    "availability": "in stock",
    "description": " Built to last. ",
    "breadcrumb": ["Home", " Garden Tools "],
    "image_urls": ["/img/7-1.jpg", "/img/7-1.jpg", "https://cdn.test/7-2.jpg"],
}


def test_product_normalises_fields() -> None:
    product = Product.model_validate(_VALID)
    assert product.name == "Sturdy Oak Chair"
    assert product.price == Decimal("19.99")
    assert product.currency == "EUR"
    assert product.sku == "SKU-000007"
    assert product.availability is Availability.IN_STOCK
    assert product.description == "Built to last."
    assert product.breadcrumb == ["Home", "Garden Tools"]
    assert product.image_urls == ["http://shop.test/img/7-1.jpg", "https://cdn.test/7-2.jpg"]


def test_content_hash_ignores_how_the_page_was_fetched() -> None:
    one = Product.model_validate(_VALID)
    other = Product.model_validate(
        {**_VALID, "url": "http://shop.test/product/7#reviews", "rendered": True}
    )
    changed = Product.model_validate({**_VALID, "price": "18.99"})
    assert one.content_hash() == other.content_hash() != changed.content_hash()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("19.99", "19.99"), (" 5 ", "5"), ("1,299.00", "1299.00"), ("€3.50", "3.50"), ("$ 12", "12")],
)
def test_price_parses(text: str, expected: str) -> None:
    assert Product.model_validate({**_VALID, "price": text}).price == Decimal(expected)


@pytest.mark.parametrize("text", ["call us", "12,,3", "", None, "0", "0.00", "-1", "1.2.3", "1,23"])
def test_garbage_price_is_an_error(text: str | None) -> None:
    with pytest.raises(ValueError, match="price") as info:
        Product.model_validate({**_VALID, "price": text})
    assert set(field_errors(info.value)) == {"price"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", None),
        ("name", "   "),
        ("sku", None),
        ("currency", "EURO"),
        ("currency", "€"),
        ("canonical_url", None),
        ("canonical_url", "/product/7"),
        ("canonical_url", "ftp://shop.test/product/7"),
        ("availability", "maybe later"),
    ],
)
def test_invalid_field_is_reported_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**_VALID, field: value})
    assert list(field_errors(info.value)) == [field]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("In Stock", Availability.IN_STOCK),
        ("http://schema.org/InStock", Availability.IN_STOCK),
        ("out of stock", Availability.OUT_OF_STOCK),
        ("Sold out", Availability.OUT_OF_STOCK),
        ("pre-order", Availability.PREORDER),
        ("", None),
        (None, None),
    ],
)
def test_availability_is_normalised(text: str | None, expected: Availability | None) -> None:
    assert Product.model_validate({**_VALID, "availability": text}).availability is expected


# --- journal ----------------------------------------------------------------------------------


def test_journal_appends_and_replays_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_records=3)
    journal.open()
    for start in (0, 2, 4):
        journal.append([{"n": start}, {"n": start + 1}])
    assert journal.backlog() == journal_backlog(tmp_path / "j") == 6
    segments = journal.segments()
    assert len(segments) == 2, "a segment is rotated once it holds segment_records"
    assert [r["n"] for s in segments for r in journal.read(s)] == list(range(6))
    assert journal.sealed_segments() == segments[:1]
    journal.remove(segments[0])
    assert journal.backlog() == 2
    journal.close()


def test_nodes_on_one_host_get_slots_and_adopt_dead_ones(tmp_path: Path) -> None:
    first, second = Journal(tmp_path), Journal(tmp_path)
    first.open()
    second.open()
    assert first.directory != second.directory, "two live nodes never share a slot"
    second.append([{"n": 1}, {"n": 2}])
    second.close()  # as if the node died: its lock is gone, its segments stay
    assert journal_backlog(tmp_path) == 2
    third = Journal(tmp_path)
    third.open()
    assert third.backlog() == 2, "the next node on the host adopts the orphaned journal"
    assert [r["n"] for s in third.segments() for r in third.read(s)] == [1, 2]
    assert first.backlog() == 0
    first.close()
    third.close()


def test_journal_survives_a_torn_write_and_a_restart(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.open()
    journal.append([{"n": 1}, {"n": 2}])
    journal.close()
    # A crash in the middle of the next append leaves half a line behind.
    with journal.segments()[-1].open("ab") as f:
        f.write(b'{"n": 3, "tr')
    reopened = Journal(tmp_path)
    reopened.open()
    reopened.append([{"n": 4}])
    assert reopened.backlog() == 3
    segments = reopened.segments()
    assert len(segments) == 2, "a new process never appends to an older segment"
    assert [r["n"] for s in segments for r in reopened.read(s)] == [1, 2, 4]
    reopened.close()
    assert journal_backlog(tmp_path / "missing") == 0


# --- the store against FerretDB ---------------------------------------------------------------


def _store(
    uri: str, database: str, journal: Path, **settings: Any
) -> tuple[MongoStore, StatsCollector]:
    crawler = get_crawler(
        ShopSpider,
        {
            "MONGO_URI": uri,
            "MONGO_DATABASE": database,
            "MONGO_JOURNAL_DIR": str(journal),
            "MONGO_FLUSH_INTERVAL": 0.2,
            "MONGO_SERVER_SELECTION_TIMEOUT": 1.0,
            "CRAWL_ID": "unit",
            **settings,
        },
    )
    assert crawler.stats is not None
    return MongoStore.from_crawler(crawler), crawler.stats


def _product(number: int, **changes: Any) -> Product:
    data = {
        **_VALID,
        "url": f"http://shop.test/product/{number}?ref=x",
        "canonical_url": f"http://shop.test/product/{number}",
        "sku": f"SKU-{number:06d}",
    }
    return Product.model_validate({**data, **changes})


def test_store_upserts_and_counts_changes(
    ferretdb: FerretDB, database: str, tmp_path: Path
) -> None:
    async def crawl(products: list[Product]) -> dict[str, Any]:
        store, stats = _store(ferretdb.uri, database, tmp_path / "j", MONGO_BATCH_SIZE=10)
        await store.open()
        await asyncio.gather(*(store.save_product(p) for p in products))
        await store.close()
        return stats.get_stats()

    first = asyncio.run(crawl([_product(n) for n in range(25)]))
    with ferretdb.client() as client:
        before = {d["_id"]: d for d in client[database].products.find()}
    second = asyncio.run(
        crawl([_product(n, price="1.00") if n < 5 else _product(n) for n in range(25)])
    )
    with ferretdb.client() as client:
        after = {d["_id"]: d for d in client[database].products.find()}
        index_keys = [list(index["key"]) for index in client[database].products.list_indexes()]

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
    assert changed["content_hash"] == _product(1, price="1.00").content_hash()
    assert (
        after["http://shop.test/product/9"]["content_hash"]
        == before["http://shop.test/product/9"]["content_hash"]
    )


def test_save_returns_once_the_product_is_in_mongodb(
    ferretdb: FerretDB, database: str, tmp_path: Path
) -> None:
    async def save() -> None:
        store, _ = _store(
            ferretdb.uri, database, tmp_path / "j", MONGO_BATCH_SIZE=1000, MONGO_FLUSH_INTERVAL=0.2
        )
        await store.open()
        with ferretdb.client() as client:
            await store.save_product(_product(1))
            assert client[database].products.count_documents({}) == 1
        await store.close()

    asyncio.run(save())


# pymongo 4.20 leaks the socket of a monitor check that AsyncMongoClient.close() interrupts
# while it connects to a server that is down; it is collected (gc.collect() below) in this test.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_store_journals_while_unreachable_and_replays_at_next_start(
    ferretdb: FerretDB, database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = tmp_path / "journal"
    dead = f"mongodb://fleet:s3cret@127.0.0.1:{free_port()}"

    async def run(uri: str, products: list[Product]) -> dict[str, Any]:
        store, stats = _store(uri, database, journal)
        await store.open()
        await asyncio.gather(*(store.save_product(p) for p in products))
        await store.save_reject(
            {"url": "http://shop.test/product/99", "price": None}, {"price": ["missing"]}
        )
        await store.close()
        return stats.get_stats()

    with caplog.at_level(logging.INFO, logger="project.storage.store"):
        down = asyncio.run(run(dead, [_product(n) for n in range(30)]))
    gc.collect()
    assert down["mongo/journaled"] == 31
    assert journal_backlog(journal) == 31
    assert "MongoDB unreachable" in caplog.text
    assert "s3cret" not in caplog.text

    up = asyncio.run(run(ferretdb.uri, [_product(n) for n in range(20, 40)]))
    assert journal_backlog(journal) == 0
    # Items saved while the old journal replays are journaled too (replays keep the order).
    assert up["mongo/replayed"] == 31 + up.get("mongo/journaled", 0)
    assert up["mongo/inserted"] == 40
    with ferretdb.client() as client:
        assert client[database].products.count_documents({}) == 40
        assert client[database].rejects.count_documents({}) == 1


# --- real crawls ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(products=120, malformed_share=0.1) as server:
        yield server


@pytest.fixture(scope="module")
def two_crawls(
    ferretdb: FerretDB, shop: ShopServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The same catalogue crawled twice into one database."""
    directory = tmp_path_factory.mktemp("two_crawls")
    database = f"test_{uuid.uuid4().hex[:12]}"
    result: dict[str, Any] = {"database": database, "catalogue": shop.catalogue()}
    for number in (1, 2):
        settings = crawl_settings(
            ferretdb.uri, database, directory / "journal", CRAWL_ID=f"crawl-{number}"
        )
        result[f"stats{number}"] = Crawl(directory / str(number), settings, shop.url("/")).wait(60)
        with ferretdb.client() as client:
            result[f"products{number}"] = {d["_id"]: d for d in client[database].products.find()}
            result[f"rejects{number}"] = list(
                client[database].rejects.find({"crawl_id": f"crawl-{number}"})
            )
    yield result
    with ferretdb.client() as client:
        client.drop_database(database)


@pytest.mark.slow
def test_malformed_pages_end_up_in_rejects(two_crawls: dict[str, Any], shop: ShopServer) -> None:
    catalogue = two_crawls["catalogue"]["products"]
    malformed = {p["id"]: p for p in catalogue if p["kind"] == "malformed"}
    plain = {p["id"]: p for p in catalogue if p["kind"] == "plain"}
    assert malformed
    rejects, stats = two_crawls["rejects1"], two_crawls["stats1"]

    assert {product_id(r["url"]) for r in rejects} == set(malformed)
    for reject in rejects:
        # No price element also means no data-currency; a garbage price keeps its currency.
        missing = malformed[product_id(reject["url"])]["page_price"] is None
        assert set(reject["reasons"]) == ({"price", "currency"} if missing else {"price"}), reject
        assert reject["item"]["sku"]
        assert reject["crawl_id"] == "crawl-1"
        assert isinstance(reject["rejected_at"], datetime)
    products = two_crawls["products1"]
    assert {product_id(key) for key in products} == set(plain)
    assert (
        stats["validation/dropped"]
        == stats["validation/errors/price"]
        == stats["item_dropped_count"]
    )
    assert stats["validation/dropped"] >= len(malformed)
    assert 0 < stats["validation/errors/currency"] < stats["validation/dropped"]
    assert {k for k in stats if k.startswith("validation/errors/")} == {
        "validation/errors/price",
        "validation/errors/currency",
    }

    sample = plain[min(plain)]
    doc = products[shop.url(sample["url"])]
    assert (doc["name"], doc["price"], doc["currency"], doc["sku"]) == (
        sample["name"],
        sample["price"],
        sample["currency"],
        sample["sku"],
    )
    assert doc["availability"] == sample["availability"].replace(" ", "_")
    assert doc["image_urls"] == [shop.url(src) for src in sample["images"]]
    assert doc["crawl_id"] == "crawl-1"
    assert doc["first_seen"] <= doc["last_seen"]


@pytest.mark.slow
def test_recrawl_writes_no_duplicates_and_counts_unchanged(two_crawls: dict[str, Any]) -> None:
    first, second = two_crawls["stats1"], two_crawls["stats2"]
    before, after = two_crawls["products1"], two_crawls["products2"]
    plain = [p for p in two_crawls["catalogue"]["products"] if p["kind"] == "plain"]

    assert len(after) == len(before) == len(plain)
    assert len({doc["sku"] for doc in after.values()}) == len(plain)
    assert first["mongo/inserted"] == len(plain)
    assert first["mongo/inserted"] + first.get("mongo/unchanged", 0) == first["item_scraped_count"]
    assert "mongo/updated" not in first
    assert "mongo/inserted" not in second
    assert "mongo/updated" not in second
    assert second["mongo/unchanged"] == second["item_scraped_count"] >= len(plain)
    for key, doc in after.items():
        # Unchanged content: only last_seen moved; the content (and its crawl_id) stayed.
        assert doc["last_seen"] > before[key]["last_seen"]
        assert doc["first_seen"] == before[key]["first_seen"]
        assert (doc["crawl_id"], doc["content_hash"]) == ("crawl-1", before[key]["content_hash"])


@pytest.mark.slow
def test_mongodb_outage_mid_crawl_loses_and_duplicates_nothing(
    own_ferretdb: FerretDB, crawls: list[Crawl], tmp_path: Path
) -> None:
    own_ferretdb.start()
    database, journal = "outage", tmp_path / "journal"
    # About 250 pages at 2 x 300 ms: the crawl outlives the 20 s outage by several seconds.
    with ShopServer(products=150, latency_ms=300) as shop:
        settings = crawl_settings(own_ferretdb.uri, database, journal, CONCURRENT_REQUESTS=2)
        crawl = Crawl(tmp_path / "crawl", settings, shop.url("/"))
        crawls.append(crawl)
        with own_ferretdb.client() as client:
            _wait_for(
                lambda: client[database].products.count_documents({}) >= 10, 30, "first products"
            )
        own_ferretdb.stop()
        time.sleep(20)
        assert crawl.process.poll() is None, (
            "the crawl ended during the outage: make the shop slower"
        )
        assert journal_backlog(journal) > 0
        own_ferretdb.start()
        stats = crawl.wait(90)
        catalogue = shop.catalogue()["products"]

    with own_ferretdb.client() as client:
        docs = list(client[database].products.find({}, {"sku": 1}))
    expected = {shop_product["id"] for shop_product in catalogue}
    stored = [product_id(doc["_id"]) for doc in docs]
    duplicated = len(stored) - len(set(stored))
    print(
        f"outage: {len(expected)} products expected, {len(stored)} stored, {duplicated} duplicated"
    )
    assert sorted(stored) == sorted(expected)
    assert len({doc["sku"] for doc in docs}) == len(expected)
    assert stats["mongo/journaled"] > 0
    assert stats["mongo/replayed"] == stats["mongo/journaled"]
    assert stats["mongo/retries"] > 0
    assert journal_backlog(journal) == 0
    log = crawl.log()
    assert "MongoDB unreachable" in log
    assert "MongoDB back, replaying" in log


@pytest.mark.slow
def test_killed_crawl_journal_is_replayed_at_next_start(
    own_ferretdb: FerretDB, crawls: list[Crawl], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    with ShopServer(products=200, malformed_share=0.1, latency_ms=100) as shop:
        # MongoDB is down (not started yet): everything goes to the journal.
        settings = crawl_settings(own_ferretdb.uri, "killed", journal, CONCURRENT_REQUESTS=4)
        crawl = Crawl(tmp_path / "crawl1", settings, shop.url("/"))
        crawls.append(crawl)
        _wait_for(lambda: journal_backlog(journal) >= 40, 30, "a journal backlog")
        crawl.kill()
    assert crawl.process.returncode == -signal.SIGKILL
    reader = Journal(journal)
    # The killed node's slot (node-0) below the configured journal folder.
    records = [
        r for segment in sorted(journal.glob("node-*/*.jsonl")) for r in reader.read(segment)
    ]
    expected_products = {r["id"] for r in records if r["kind"] == "product"}
    expected_rejects = {r["id"] for r in records if r["kind"] == "reject"}
    assert expected_products
    assert expected_rejects

    own_ferretdb.start()
    stats = Crawl(tmp_path / "crawl2", settings, start_url="").wait(60)

    with own_ferretdb.client() as client:
        db = client["killed"]
        products = [doc["_id"] for doc in db.products.find({}, {"_id": 1})]
        rejects = {doc["_id"] for doc in db.rejects.find({}, {"_id": 1})}
    assert sorted(products) == sorted(expected_products)
    assert rejects == expected_rejects
    assert stats["mongo/replayed"] == len(records)
    assert stats["mongo/inserted"] == len(expected_products)
    assert journal_backlog(journal) == 0


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


if __name__ == "__main__":
    _crawl_main(sys.argv[1])
