"""The fleet's outbox: what a node cannot write to MongoDB waits in Redis, any node writes it.

Real Redis and FerretDB; a store "with MongoDB away" is one whose MONGO_URI names a port
nothing listens on, the way a node sees a MongoDB that went away.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import shutil
import time
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis.asyncio
from scrapy.settings import Settings

from project.ops.services import ServicesConfig, free_port, start_mongo, stop_service
from project.runs.report import RunsConfig, finish_run
from project.storage.journal import journal_backlog
from project.storage.outbox import Outbox
from tests.fleet import run_cli, wait_for
from tests.test_store import make_product, make_store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pymongo.database import Database

    from project.frontier.keys import FrontierKeys
    from tests.fleet import Fleet, KeySpace


def _dead_uri() -> str:
    return f"mongodb://fleet:s3cret@127.0.0.1:{free_port()}"


async def _save(uri: str, database: str, journal: Path, keys: FrontierKeys, redis_url: str,
                numbers: range, **settings: Any) -> tuple[dict[str, Any], Any]:  # fmt: skip
    """A fleet node's store (it heard the frontier's keys) saving products *numbers*. Against
    a live MongoDB it waits up to 30 s to drain what waits (a loaded machine is slow to read a
    70 MiB entry); calls against a dead one give their own MONGO_DRAIN_TIMEOUT."""
    settings.setdefault("MONGO_DRAIN_TIMEOUT", 30.0)
    store, stats = make_store(uri, database, journal, REDIS_URL=redis_url, **settings)
    store.frontier_ready(keys)
    await store.open()
    await asyncio.gather(*(store.save_product(make_product(n)) for n in numbers))
    await store.close()
    return stats.get_stats(), store


def _left_without_mongodb(
    database: str, journal: Path, keys: FrontierKeys, redis_url: str, numbers: range
) -> None:
    """A node whose MongoDB is away saved products *numbers* and gave up at once."""
    asyncio.run(
        _save(_dead_uri(), database, journal, keys, redis_url, numbers, MONGO_DRAIN_TIMEOUT=0.5)
    )


# --- the outbox itself -------------------------------------------------------------------------


def test_a_batch_that_does_not_fit_is_refused_whole(redis_url: str, keys: FrontierKeys) -> None:
    async def run() -> tuple[bool, bool, Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        outbox = Outbox(client, f"{keys.outbox}:db", max_bytes=300)
        first = await outbox.push([{"n": i, "pad": "x" * 40} for i in range(4)])
        second = await outbox.push([{"n": i, "pad": "x" * 40} for i in range(4, 8)])
        size = await outbox.size()
        await client.aclose()
        return first, second, size

    first, second, size = asyncio.run(run())
    assert (first, second) == (True, False)
    assert size.records == 4
    assert 4 * 40 < size.bytes <= 300


def test_one_drainer_at_a_time_and_a_lapsed_lease_removes_nothing(
    redis_url: str, keys: FrontierKeys
) -> None:
    async def run() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        key = f"{keys.outbox}:db"
        one = Outbox(client, key, max_bytes=1 << 20, lease_seconds=0.3)
        two = Outbox(client, key, max_bytes=1 << 20, lease_seconds=0.3)
        await one.push([{"n": i} for i in range(10)])
        seen = [await one.lease(), await two.lease()]  # the second waits its turn
        seen.append(len(await one.head(4)))
        await asyncio.sleep(0.5)  # one's lease lapses while it writes; two takes over
        seen += [await two.lease(), await one.remove(4), (await one.size()).records]
        seen += [await two.remove(4), (await two.size()).records]
        await two.release()
        seen.append(await one.lease())
        await client.aclose()
        return seen

    assert asyncio.run(run()) == [True, False, 4, True, False, 10, True, 6, True]


def test_a_drainer_whose_lease_lapsed_removes_nothing_even_when_nobody_holds_it(
    redis_url: str, keys: FrontierKeys
) -> None:
    """Another drainer took the lapsed lease, wrote the batch and let go: the first one's
    removal would drop records nobody wrote."""

    async def run() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        key = f"{keys.outbox}:db"
        one = Outbox(client, key, max_bytes=1 << 20, lease_seconds=0.2)
        two = Outbox(client, key, max_bytes=1 << 20, lease_seconds=0.2)
        await one.push([{"n": i} for i in range(8)])
        seen = [await one.lease(), len(await one.head(4))]
        await asyncio.sleep(0.3)
        seen += [await two.lease(), await two.remove(4)]
        await two.release()
        seen += [await one.remove(4), (await one.size()).records]
        await client.aclose()
        return seen

    assert asyncio.run(run()) == [True, 4, True, True, False, 4]


# --- a store whose MongoDB is away -------------------------------------------------------------


def test_items_wait_in_the_outbox_not_on_disk_and_another_node_stores_them_once(
    services: ServicesConfig,
    mongo: Database[Any],
    redis_url: str,
    keys: FrontierKeys,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MongoDB away: the node's items go to Redis; it gives up after MONGO_DRAIN_TIMEOUT and
    says how many wait and where; another node (MongoDB up) writes them, each once, though the
    first node's journal folder is gone."""
    with caplog.at_level(logging.INFO, logger="project.storage.store"):
        down, store = asyncio.run(
            _save(
                _dead_uri(),
                mongo.name,
                tmp_path / "j1",
                keys,
                redis_url,
                range(30),
                MONGO_DRAIN_TIMEOUT=1.5,
            )
        )
    gc.collect()
    assert down["mongo/outboxed"] == 30
    assert down.get("mongo/journaled", 0) == 0
    assert journal_backlog(tmp_path / "j1") == 0
    assert down["mongo/not_stored"] == 30 == store.not_stored
    assert down["mongo/not_stored/outbox"] == 30
    text = caplog.text
    assert "crawled, waiting for MongoDB" in text
    assert "crawled, not stored: MongoDB at mongodb://fleet:***@" in text
    assert f"30 records in the outbox {keys.outbox}:{mongo.name} of Redis" in text
    assert "fleetcrawl store drain --spider shop" in text
    assert "s3cret" not in text

    up, _ = asyncio.run(
        _save(services.mongo_url, mongo.name, tmp_path / "j2", keys, redis_url, range(20, 40))
    )
    assert up["mongo/drained"] == 30
    assert up.get("mongo/not_stored", 0) == 0
    ids = [doc["_id"] for doc in mongo.products.find({}, {"_id": 1})]
    assert len(ids) == len(set(ids)) == 40


def test_with_redis_away_too_items_are_journaled_and_move_to_the_outbox_when_it_answers(
    services: ServicesConfig, mongo: Database[Any], redis_url: str, keys: FrontierKeys,
    tmp_path: Path,
) -> None:  # fmt: skip
    journal = tmp_path / "j"
    dead_redis = f"redis://127.0.0.1:{free_port()}"
    down, _ = asyncio.run(
        _save(
            _dead_uri(), mongo.name, journal, keys, dead_redis, range(12), MONGO_DRAIN_TIMEOUT=1.0
        )
    )
    gc.collect()
    assert down["mongo/journaled"] == 12
    assert down.get("mongo/outboxed", 0) == 0
    assert down["mongo/not_stored/journal"] == 12

    # Redis answers now, MongoDB still does not: the journal goes where every node reaches it.
    moved, _ = asyncio.run(
        _save(_dead_uri(), mongo.name, journal, keys, redis_url, range(0), MONGO_DRAIN_TIMEOUT=1.0)
    )
    gc.collect()
    assert moved["mongo/journal_to_outbox"] == 12
    assert journal_backlog(journal) == 0
    assert moved["mongo/not_stored"] == 12

    up, _ = asyncio.run(
        _save(services.mongo_url, mongo.name, tmp_path / "other", keys, redis_url, range(0))
    )
    assert up["mongo/drained"] == 12
    assert mongo.products.count_documents({}) == 12


def test_malformed_outbox_entries_are_set_aside_and_counted(
    services: ServicesConfig, mongo: Database[Any], redis_url: str, keys: FrontierKeys,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Anyone who can reach Redis can push to the outbox: what is not a record costs itself."""
    import redis as blocking

    key = f"{keys.outbox}:{mongo.name}"
    with blocking.Redis.from_url(redis_url) as client:
        client.rpush(key, b"not json", json.dumps({"kind": "product", "id": 1}), b"\xff\xfe")
    with caplog.at_level(logging.ERROR, logger="project.storage.store"):
        up, _ = asyncio.run(
            _save(services.mongo_url, mongo.name, tmp_path / "j", keys, redis_url, range(3))
        )
    assert up["mongo/outbox_malformed"] == 3
    assert "3 entries of the outbox" in caplog.text
    with blocking.Redis.from_url(redis_url) as client:
        assert client.llen(key) == 0
        assert client.llen(f"{key}:malformed") == 3
    assert mongo.products.count_documents({}) == 3


def test_a_huge_outbox_entry_costs_a_stub_and_a_drainer_reads_a_bounded_batch(
    services: ServicesConfig, mongo: Database[Any], redis_url: str, keys: FrontierKeys,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A 70 MiB entry pushed by hand is never read whole by a node: a stub of it is set aside.
    Records of 1 MiB each are read about 8 MiB at a time, not 100 at once."""
    import redis as blocking

    key = f"{keys.outbox}:{mongo.name}"
    with blocking.Redis.from_url(redis_url) as client:
        client.rpush(key, b"x" * (70 * 1024 * 1024))
        client.incrby(f"{key}:bytes", 70 * 1024 * 1024)

    async def heads() -> list[int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            outbox = Outbox(client, key, max_bytes=2**40)
            records = [{"kind": "x", "n": n, "pad": "y" * (1024 * 1024)} for n in range(12)]
            assert await outbox.push(records)
            first = await outbox.head(100)
            return [len(entry) for entry in first]
        finally:
            await client.aclose()

    sizes = asyncio.run(heads())
    assert sizes[0] < 1024  # the stub, not the entry
    assert 1 + 7 <= len(sizes) <= 1 + 9  # about 8 MiB of the 1 MiB records
    with blocking.Redis.from_url(redis_url) as client:
        client.ltrim(key, 0, 0)  # leave the huge one only, then a node drains it
        client.set(f"{key}:bytes", 70 * 1024 * 1024)
    up, _ = asyncio.run(
        _save(services.mongo_url, mongo.name, tmp_path / "j", keys, redis_url, range(2))
    )
    assert up["mongo/outbox_malformed"] == 1
    with blocking.Redis.from_url(redis_url) as client:
        assert client.llen(key) == 0
        assert client.get(f"{key}:bytes") is None
        (stub,) = client.lrange(f"{key}:malformed", 0, -1)
        assert len(stub) < 1024
        assert b"oversized" in stub
        assert b"73400320" in stub  # how big it was
    assert mongo.products.count_documents({}) == 2


def test_fleetcrawl_store_drain_writes_what_a_node_left(
    services: ServicesConfig, mongo: Database[Any], redis_url: str, keyspace: KeySpace,
    tmp_path: Path,
) -> None:  # fmt: skip
    keys = keyspace.keys("shop")
    _left_without_mongodb(mongo.name, tmp_path / "j", keys, redis_url, range(25))
    env = {"REDIS_URL": redis_url, "MONGO_URI": services.mongo_url, "MONGO_DATABASE": mongo.name,
           "MONGO_JOURNAL_DIR": str(tmp_path / "cli-journal")}  # fmt: skip
    done = run_cli("store", "drain", "--spider", "shop", *keyspace.cli_args(), env=env)
    assert done.returncode == 0, done.stderr
    assert f"25 records of the outbox {keys.outbox}:{mongo.name}" in done.stdout
    assert mongo.products.count_documents({}) == 25
    again = run_cli("store", "drain", "--spider", "shop", *keyspace.cli_args(), env=env)
    assert again.returncode == 0
    assert "0 records of the outbox" in again.stdout

    # MongoDB still away: the command says so and exits 3, like a node that gave up
    _left_without_mongodb(mongo.name, tmp_path / "j", keys, redis_url, range(30, 32))
    away = run_cli("store", "drain", "--spider", "shop", "--timeout", "1", *keyspace.cli_args(),
                   env={**env, "MONGO_URI": _dead_uri()})  # fmt: skip
    assert away.returncode == 3
    assert "2 records still wait" in away.stderr
    assert "s3cret" not in away.stderr + away.stdout


def test_a_run_report_that_mongodb_cannot_take_waits_in_the_outbox(
    services: ServicesConfig, mongo: Database[Any], redis_url: str, keys: FrontierKeys,
    tmp_path: Path,
) -> None:  # fmt: skip
    nodes = {"n1": {"downloader/response_count": 12, "mongo/outboxed": 10, "mongo/inserted": 2}}

    async def run(uri: str) -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        outbox = Outbox(client, f"{keys.outbox}:{mongo.name}", max_bytes=1 << 20)
        settings = Settings({"MONGO_URI": uri, "MONGO_DATABASE": mongo.name,
                             "MONGO_SERVER_SELECTION_TIMEOUT": 1.0})  # fmt: skip
        report = await finish_run(settings, "shop", "shop-run-1", 1000.0, 1060.0, nodes,
                                  RunsConfig(), outbox=outbox)  # fmt: skip
        await client.aclose()
        return report

    report = asyncio.run(run(_dead_uri()))
    assert report is not None
    assert report["written_later"]
    assert report["items"]["stored"] is None
    assert report["items"]["gone"] == 0  # only what the nodes marked (page by page)
    assert mongo.crawl_runs.count_documents({}) == 0
    up, _ = asyncio.run(
        _save(services.mongo_url, mongo.name, tmp_path / "j", keys, redis_url, range(0))
    )
    assert up["mongo/drained"] == 1
    stored = mongo.crawl_runs.find_one({"_id": "shop-run-1"})
    assert stored is not None
    assert stored["pages"] == 12
    assert stored["items"]["waited"] == 10
    assert stored["started"].timestamp() == 1000.0


# --- real crawls: the fleet's nodes, a MongoDB that goes away -----------------------------------


@pytest.fixture
def own_mongo(tmp_path: Path) -> Iterator[ServicesConfig]:
    """A FerretDB of the test's own, started, for tests that stop it (same data on restart)."""
    cfg = ServicesConfig(state_dir=tmp_path / "state", mongo_port=free_port())
    start_mongo(cfg)
    yield cfg
    stop_service(cfg, "mongo")


def _stored(uri: str, database: str) -> list[str]:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        return [doc["_id"] for doc in client[database].products.find({}, {"_id": 1})]


def _count(uri: str, database: str) -> int:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        return client[database].products.count_documents({})


@pytest.mark.slow("MongoDB away from 30 % of a crawl until 8 s after its last page")
def test_a_crawl_that_ends_while_mongodb_is_away_is_stored_before_its_nodes_exit(
    fleet: Fleet, make_shop: Any, own_mongo: ServicesConfig, tmp_path: Path
) -> None:
    """Two nodes; MongoDB stops once 30 % of the products are stored and comes back 8 s after
    the last page: neither node exits before every item is in MongoDB, each once, and their
    journal folders (a container's disk, gone after it exits) hold nothing."""
    products = 300
    # 2 pages at a time a node, 150 ms each: about 13 s, most of it after MongoDB goes away
    shop = make_shop(products=products, latency_ms=150)
    fleet.mongo_url = own_mongo.mongo_url
    journals = [tmp_path / "journal0", tmp_path / "journal1"]
    for journal in journals:
        fleet.start_node(
            MONGO_JOURNAL_DIR=str(journal), MONGO_RETRY_MAX_DELAY=1.0,
            MONGO_SERVER_SELECTION_TIMEOUT=1.0, CONCURRENT_REQUESTS=2,
        )  # fmt: skip
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    wait_for(
        lambda: _count(own_mongo.mongo_url, fleet.mongo_db) >= products * 0.3,
        60, "30 % of the products stored", 0.05,
    )  # fmt: skip
    began = len(shop.stats()["product_hits"])
    assert stop_service(own_mongo, "mongo")
    stopped_at = len(shop.stats()["product_hits"])
    print(f"MongoDB stopping at {began} products fetched, stopped at {stopped_at}")
    wait_for(lambda: len(shop.stats()["product_hits"]) == products, 60, "every product fetched")
    wait_for(
        lambda: all("crawled, waiting for MongoDB" in fleet.log(i) for i in (0, 1)),
        60, "both nodes done and waiting", 0.2,
    )  # fmt: skip
    time.sleep(8)
    assert [proc.poll() for proc in fleet.procs] == [None, None], "a node left unstored items"
    start_mongo(own_mongo)
    codes = fleet.wait(120)
    assert codes == [0, 0], [fleet.log(i)[-3000:] for i in (0, 1)]
    for journal in journals:  # the nodes' disks are gone: nothing may have been left there
        assert journal_backlog(journal) == 0
        shutil.rmtree(journal, ignore_errors=True)

    stored = _stored(own_mongo.mongo_url, fleet.mongo_db)
    print(f"MongoDB stopped at {stopped_at} of {products} products fetched; stored {len(stored)}")
    assert stopped_at < products, "the outage began before the crawl's end"
    assert len(stored) == len(set(stored)) == products
    total = {key: fleet.stat(0, key) + fleet.stat(1, key)
             for key in ("mongo/outboxed", "mongo/drained", "mongo/inserted", "mongo/updated",
                         "mongo/unchanged", "mongo/stale", "mongo/journaled", "mongo/not_stored")}  # fmt: skip
    assert total["mongo/outboxed"] > 0
    assert total["mongo/drained"] == total["mongo/outboxed"]
    # a batch MongoDB took as it went away, its answer lost, goes to the outbox too: written
    # again, it finds its products stored (unchanged), never a second copy
    assert total["mongo/inserted"] <= products, total
    seen_once = total["mongo/inserted"] + total["mongo/unchanged"] + total["mongo/stale"]
    assert seen_once >= products, total
    assert total["mongo/updated"] == 0, "nothing rewritten"
    assert total["mongo/not_stored"] == 0
    with pymongo.MongoClient(own_mongo.mongo_url, serverSelectionTimeoutMS=5000) as client:
        reports = list(client[fleet.mongo_db].crawl_runs.find())
    assert len(reports) == 1, "the run's report is stored"
    assert reports[0]["items"]["stored"] == products


@pytest.mark.crawl
def test_a_node_that_cannot_store_exits_3_and_store_drain_writes_what_it_crawled(
    fleet: Fleet, make_shop: Any, own_mongo: ServicesConfig, tmp_path: Path
) -> None:
    """MongoDB away past MONGO_DRAIN_TIMEOUT: the node exits 3, "crawled, not stored", says how
    many wait and where; its journal folder deleted, `fleetcrawl store drain` stores them all."""
    products = 20
    shop = make_shop(products=products)
    fleet.mongo_url = own_mongo.mongo_url
    assert stop_service(own_mongo, "mongo")
    journal = tmp_path / "journal"
    fleet.start_node(MONGO_JOURNAL_DIR=str(journal), MONGO_DRAIN_TIMEOUT=2.0,
                     MONGO_SERVER_SELECTION_TIMEOUT=1.0)  # fmt: skip
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    assert fleet.wait(90) == [3], fleet.log(0)[-3000:]
    log, stats = fleet.log(0), fleet.stats(0)
    assert "crawled, not stored: MongoDB at" in log
    assert f"in the outbox {fleet.keys.outbox}:{fleet.mongo_db} of Redis" in log
    assert stats["mongo/not_stored"] == stats["mongo/outboxed"] >= products
    assert stats.get("mongo/journaled", 0) == 0
    shutil.rmtree(journal)

    start_mongo(own_mongo)
    env = {"REDIS_URL": fleet.redis_url, "MONGO_URI": own_mongo.mongo_url,
           "MONGO_DATABASE": fleet.mongo_db, "MONGO_JOURNAL_DIR": str(tmp_path / "cli")}  # fmt: skip
    done = run_cli("store", "drain", "--spider", fleet.spider, *fleet.space.cli_args(), env=env)
    assert done.returncode == 0, done.stderr
    assert len(set(_stored(own_mongo.mongo_url, fleet.mongo_db))) == products


@pytest.mark.slow("two crawls of 150 products; MongoDB away and a node killed in the second")
def test_items_a_killed_node_saw_while_mongodb_was_away_are_not_marked_gone(
    fleet: Fleet, make_shop: Any, own_mongo: ServicesConfig, tmp_path: Path
) -> None:
    """A node killed while MongoDB is away takes nothing with it: what it saw waits in the
    outbox, the other node stores it before the run ends, and the run (every page under a
    revisit policy, so it marks what it did not see gone) saw every product. With the outbox
    off (the journal on the killed node's disk, as before) 10 of 150 kept the first crawl's
    last_seen: their sightings died with the node."""
    shop = make_shop(150, latency_ms=100)
    fleet.mongo_url = own_mongo.mongo_url
    fleet.settings.update({"FRONTIER_REVISIT": {".": "1s"}, "MONGO_RETRY_MAX_DELAY": 1.0,
                           "MONGO_SERVER_SELECTION_TIMEOUT": 1.0, "CONCURRENT_REQUESTS": 2})  # fmt: skip
    fleet.start_node(MONGO_JOURNAL_DIR=str(tmp_path / "j0"))
    fleet.seed(shop.url("/"))
    assert fleet.procs[0].wait(180) == 0, fleet.log(0)[-3000:]
    assert _count(own_mongo.mongo_url, fleet.mongo_db) == 150
    time.sleep(1.2)  # every page due again

    shop.reset()
    fleet.start_node(MONGO_JOURNAL_DIR=str(tmp_path / "j1"))
    fleet.start_node(MONGO_JOURNAL_DIR=str(tmp_path / "j2"))
    with fleet.client() as client:  # node0 is done: wait_ready would count its exit
        wait_for(lambda: int(client.zcard(fleet.keys.holders)) >= 2, 60, "two nodes stepping")
    fleet.seed(shop.url("/"))
    wait_for(lambda: len(shop.stats()["product_hits"]) >= 20, 60, "the second crawl under way")
    assert stop_service(own_mongo, "mongo")
    outbox = f"{fleet.keys.outbox}:{fleet.mongo_db}"
    with fleet.client() as client:
        wait_for(lambda: int(client.llen(outbox)) >= 10, 60, "records in the outbox", 0.1)
    wait_for(lambda: "MongoDB unreachable" in fleet.log(1), 30, "node1 without MongoDB", 0.1)
    time.sleep(1.0)
    fleet.kill(1)  # what it acknowledged since MongoDB went away is only in the outbox
    start_mongo(own_mongo)
    assert fleet.procs[2].wait(180) == 0, fleet.log(2)[-3000:]

    with pymongo.MongoClient(own_mongo.mongo_url, serverSelectionTimeoutMS=5000) as client:
        db = client[fleet.mongo_db]
        run = fleet.stats(2)["run/id"]
        report = db.crawl_runs.find_one({"_id": run})
        gone = db.products.count_documents({"gone_at": {"$exists": True}})
        started = report["started"] if report else None
        stale = db.products.count_documents({"last_seen": {"$lt": started}}) if started else -1
    assert report is not None, "the second run's report is stored"
    assert fleet.stat(2, "mongo/drained") > 0
    assert gone == 0, f"{gone} live products marked gone"
    assert report["items"]["gone"] == 0
    assert stale == 0, "every product was seen by the second run"
