"""Storage faults are loud and exact: what MongoDB cannot take, journal failures, permanent
errors, late replays, a backlog at the end, the write concern.

Against real servers: the suite's FerretDB, a FerretDB of this module with authentication on
that says it is replica set ``rs0``, a port nobody listens on, and a journal on a 64 KiB tmpfs
that fills up (mounted as root, unmounted after the test).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import subprocess
import time
from datetime import UTC
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from scrapy.exceptions import DropItem

from project.ops.install import ensure_ferretdb
from project.ops.services import free_port
from project.storage.config import StorageConfigError
from project.storage.errors import is_authentication_failure, severity
from project.storage.journal import Journal, journal_backlog
from project.storage.store import ItemNotStoredError, ItemRejectedError
from tests.fleet import wait_for
from tests.site.server import ShopServer
from tests.test_storage_crawls import Crawl, crawl_settings
from tests.test_store import make_product, make_store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pymongo.database import Database

    from project.ops.services import ServicesConfig

# pymongo 4.20 leaks the socket of a monitor check that AsyncMongoClient.close() interrupts
# while it connects to a server that is down (the tests that journal against a dead port).
_SOCKET_LEAK = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


def _dead_uri() -> str:
    return f"mongodb://fleet:s3cret@127.0.0.1:{free_port()}"


def _deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def _save_all(store: Any, saves: list[Any]) -> list[BaseException | None]:
    results = await asyncio.gather(*saves, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


# -- servers and disks of this module ------------------------------------------------------------


@pytest.fixture(scope="module")
def secured_mongo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a FerretDB with authentication (user ``fleet``, ``s3cret``), set rs0."""
    directory = tmp_path_factory.mktemp("secured")
    address = f"127.0.0.1:{free_port()}"
    argv = [
        str(ensure_ferretdb()), f"--listen-addr={address}", "--handler=sqlite",
        f"--sqlite-url=file:{directory}/", f"--state-dir={directory}", "--telemetry=disable",
        "--log-level=error", "--debug-addr=-", "--test-enable-new-auth",
        "--setup-database=admin", "--setup-username=fleet", "--setup-password=s3cret",
        "--repl-set-name=rs0",
    ]  # fmt: skip
    with (directory / "ferretdb.log").open("wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    uri = f"mongodb://fleet:s3cret@{address}/?directConnection=true"

    def ready() -> bool:
        client: pymongo.MongoClient[dict[str, Any]]
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=500) as client:
            try:
                return bool(client.admin.command("ping"))
            except pymongo.errors.PyMongoError:
                return False

    try:
        wait_for(ready, 30, "the secured FerretDB", 0.2)
        yield address
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a disk that fills up after a few journaled items."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _grow(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)


# -- an item pymongo cannot encode costs only itself ----------------------------------------------


def _hostile_saves(store: Any) -> list[Any]:
    """Five good products, two MongoDB cannot take, one reject whose raw item is hostile."""
    good = [make_product(n) for n in range(5)]
    base = make_product(90)
    too_large = base.model_copy(
        update={"canonical_url": "http://shop.test/product/large", "description": "x" * 17_000_000}
    )
    surrogate = base.model_copy(
        update={"canonical_url": "http://shop.test/product/surrogate", "name": "bad \ud800 name"}
    )
    raw = {
        "url": "http://shop.test/product/hostile",
        "price": None,
        "$where": "sleep(1000)",
        "a.b": {"c.d": 1, "$gt": ""},
        "nul\x00key": "x",
        "big": 2**70,
        "deep": _deep(50_000),
        "many": list(range(100_000)),
        "obj": object(),
        "text": "y" * 1_000_000,
    }
    return [
        *(store.save_product(p) for p in good),
        store.save_product(too_large),
        store.save_product(surrogate),
        store.save_reject(raw, {"price": ["missing"], "a.b": ["$not allowed"]}),
    ]


def _check_hostile_outcome(mongo: Database[Any], *more_rejects: str) -> None:
    products = {d["_id"] for d in mongo.products.find({}, {"_id": 1})}
    assert products == {f"http://shop.test/product/{n}" for n in range(5)}
    rejects = {d["_id"]: d for d in mongo.rejects.find()}
    assert set(rejects) == {
        "unit|http://shop.test/product/large",
        "unit|http://shop.test/product/surrogate",
        "unit|http://shop.test/product/hostile",
        *more_rejects,
    }
    large = rejects["unit|http://shop.test/product/large"]
    assert large["reasons"]["document"][0].startswith("DocumentTooLarge: ")
    assert len(large["item"]["description"]) < 2100, "the reject keeps a bounded copy"
    surrogate = rejects["unit|http://shop.test/product/surrogate"]
    assert surrogate["reasons"]["document"][0].startswith("UnicodeEncodeError: ")
    hostile = rejects["unit|http://shop.test/product/hostile"]
    item = hostile["item"]
    assert item["\uff04where"] == "sleep(1000)"
    assert item["a\uff0eb"] == {"c\uff0ed": 1, "\uff04gt": ""}
    assert item["nulkey"] == "x"
    assert item["big"] == "<int of 71 bits>"
    assert item["many"][-1] == "<99900 more>"
    assert item["text"].endswith("...[998000 more characters]")
    assert "<too deep>" in str(item["deep"])
    assert hostile["reasons"] == {"price": ["missing"], "a\uff0eb": ["$not allowed"]}


def test_an_item_mongodb_cannot_take_goes_to_rejects_and_its_batch_is_stored(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    async def run() -> tuple[list[BaseException | None], dict[str, Any]]:
        store, stats = make_store(services.mongo_url, mongo.name, tmp_path / "j")
        await store.open()
        outcomes = await _save_all(store, _hostile_saves(store))
        await store.close()
        return outcomes, stats.get_stats()

    outcomes, stats = asyncio.run(run())
    assert outcomes[:5] == [None] * 5
    large, surrogate, reject = outcomes[5:]
    assert isinstance(large, ItemRejectedError)
    assert isinstance(large, DropItem), "the pipeline drops it, like an invalid item"
    assert "DocumentTooLarge" in str(large)
    assert "stored in rejects instead" in str(large)
    assert isinstance(surrogate, ItemRejectedError)
    assert reject is None
    assert stats["mongo/batches"] == 1, "all eight went in one batch"
    assert stats["mongo/inserted"] == 5
    assert stats["mongo/rejected"] == 2
    assert stats["mongo/rejected/DocumentTooLarge"] == 1
    assert stats["mongo/rejected/UnicodeEncodeError"] == 1
    assert "mongo/journaled" not in stats
    _check_hostile_outcome(mongo)


@_SOCKET_LEAK
def test_a_journaled_item_mongodb_cannot_take_does_not_stop_the_replay(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"

    async def journal_them() -> list[BaseException | None]:
        store, _ = make_store(_dead_uri(), mongo.name, journal)
        await store.open()
        outcomes = await _save_all(store, _hostile_saves(store))
        await store.close()
        return outcomes

    assert asyncio.run(journal_them()) == [None] * 8, "journaled: durable, whatever they hold"
    gc.collect()
    # Records this store never writes, as a hand-edited journal or another program could leave:
    # a field name MongoDB refuses on insert and on update, and a record without its fields.
    seen = time.time()
    product = {"db": mongo.name, "kind": "product", "hash": "h", "crawl_id": "unit", "seen": seen}
    crafted = Journal(journal, database=mongo.name)
    crafted.open()
    crafted.append(
        [
            {**product, "id": "http://shop.test/product/dollar", "doc": {"$set": 1, "name": "x"}},
            {**product, "id": "http://shop.test/product/1", "doc": {"name": {"$bad": 1}}},
            {"db": mongo.name, "kind": "product", "id": "http://shop.test/product/broken"},
        ]
    )
    crafted.close()
    assert journal_backlog(journal) == 11

    async def replay() -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, journal)
        await store.open()
        await store.close()
        return stats.get_stats()

    stats = asyncio.run(replay())
    assert journal_backlog(journal) == 0, "the replay went through"
    assert stats["mongo/replayed"] == 10
    assert stats["mongo/journal_malformed"] == 1
    # The insert FerretDB refused with a reason, the update it refused without one.
    assert (stats["mongo/rejected"], stats["mongo/rejected/WriteError"]) == (4, 2)
    dollar = mongo.rejects.find_one({"_id": "unit|http://shop.test/product/dollar"})
    assert dollar is not None
    assert dollar["reasons"]["document"][0].startswith("WriteError 2: invalid key")
    stored = mongo.products.find_one({"_id": "http://shop.test/product/1"})
    assert stored is not None
    assert stored["name"] == make_product(1).name, "the refused update changed nothing"
    _check_hostile_outcome(
        mongo, "unit|http://shop.test/product/dollar", "unit|http://shop.test/product/1"
    )


# -- a journal write failure fails the item loudly ------------------------------------------------


@_SOCKET_LEAK
def test_a_journal_write_failure_fails_the_item_loudly(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = tiny_disk / "journal"

    async def run() -> tuple[list[BaseException | None], BaseException | None, dict[str, Any]]:
        store, stats = make_store(_dead_uri(), "fleetcrawl", journal)
        await store.open()
        outcomes: list[BaseException | None] = []
        for n in range(12):  # about 20 KB each: the disk is full after three
            product = make_product(n, description="d" * 20_000)
            outcomes += await _save_all(store, [store.save_product(product)])
        _grow(tiny_disk)
        after = (await _save_all(store, [store.save_product(make_product(99))]))[0]
        await store.close()
        return outcomes, after, stats.get_stats()

    with caplog.at_level(logging.WARNING, logger="project.storage.store"):
        outcomes, after, stats = asyncio.run(run())
    gc.collect()
    stored = outcomes.index(next(o for o in outcomes if o is not None))
    assert 1 <= stored < 12
    failures = outcomes[stored:]
    assert all(isinstance(f, ItemNotStoredError) for f in failures), failures
    assert not any(isinstance(f, DropItem) for f in failures), "an error, not a drop"
    assert failures[0] is not None
    cause = failures[0].__cause__
    assert isinstance(cause, OSError)
    assert cause.errno == errno.ENOSPC
    assert stats["mongo/journal_errors"] == len(failures)
    assert stats["mongo/journaled"] == stored + 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    gave_up = [r for r in errors if r.getMessage().startswith("crawled, not stored")]
    assert len(gave_up) == 1, "closing, the store says what it could not store"
    errors = [r for r in errors if r not in gave_up]
    assert len(errors) == 1, "one ERROR for the whole streak, not one per batch"
    assert "cannot journal 1 items to" in errors[0].getMessage()
    assert "No space left on device" in errors[0].getMessage()
    assert after is None, "once the disk has room again, items are journaled again"
    assert "takes items again" in caplog.text
    assert journal_backlog(journal) == stored + 1


@pytest.mark.crawl
def test_a_failed_item_reaches_the_frontier_while_its_page_is_in_progress(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """The storage half of the contract: the frontier can refuse the page's ack.

    Scrapy sends ``item_error`` with the response while its request is still in the engine
    (``requests_in_progress``), before the frontier settles the lease.
    """
    (tiny_disk / "filler").write_bytes(b"x" * 52 * 1024)  # room for about ten items
    with ShopServer(products=30) as shop:
        settings = crawl_settings(
            _dead_uri(),
            "fleetcrawl",
            tiny_disk / "journal",
            EXTENSIONS={
                "project.monitoring.statsfile.StatsFile": 510,
                "tests.test_storage_crawls.ItemErrorProbe": 0,
            },
            # batches of two: the first few fit, however fast the crawl yields its items
            MONGO_BATCH_SIZE=2,
        )
        stats = Crawl(tmp_path / "crawl", settings, shop.url("/")).wait(60)
    failed = stats["probe/item_error/ItemNotStoredError"]
    assert failed > 0
    assert stats["probe/item_error/in_progress"] == failed
    assert stats["mongo/journal_errors"] == failed
    assert stats["mongo/journaled"] > 0
    # Every item the journal took is reported (scraped, or dropped into rejects); no other.
    dropped = stats.get("item_dropped_count", 0)
    assert stats["item_scraped_count"] + dropped == stats["mongo/journaled"]


@pytest.mark.crawl
def test_a_misspelt_mongo_setting_stops_the_crawl(tmp_path: Path) -> None:
    with ShopServer(products=5) as shop:
        settings = crawl_settings(
            "mongodb://127.0.0.1:1", "fleetcrawl", tmp_path / "journal", MONGO_URL="mongodb://db"
        )
        crawl = Crawl(tmp_path / "crawl", settings, shop.url("/"))
        assert crawl.exit_code(60) == 1
        assert shop.stats()["total"] == 0, "nothing was fetched"
    assert (
        "ERROR: unknown setting MONGO_URL: did you mean MONGO_URI? (see docs/settings.md):"
        " this node cannot store items, so it does not start"
    ) in crawl.log()


# -- permanent MongoDB errors are ERRORs and stats ------------------------------------------------


def test_a_wrong_password_stops_the_node_at_start(
    secured_mongo: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"mongodb://fleet:wrong-pw@{secured_mongo}/?directConnection=true"

    async def run() -> None:
        store, _ = make_store(uri, "shop", tmp_path / "j")
        with pytest.raises(StorageConfigError, match="refused the credentials") as info:
            await store.open()
        assert "AuthenticationFailed" in str(info.value) or "OperationFailure 18" in str(info.value)
        await store.close()

    with caplog.at_level(logging.INFO, logger="project.storage"):
        asyncio.run(run())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "check the user and password in MONGO_URI" in errors[0]
    assert "wrong-pw" not in caplog.text


def test_missing_privileges_are_errors_in_the_log_and_the_stats(
    secured_mongo: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"mongodb://{secured_mongo}/?directConnection=true"  # no user: nothing is permitted

    async def run() -> dict[str, Any]:
        store, stats = make_store(uri, "shop", tmp_path / "j", MONGO_RETRY_MAX_DELAY=0.2)
        await store.open()
        await store.save_product(make_product(1))  # refused by MongoDB: journaled
        await asyncio.sleep(2)  # several replay attempts, each refused
        await store.close()
        return stats.get_stats()

    with caplog.at_level(logging.DEBUG, logger="project.storage.store"):
        stats = asyncio.run(run())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    errors = [e for e in errors if not e.startswith("crawled, not stored")]
    assert any("cannot create the index sku of shop.products" in e for e in errors), errors
    assert any("writes refused, journaling to" in e for e in errors), errors
    assert any("journal replay refused" in e for e in errors), errors
    assert all("Unauthorized" in e or "OperationFailure 13" in e for e in errors), errors
    # the indexes: sku, rejects' crawl_id, the change history's item_id and at
    assert len(errors) == 6, "each fault once (four indexes, the write, the replay), not per retry"
    assert stats["mongo/permanent_errors"] >= 6
    assert "OperationFailure 13" in stats["mongo/last_error"]
    assert stats["mongo/journaled"] == 1
    assert stats["mongo/journal_backlog"] == 1, "the item is kept, loudly"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (AutoReconnect("connection reset"), "transient"),
        (ServerSelectionTimeoutError("no server"), "transient"),
        (OperationFailure("not primary", 10107), "transient"),
        (OperationFailure("stepped down", 189), "transient"),
        (BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 64}]}), "transient"),
        (OperationFailure("Authentication failed.", 18), "permanent"),
        (OperationFailure("not authorized on shop to execute command insert", 13), "permanent"),
        (OperationFailure("Index with name: sku already exists", 86), "permanent"),
        (BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 100}]}), "permanent"),
        (OperationFailure("no such command: 'bulkWrite'", 59), "permanent"),
        (OperationFailure("something new", 424242), "permanent"),  # unknown: tell an operator
    ],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_outages_and_permanent_errors_are_told_apart(error: PyMongoError, expected: str) -> None:
    assert severity(error) == expected
    assert is_authentication_failure(error) == (getattr(error, "code", None) == 18)


def test_a_conflicting_index_is_an_error_not_an_outage(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mongo.products.create_index([("sku", pymongo.DESCENDING)], name="sku")

    async def run() -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, tmp_path / "j")
        await store.open()
        await store.save_product(make_product(1))
        await store.close()
        return stats.get_stats()

    with caplog.at_level(logging.ERROR, logger="project.storage.store"):
        stats = asyncio.run(run())
    assert "cannot create the index sku" in caplog.text
    assert "OperationFailure 86" in caplog.text
    assert stats["mongo/permanent_errors"] == 1
    assert "mongo/journaled" not in stats, "the item went to MongoDB, not to the journal"
    assert mongo.products.count_documents({}) == 1


# -- replay never overwrites newer content --------------------------------------------------------


@_SOCKET_LEAK
def test_replay_never_overwrites_newer_content(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    journal, now = tmp_path / "journal", time.time()

    async def node_a_journals() -> None:  # MongoDB away from node A
        store, _ = make_store(_dead_uri(), mongo.name, journal)
        await store.open()
        await store.save_product(make_product(1, price="10.00"), seen=now - 100)
        await store.save_product(make_product(2, price="10.00"), seen=now - 100)
        await store.save_product(make_product(3, price="30.00"), seen=now - 10)
        await store.save_reject({"url": "http://shop.test/x"}, {"price": ["old"]}, seen=now - 100)
        await store.close()

    async def node_b_writes() -> None:  # meanwhile node B reaches MongoDB
        store, _ = make_store(services.mongo_url, mongo.name, tmp_path / "b")
        await store.open()
        await store.save_product(make_product(1, price="20.00"), seen=now - 50)
        await store.save_product(make_product(3, price="20.00"), seen=now - 50)
        await store.save_reject({"url": "http://shop.test/x"}, {"price": ["new"]}, seen=now - 50)
        await store.close()

    async def node_a_replays() -> dict[str, Any]:
        store, stats = make_store(services.mongo_url, mongo.name, journal)
        await store.open()
        await store.close()
        return stats.get_stats()

    asyncio.run(node_a_journals())
    gc.collect()
    asyncio.run(node_b_writes())
    stats = asyncio.run(node_a_replays())

    docs = {d["_id"].rsplit("/", 1)[1]: d for d in mongo.products.find()}
    assert docs["1"]["price"] == "20.00", "node B's newer content stays"
    assert docs["1"]["last_seen"].replace(tzinfo=UTC).timestamp() == pytest.approx(
        now - 50, abs=0.002
    )
    assert docs["2"]["price"] == "10.00", "what nobody else wrote is replayed"
    assert docs["3"]["price"] == "30.00", "a journaled record newer than the stored one wins"
    assert (stats["mongo/stale"], stats["mongo/inserted"], stats["mongo/updated"]) == (1, 1, 1)
    reject = mongo.rejects.find_one({"_id": "unit|http://shop.test/x"})
    assert reject is not None
    assert reject["reasons"] == {"price": ["new"]}, "node B's newer reject stays"


# -- finished with a journal backlog --------------------------------------------------------------


@pytest.mark.crawl
def test_a_crawl_that_cannot_store_what_it_found_waits_then_says_how_many_and_where(
    tmp_path: Path,
) -> None:
    """No fleet (no outbox), MongoDB away: the crawl waits MONGO_DRAIN_TIMEOUT, then names
    the journal and its host (only a node started there can replay it)."""
    journal = tmp_path / "journal"
    with ShopServer(products=10) as shop:
        settings = crawl_settings(_dead_uri(), "fleetcrawl", journal)
        crawl = Crawl(tmp_path / "crawl", settings, shop.url("/"))
        stats = crawl.wait(60)
    backlog = journal_backlog(journal)
    assert backlog == stats["mongo/journal_backlog"] == stats["mongo/journaled"] > 0
    assert stats["mongo/not_stored"] == stats["mongo/not_stored/journal"] == backlog
    log = crawl.log()
    assert "WARNING: crawled, waiting for MongoDB at mongodb://" in log
    assert "ERROR: crawled, not stored: MongoDB at mongodb://" in log
    assert f"{backlog} in the journal {journal}/node-0 on " in log
    assert "with MONGO_JOURNAL_DIR=" in log


# -- the write concern ----------------------------------------------------------------------------


def test_the_write_concern_is_majority_on_a_replica_set(secured_mongo: str, tmp_path: Path) -> None:
    uri = f"mongodb://fleet:s3cret@{secured_mongo}/?directConnection=true"

    async def run() -> tuple[Any, dict[str, Any]]:
        store, stats = make_store(uri, "concern", tmp_path / "j")
        await store.open()
        await store.save_product(make_product(1))
        concern = store.write_concern
        await store.close()
        return concern, stats.get_stats()

    concern, stats = asyncio.run(run())
    assert concern.document == {"w": "majority"}
    assert stats["mongo/write_concern"] == "majority"
    assert stats["mongo/inserted"] == 1


def test_a_single_server_acknowledges_alone(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> tuple[Any, dict[str, Any]]:
        store, stats = make_store(services.mongo_url, mongo.name, tmp_path / "j")
        await store.open()
        await store.save_product(make_product(1))
        concern = store.write_concern
        await store.close()
        return concern, stats.get_stats()

    with caplog.at_level(logging.INFO, logger="project.storage.store"):
        concern, stats = asyncio.run(run())
    assert concern.document == {"w": 1}
    assert stats["mongo/write_concern"] == "1"
    assert "is a single server, not a replica set" in caplog.text


@pytest.mark.parametrize("concern", ["2", "dc-east"])
def test_a_write_concern_a_single_server_cannot_meet_stops_the_node(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path, concern: str
) -> None:
    async def run() -> None:
        store, _ = make_store(
            services.mongo_url, mongo.name, tmp_path / "j", MONGO_WRITE_CONCERN=concern
        )
        with pytest.raises(StorageConfigError, match="needs a replica set"):
            await store.open()
        await store.close()

    asyncio.run(run())


def test_a_journal_folder_that_cannot_be_written_stops_the_node(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")

    async def run() -> None:
        store, _ = make_store(_dead_uri(), "shop", blocked / "journal")
        with pytest.raises(StorageConfigError, match="set MONGO_JOURNAL_DIR to a folder"):
            await store.open()
        await store.close()

    asyncio.run(run())


@pytest.mark.crawl
def test_a_journal_folder_that_cannot_be_written_stops_the_crawl(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with ShopServer(products=5) as shop:
        settings = crawl_settings(_dead_uri(), "fleetcrawl", blocked / "journal")
        crawl = Crawl(tmp_path / "crawl", settings, shop.url("/"))
        assert crawl.exit_code(60) == 1
    log = crawl.log()
    errors = [line for line in log.splitlines() if "] ERROR: " in line]
    assert len(errors) == 1, errors
    assert "cannot use the journal folder" in errors[0]
    assert "this node cannot store items, so it does not start" in errors[0]
    assert "Spider closed (journal_unusable)" in log
    assert "Traceback" not in log + crawl.stderr_path.read_text()
