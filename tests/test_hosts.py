"""Nodes on hosts of their own: Redis, MongoDB, the shop and each node in a network namespace
(tests/netns.py), so nodes share nothing but the network, and a partition is a real one."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import pytest

from tests.fleet import FAST_SETTINGS, WAIT_FOR_SEED, wait_for
from tests.netns import Network
from tests.site.stats import open_at_once

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from tests.netns import NetnsFleet, NetnsShop

pytestmark = [
    pytest.mark.crawl,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need root and iproute2",
    ),
]

_CRAWLED = re.compile(r"Crawled \(\d+\) <GET ([^>]+)>")
_WRITES = ("mongo/inserted", "mongo/updated", "mongo/unchanged", "mongo/stale")


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    """This test's hosts; every process and namespace is gone afterwards, or the test errs."""
    with Network(tmp_path) as net:
        yield net


def _services(network: Network, products: int, **shop: Any) -> tuple[str, str, NetnsShop]:
    return network.start_redis(), network.start_mongo(), network.start_shop(products, **shop)


def _node_id(fleet: NetnsFleet, index: int) -> str:
    found = re.search(r"Frontier node (\S+) on", fleet.log(index))
    assert found, fleet.log(index)[-2000:]
    return found.group(1)


def _leases(client: redis.Redis, fleet: NetnsFleet, node: str) -> list[str]:
    """URLs of the requests *node* holds leases on (in-flight ``<node>\\nR<site>\\n<payload>``)."""
    prefix = node.encode() + b"\nR"
    members = cast("list[bytes]", client.zrange(fleet.keys.inflight, 0, -1))
    return [json.loads(m.split(b"\n", 2)[2])["url"] for m in members if m.startswith(prefix)]


def _wait_mid_crawl(client: redis.Redis, db: Any, fleet: NetnsFleet, node: str) -> None:
    """Until *node* holds two leases or more and 20 products are stored."""

    def working() -> bool:
        stored = db.products.estimated_document_count()
        return stored >= 20 and len(_leases(client, fleet, node)) >= 2

    wait_for(working, 60, f"{node} holding leases mid-crawl", 0.01)


def _crawling(
    network: Network, products: int, latency_ms: int, nodes: int, **settings: Any
) -> tuple[NetnsShop, NetnsFleet, redis.Redis, Any]:
    """*nodes* nodes crawling a shop of *products* (6 downloads at once), node0 mid-crawl."""
    redis_url, mongo_url, shop = _services(network, products, latency_ms=latency_ms)
    fleet = network.fleet(
        redis_url, mongo_url, settings={"FRONTIER_SITE_CONCURRENCY": 6, **WAIT_FOR_SEED, **settings}
    )
    client = network.redis(redis_url)
    db = network.mongo(mongo_url)[fleet.mongo_db]
    for i in range(nodes):
        fleet.start_node(USER_AGENT=f"node{i}")  # the shop's timeline says who sent what
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    _wait_mid_crawl(client, db, fleet, _node_id(fleet, 0))
    return shop, fleet, client, db


def _target(url: str) -> str:
    """*url* as the shop counts it: path and query."""
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def _total(fleet: NetnsFleet, key: str) -> int:
    return sum(fleet.stat(i, key) for i in range(len(fleet.procs)))


def _assert_every_product_once(shop: NetnsShop, db: Any, products: int) -> None:
    assert db.products.count_documents({}) == products
    skus = [doc["sku"] for doc in db.products.find({}, {"sku": 1})]
    assert len(set(skus)) == products
    assert set(skus) == {p["sku"] for p in shop.catalogue()["products"]}


def test_three_nodes_on_three_hosts_fetch_and_store_every_product_once(network: Network) -> None:
    products = 200
    redis_url, mongo_url, shop = _services(network, products, latency_ms=20)
    fleet = network.fleet(
        redis_url, mongo_url, settings={"FRONTIER_SITE_CONCURRENCY": 12, **WAIT_FOR_SEED}
    )
    client = network.redis(redis_url)
    for _ in range(3):
        fleet.start_node()
    fleet.wait_ready()

    # Each node is a host of its own: its own network namespace, its own address at Redis.
    namespaces = {Path(f"/proc/{proc.pid}/ns/net").readlink() for proc in fleet.procs}
    assert len(namespaces) == 3
    assert Path("/proc/self/ns/net").readlink() not in namespaces
    peers = {entry["addr"].rsplit(":", 1)[0] for entry in client.client_list()}
    assert {fleet.host(i).address for i in range(3)} <= peers

    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0, 0], [fleet.log(i)[-3000:] for i in range(3)]

    stats = shop.stats()
    assert len(stats["product_hits"]) == products
    assert max(stats["hits"].values()) == 1, "a page was fetched twice"
    _assert_every_product_once(shop, network.mongo(mongo_url)[fleet.mongo_db], products)
    assert _total(fleet, "mongo/inserted") == products
    for index in range(3):
        assert fleet.stats(index)["finish_reason"] == "finished"
        assert fleet.stat(index, "downloader/response_count") > 0, f"node{index} did nothing"


@pytest.mark.slow("a 30 s partition is what it proves")
def test_a_node_cut_off_from_redis_for_30s_loses_its_leases_and_comes_back_clean(
    network: Network,
) -> None:
    products = 200
    # DEBUG: "Crawled" lines say which node fetched what.
    shop, fleet, client, db = _crawling(network, products, 100, 3, LOG_LEVEL="DEBUG")
    node0 = _node_id(fleet, 0)

    network.cut("node0", "redis")
    cut_at, cut_wall = time.monotonic(), time.time()
    print(f"node0 cut off from Redis at {time.strftime('%H:%M:%S')}")
    held = _leases(client, fleet, node0)  # node0 can change none of them any more
    assert held
    time.sleep(max(0.0, cut_at + 30 - time.monotonic()))
    # The others reaped node0's leases and finished the crawl without it.
    others = [fleet.procs[i].poll() for i in (1, 2)]
    stored_while_cut = db.products.count_documents({})
    healed_wall = time.time()
    network.heal("node0", "redis")
    print(f"node0 reaches Redis again at {time.strftime('%H:%M:%S')}")

    codes = fleet.wait(90)
    log = fleet.log(0)
    assert codes == [0, 0, 0], [fleet.log(i)[-3000:] for i in range(3)]
    assert others == [0, 0], "the crawl did not finish while node0 was cut off"
    assert stored_while_cut == products
    assert _total(fleet, "frontier/reaped") == len(held)
    crawled_by_others = set(_CRAWLED.findall(fleet.log(1))) | set(_CRAWLED.findall(fleet.log(2)))
    assert set(held) <= crawled_by_others

    # node0 saw the outage, came back and finished; it stored nothing twice.
    assert "Traceback" not in log
    assert "Redis unreachable at" in log
    assert "Redis reachable again" in log
    assert fleet.stat(0, "frontier/redis_errors") >= 1
    assert fleet.stats(0)["finish_reason"] == "finished"
    _assert_every_product_once(shop, db, products)
    hits = shop.stats()["hits"]
    twice = {path for path, n in hits.items() if n > 1}
    assert twice <= {_target(url) for url in held}, "only node0's leases went twice"
    assert _total(fleet, "mongo/inserted") == products
    assert _total(fleet, "mongo/updated") == 0
    refetched = sum(1 for path in twice if path.startswith("/product/"))
    assert _total(fleet, "mongo/unchanged") + _total(fleet, "mongo/stale") == refetched

    # Counted at the shop: never more than the cap open, whoever held the permits.
    timeline = shop.timeline()
    assert {agent for *_, agent in timeline} == {"node0", "node1", "node2"}
    assert open_at_once(timeline) <= 6
    # node0 started nothing once its last round trip was half a lease old (it may have been
    # up to a tick before the cut), until it reached Redis again
    lease, beat = (
        FAST_SETTINGS["FRONTIER_LEASE_SECONDS"],
        FAST_SETTINGS["FRONTIER_HEARTBEAT_SECONDS"],
    )
    late = [
        (round(arrival - cut_wall, 3), path)
        for arrival, _, path, agent in timeline
        if agent == "node0" and cut_wall + lease / 2 + 0.5 < arrival < healed_wall
    ]
    assert not late, late
    # what node0 held went to the others only once its leases could have expired: its last
    # heartbeat before the cut extended them by a lease
    held_paths = {_target(url) for url in held}
    early = [
        (round(arrival - cut_wall, 3), path, agent)
        for arrival, _, path, agent in timeline
        if path in held_paths and agent != "node0" and arrival < cut_wall + lease - beat - 0.5
    ]
    assert not early, early


@pytest.mark.slow("pymongo notices a cut at its next heartbeat (10 s): a 25 s crawl outlasts it")
def test_a_node_cut_off_from_mongodb_sends_its_items_through_the_outbox(network: Network) -> None:
    """Cut from MongoDB but not from Redis, a node's items wait in the fleet's outbox, not on
    its disk, and the node whose MongoDB answers writes them."""
    products = 300
    # 330 pages at 6 at a time, 450 ms each: about 25 s, outlasting the cut and its detection.
    shop, fleet, _, db = _crawling(network, products, 450, 2)

    network.cut("node0", "mongo")
    print(f"node0 cut off from MongoDB at {time.strftime('%H:%M:%S')}")
    # pymongo notices at its next heartbeat (10 s) at the latest, plus its 3 s connect timeout.
    wait_for(lambda: "MongoDB unreachable" in fleet.log(0), 30, "node0 without MongoDB", 0.1)
    # node1 checks the outbox every 2 s: healed sooner, node0 may write it all itself
    wait_for(lambda: "records of the outbox" in fleet.log(1), 30, "node1 draining", 0.1)
    assert [proc.poll() for proc in fleet.procs] == [None, None], "the crawl ended while cut"
    network.heal("node0", "mongo")
    print(f"node0 reaches MongoDB again at {time.strftime('%H:%M:%S')}")

    codes = fleet.wait(120)
    assert codes == [0, 0], [fleet.log(i)[-3000:] for i in range(2)]
    log, stats = fleet.log(0), fleet.stats(0)
    assert "Traceback" not in log
    assert "MongoDB unreachable" in log
    assert "MongoDB back, writing to it directly again" in log
    assert stats["mongo/outboxed"] > 0
    assert stats.get("mongo/journaled", 0) == 0, "Redis took them: nothing on node0's disk"
    assert _total(fleet, "mongo/drained") == stats["mongo/outboxed"]
    assert fleet.stat(1, "mongo/drained") > 0, "node1 wrote what node0 could not"
    assert stats["mongo/journal_backlog"] == 0
    assert _total(fleet, "mongo/not_stored") == 0

    _assert_every_product_once(shop, db, products)
    shop_stats = shop.stats()
    assert len(shop_stats["product_hits"]) == products
    assert max(shop_stats["hits"].values()) == 1, "a page was fetched twice"
    # Each product written once by the fleet's count: none twice, whatever the outbox did.
    assert sum(_total(fleet, key) for key in _WRITES) == products
    assert _total(fleet, "mongo/updated") + _total(fleet, "mongo/stale") == 0
