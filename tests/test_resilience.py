"""Nothing is lost when nodes die, Redis restarts, seeds are bad or pages flaky."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from project.ops.services import start_redis, stop_service
from tests.fleet import wait_for

if TYPE_CHECKING:
    import redis

    from project.ops.services import ServicesConfig
    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl


def _leased_listing(client: redis.Redis, fleet: Fleet) -> bool:
    return any(b"/category/" in m for m in client.zrange(fleet.keys.inflight, 0, -1))


def _products_stored(mongo, count: int):
    return lambda: mongo.products.estimated_document_count() >= count


def _assert_every_product_once(shop, mongo, products: int) -> None:
    assert mongo.products.count_documents({}) == products
    stored = {doc["sku"] for doc in mongo.products.find({}, {"sku": 1})}
    assert stored == {p["sku"] for p in shop.catalogue()["products"]}
    hits = shop.stats()["product_hits"]
    assert len(hits) == products, "a product page was never fetched"


@pytest.mark.parametrize("moment", ["leased_listing", "mid_crawl", "late"])
def test_kill_9_loses_nothing(fleet: Fleet, make_shop, mongo, redis_client, moment) -> None:
    products = 300
    shop = make_shop(products=products, latency_ms=30)
    fleet.seed(shop.url("/"))
    victim = fleet.start_node()
    if moment == "leased_listing":
        wait_for(lambda: _leased_listing(redis_client, fleet), 30, "a leased listing page", 0.005)
    elif moment == "mid_crawl":
        wait_for(_products_stored(mongo, products // 3), 60, "a third of the products")
    else:
        wait_for(_products_stored(mongo, products * 9 // 10), 90, "most products")
    assert victim.poll() is None, "the crawl ended before the kill: make it larger"
    victim.kill()
    victim.wait(10)
    held = redis_client.zcard(fleet.keys.inflight)
    fleet.start_node()
    fleet.start_node()
    codes = fleet.wait(180)
    assert codes[1:] == [0, 0]
    _assert_every_product_once(shop, mongo, products)
    if held:
        assert fleet.stat(1, "frontier/reaped") + fleet.stat(2, "frontier/reaped") >= 1


def test_redis_restart_mid_crawl(fleet: Fleet, make_shop, mongo, services: ServicesConfig) -> None:
    products = 300
    shop = make_shop(products=products, latency_ms=20)
    fleet.seed(shop.url("/"))
    fleet.start_node()
    fleet.start_node()
    wait_for(_products_stored(mongo, products // 4), 60, "a quarter of the products")
    stop_service(services, "redis")
    assert mongo.products.count_documents({}) < products, "done before the restart: make it larger"
    time.sleep(3)  # the outage
    start_redis(services)
    assert fleet.wait(240) == [0, 0]
    _assert_every_product_once(shop, mongo, products)
    errors = fleet.stat(0, "frontier/redis_errors") + fleet.stat(1, "frontier/redis_errors")
    assert errors >= 1, "the restart went unnoticed"


class _RestartingRedis:
    """A TCP proxy to Redis that, until :meth:`recover`, answers PING and then closes the
    connection at the next command: what a node sees of a Redis that restarts the moment it
    has reached it."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.recovered = threading.Event()
        self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def recover(self) -> None:
        self.recovered.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.target)) as server:
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()
            while data := client.recv(65536):
                handshake = any(word in data.upper() for word in (b"PING", b"HELLO", b"CLIENT"))
                if not self.recovered.is_set() and not handshake:
                    self.cut += 1
                    return
                server.sendall(data)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def test_a_redis_that_goes_away_as_a_node_sets_up_is_waited_for(
    fleet: Fleet, make_shop, mongo, services: ServicesConfig
) -> None:
    """Redis answers the node's PING, then drops it (a restart): the node sets up again
    once Redis is back and crawls; it did nothing, for ever, before."""
    products = 30
    shop = make_shop(products=products)
    proxy = _RestartingRedis(services.redis_port)
    try:
        fleet.seed(shop.url("/"))
        fleet.redis_url = f"redis://127.0.0.1:{proxy.port}/0"
        fleet.start_node()
        wait_for(lambda: "went away while this node set up" in fleet.log(0), 30, "a retry")
        proxy.recover()
        assert fleet.wait(120) == [0]
    finally:
        proxy.close()
    assert proxy.cut > 0
    _assert_every_product_once(shop, mongo, products)


def test_bad_seeds_are_dead_lettered_and_good_ones_crawled(
    fleet: Fleet, make_shop, mongo, redis_client
) -> None:
    shop = make_shop(products=40)
    good = [shop.url(p["url"]) for p in shop.catalogue()["products"][:5]]
    bad: list[str | bytes] = [
        "not a url",
        json.dumps({"url": 5}),
        "",
        b"\xff\xfe\x00garbage",
        b"x" * 10_000_000,  # through redis-py: too long for a command line
        json.dumps({"url": shop.url("/"), "priority": "high"}),
        "[1, 2, 3]",
    ]
    # Interleaved so that every seed batch mixes good and bad ones.
    for good_seed, bad_seed in zip(good, bad, strict=False):
        fleet.seed(good_seed, bad_seed)
    fleet.seed(*bad[len(good) :])
    fleet.start_node(FRONTIER_SEED_BATCH=2)
    fleet.start_node(FRONTIER_SEED_BATCH=2)
    assert fleet.wait(120) == [0, 0]

    hits = shop.stats()["hits"]
    for url in good:
        assert hits.get(urlsplit(url).path) == 1
    dead = [json.loads(r) for r in redis_client.lrange(fleet.keys.dead, 0, -1)]
    assert len(dead) == len(bad)
    assert {d["kind"] for d in dead} == {"seed"}
    assert all(len(d["url"]) < 300 for d in dead), "a huge seed was stored whole"
    rejected = sum(fleet.stat(i, "frontier/seeds/rejected") for i in (0, 1))
    assert rejected == len(bad)
    for index in (0, 1):
        assert fleet.stats(index)["finish_reason"] == "finished"
        assert "x" * 1000 not in fleet.log(index), "a huge seed was logged whole"
    assert mongo.failures.count_documents({"kind": "seed"}) == len(bad)


def test_flaky_pages_are_retried_then_dead_lettered(
    fleet: Fleet, make_shop, mongo, redis_client
) -> None:
    shop = make_shop(products=200, flaky_share=0.1, flaky_failures=2, broken_share=0.05)
    expected = shop.stats()["expected"]
    fleet.seed(shop.url("/"))
    fleet.start_node(RETRY_TIMES=2, FRONTIER_RETRY_BACKOFF_BASE=0.3)
    fleet.start_node(RETRY_TIMES=2, FRONTIER_RETRY_BACKOFF_BASE=0.3)
    assert fleet.wait(180) == [0, 0]

    hits = shop.stats()["product_hits"]
    for pid in expected["flaky"]:
        assert hits[str(pid)] == 3, "a flaky page: two 503s, then stored"
    for pid in expected["broken"]:
        assert hits[str(pid)] == 3, "a broken page: three attempts, then dead"
    stored = {doc["_id"].rsplit("/", 1)[1] for doc in mongo.products.find({}, {"_id": 1})}
    assert {str(pid) for pid in expected["flaky"]} <= stored
    assert not {str(pid) for pid in expected["broken"]} & stored
    dead = [json.loads(r) for r in redis_client.lrange(fleet.keys.dead, 0, -1)]
    assert sorted(int(d["url"].rsplit("/", 1)[1]) for d in dead) == sorted(expected["broken"])
    assert {(d["attempts"], d["error"]) for d in dead} == {(3, "HTTP 503")}
    assert mongo.failures.count_documents({"kind": "request"}) == len(expected["broken"])


def test_a_node_whose_clock_is_120s_ahead_reaps_no_live_lease(
    fleet: Fleet, make_shop, mongo
) -> None:
    """Leases, retries and token buckets run on Redis' clock, not the node's."""
    products = 300
    shop = make_shop(products=products, latency_ms=30)
    fleet.seed(shop.url("/"))
    fleet.start_node()
    fleet.start_node("faketime", "-f", "+120s")
    assert fleet.wait(180) == [0, 0]
    _assert_every_product_once(shop, mongo, products)
    for index in (0, 1):
        assert fleet.stat(index, "frontier/reaped") == 0, f"node{index} reaped a live lease"
        assert fleet.stat(index, "frontier/dispatched") > 0, f"node{index} did no work"
    assert max(shop.stats()["hits"].values()) == 1
