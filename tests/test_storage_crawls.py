"""Real crawls of the test shop through the validation and MongoDB pipelines.

Rejects, a re-crawl, a MongoDB outage mid-crawl and a killed crawl's journal. Crawls run as real
processes (``python -m tests.test_storage_crawls CONFIG``, see ``_crawl_main``): a Twisted
reactor runs once per process, and two tests kill a crawl or stop MongoDB under it. Each crawl
writes its final stats with the project's ``StatsFile`` extension (``MONITOR_STATS_FILE``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
from scrapy import Request, Spider, signals

from project.frontier.engine import requests_in_progress
from project.items import ProductItem
from project.ops.services import ServicesConfig, free_port, start_mongo, stop_service
from project.storage.journal import Journal, journal_backlog
from tests.fleet import ROOT, wait_for
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure


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


class ItemErrorProbe:
    """Counts item errors, and those whose page the engine still holds (``probe/item_error/*``).

    What the frontier needs to refuse the page's ack: Scrapy's ``item_error`` signal carries the
    response, and its request has not left the engine yet.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        crawler.signals.connect(self.item_error, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemErrorProbe:
        return cls(crawler)

    def item_error(self, item: Any, response: Response, spider: Spider, failure: Failure) -> None:
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value(f"probe/item_error/{type(failure.value).__name__}")
        if response.request in requests_in_progress(self.crawler):
            stats.inc_value("probe/item_error/in_progress")


def crawl_settings(uri: str, database: str, journal: Path, **extra: Any) -> dict[str, Any]:
    return {
        "ITEM_PIPELINES": {
            "pipelines.validation.ValidationPipeline": 100,
            "pipelines.mongo.MongoPipeline": 300,
        },
        "EXTENSIONS": {"project.monitoring.statsfile.StatsFile": 510},
        "MONGO_URI": uri,
        "MONGO_DATABASE": database,
        "MONGO_JOURNAL_DIR": str(journal),
        "MONGO_FLUSH_INTERVAL": 0.3,
        "MONGO_RETRY_MAX_DELAY": 2.0,
        "MONGO_SERVER_SELECTION_TIMEOUT": 2.0,
        # a crawl that ends while MongoDB is away gives up waiting soon (a test waits on it)
        "MONGO_DRAIN_TIMEOUT": 3.0,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **extra,
    }


class Crawl:
    """A crawl running as its own process; ``wait()`` returns its final stats."""

    def __init__(self, directory: Path, settings: dict[str, Any], start_url: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "crawl.log"
        self.stats_path = directory / "stats.json"
        self.stderr_path = directory / "stderr.log"
        config = directory / "crawl.json"
        settings = {
            **settings,
            "LOG_FILE": str(self.log_path),
            "MONITOR_STATS_FILE": str(self.stats_path),
        }
        config.write_text(json.dumps({"settings": settings, "start_url": start_url}))
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.test_storage_crawls", str(config)],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def wait(self, timeout: float = 60) -> dict[str, Any]:
        code = self.exit_code(timeout)
        stderr = self.stderr_path.read_text(errors="replace")
        assert code == 0, f"crawl exited with {code}:\n{self.log()[-3000:]}\n{stderr[-3000:]}"
        stats: dict[str, Any] = json.loads(self.stats_path.read_text())
        assert stats["finish_reason"] == "finished", stats
        return stats

    def exit_code(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _crawl_main(config_path: str) -> None:
    from scrapy.crawler import CrawlerProcess

    config = json.loads(Path(config_path).read_text())
    process = CrawlerProcess(config["settings"])
    process.crawl(ShopSpider, start_url=config["start_url"])
    process.start()
    sys.exit(1 if process.bootstrap_failed else 0)  # as `scrapy crawl` does


@pytest.fixture
def crawls() -> Iterator[list[Crawl]]:
    started: list[Crawl] = []
    yield started
    for crawl in started:
        crawl.kill()


@pytest.fixture
def own_mongo(tmp_path: Path) -> Iterator[ServicesConfig]:
    """A FerretDB of the test's own (not started yet), for tests that stop it.

    ``start_mongo`` after ``stop_service`` serves the same data again on the same port.
    """
    cfg = ServicesConfig(state_dir=tmp_path / "state", mongo_port=free_port())
    yield cfg
    stop_service(cfg, "mongo")


def _client(url: str) -> pymongo.MongoClient[dict[str, Any]]:
    return pymongo.MongoClient(url, serverSelectionTimeoutMS=5000, tz_aware=True)


def product_id(url: str) -> int:
    return int(url.split("?")[0].rstrip("/").rsplit("/", 1)[1])


# --- a catalogue crawled twice ----------------------------------------------------------------


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(products=120, malformed_share=0.1) as server:
        yield server


@pytest.fixture(scope="module")
def two_crawls(
    services: ServicesConfig, shop: ShopServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The same catalogue crawled twice into one database."""
    directory = tmp_path_factory.mktemp("two_crawls")
    database = f"test_{uuid.uuid4().hex[:12]}"
    result: dict[str, Any] = {"database": database, "catalogue": shop.catalogue()}
    with _client(services.mongo_url) as client:
        try:
            for number in (1, 2):
                settings = crawl_settings(
                    services.mongo_url,
                    database,
                    directory / "journal",
                    RUNS_CRAWL_ID=f"crawl-{number}",
                )
                crawl = Crawl(directory / str(number), settings, shop.url("/"))
                result[f"stats{number}"] = crawl.wait(60)
                result[f"products{number}"] = {
                    d["_id"]: d for d in client[database].products.find()
                }
                result[f"rejects{number}"] = list(
                    client[database].rejects.find({"crawl_id": f"crawl-{number}"})
                )
            yield result
        finally:
            client.drop_database(database)


@pytest.mark.crawl
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


@pytest.mark.crawl
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


# --- MongoDB away mid-crawl, a crawl killed -----------------------------------------------------


@pytest.mark.crawl
@pytest.mark.slow("an 8 s MongoDB outage inside a crawl that outlives it")
def test_mongodb_outage_mid_crawl_loses_and_duplicates_nothing(
    own_mongo: ServicesConfig, crawls: list[Crawl], tmp_path: Path
) -> None:
    start_mongo(own_mongo)
    database, journal = "outage", tmp_path / "journal"
    # About 130 pages at 2 x 300 ms: the crawl outlives the 8 s outage by several seconds.
    with ShopServer(products=80, latency_ms=300) as shop:
        settings = crawl_settings(own_mongo.mongo_url, database, journal, CONCURRENT_REQUESTS=2)
        crawl = Crawl(tmp_path / "crawl", settings, shop.url("/"))
        crawls.append(crawl)
        with _client(own_mongo.mongo_url) as client:
            wait_for(
                lambda: client[database].products.count_documents({}) >= 10,
                30,
                "first products",
                0.2,
            )
        assert stop_service(own_mongo, "mongo")
        time.sleep(8)  # the outage
        assert crawl.process.poll() is None, (
            "the crawl ended during the outage: make the shop slower"
        )
        assert journal_backlog(journal) > 0
        start_mongo(own_mongo)
        stats = crawl.wait(90)
        catalogue = shop.catalogue()["products"]

    with _client(own_mongo.mongo_url) as client:
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


@pytest.mark.crawl
def test_killed_crawl_journal_is_replayed_at_next_start(
    own_mongo: ServicesConfig, crawls: list[Crawl], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    with ShopServer(products=200, malformed_share=0.1, latency_ms=100) as shop:
        # MongoDB is down (not started yet): everything goes to the journal.
        settings = crawl_settings(own_mongo.mongo_url, "killed", journal, CONCURRENT_REQUESTS=4)
        crawl = Crawl(tmp_path / "crawl1", settings, shop.url("/"))
        crawls.append(crawl)
        wait_for(lambda: journal_backlog(journal) >= 40, 30, "a journal backlog", 0.2)
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

    start_mongo(own_mongo)
    stats = Crawl(tmp_path / "crawl2", settings, start_url="").wait(60)

    with _client(own_mongo.mongo_url) as client:
        db = client["killed"]
        products = [doc["_id"] for doc in db.products.find({}, {"_id": 1})]
        rejects = {doc["_id"] for doc in db.rejects.find({}, {"_id": 1})}
    assert sorted(products) == sorted(expected_products)
    assert rejects == expected_rejects
    assert stats["mongo/replayed"] == len(records)
    assert stats["mongo/inserted"] == len(expected_products)
    assert journal_backlog(journal) == 0


if __name__ == "__main__":
    _crawl_main(sys.argv[1])
