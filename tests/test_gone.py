"""Gone means gone: an item is marked gone only on evidence about it (issue 26, cases a-e).

Each test is two crawls of the epochs shop by real ``scrapy crawl`` nodes, the shop unchanged
between them, so nothing is gone and any gone mark is a lie; and one where a product really
was removed, so the evidence still marks what it should. Each case failed before the sweep of
"everything not seen this run" was replaced by per-page evidence (project/frontier/revisit.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from tests.fleet import WAIT_FOR_SEED, Fleet, run_cli, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    import pymongo.database

    from tests.site.server import ShopServer

#: Every page may be fetched again a second after its last fetch.
REVISIT_ALL = {"FRONTIER_REVISIT": {".": "1s"}}
_PRODUCTS = 40


def _shop(make_shop: Any, products: int = _PRODUCTS, **options: Any) -> ShopServer:
    """The epochs shop, its next epoch the same as this one unless *options* say otherwise."""
    shares = {"epoch_price_share": 0, "epoch_stock_share": 0, "epoch_added": 0,
              "epoch_removed": 0}  # fmt: skip
    return make_shop(products, **{**shares, **options})


def _crawl(fleet: Fleet, seed: str, nodes: int = 2, **settings: Any) -> list[int]:
    """One crawl from *seed* by *nodes* fresh nodes; the indexes of their logs and stats."""
    first = len(fleet.procs)
    for _ in range(nodes):
        fleet.start_node(**settings)
    fleet.seed(seed)
    codes = [proc.wait(180) for proc in fleet.procs[first:]]
    assert codes == [0] * nodes, fleet.log(first)[-3000:]
    return list(range(first, first + nodes))


def _gone(mongo: pymongo.database.Database[Any]) -> int:
    return mongo["products"].count_documents({"gone_at": {"$exists": True}})


def _report(fleet: Fleet, mongo: pymongo.database.Database[Any], node: int) -> dict[str, Any]:
    report = mongo["crawl_runs"].find_one({"_id": fleet.stats(node)["run/id"]})
    assert report is not None, "the run's report is stored"
    return report


def _sum(fleet: Fleet, nodes: list[int], key: str) -> int:
    return sum(fleet.stat(i, key) for i in nodes)


def test_a_seed_that_answers_503_for_one_crawl_marks_nothing_gone(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """Case a: before, the front page's 503 left every product unseen, and all were marked."""
    shop = _shop(make_shop)
    fleet.settings.update(REVISIT_ALL, RETRY_TIMES=0)
    _crawl(fleet, shop.url("/"))
    assert mongo["products"].count_documents({}) == _PRODUCTS
    shop.fail("/", 503)
    time.sleep(1.2)  # every page due again
    second = _crawl(fleet, shop.url("/"))
    assert _sum(fleet, second, "frontier/dead") == 1  # the seed, dead-lettered
    assert _gone(mongo) == 0, "live products marked gone"
    report = _report(fleet, mongo, second[0])
    assert report["items"]["gone"] == 0
    assert report["items"]["stored"] == _PRODUCTS
    # the sweep fetched the due products the front page no longer led to: seen, not gone
    assert _sum(fleet, second, "revisit/not_modified") == _PRODUCTS
    assert mongo["products"].count_documents({"last_seen": {"$lt": report["started"]}}) == 0


def test_listings_due_later_than_their_products_keep_the_products_alive(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """Case b: a listing not due returns only its own record, its products are never
    rediscovered; before, all of them were marked gone. Now the run fetches them when they
    are due, whatever led to them (FRONTIER_REVISIT_SWEEP)."""
    shop = _shop(make_shop)
    fleet.settings.update(FRONTIER_REVISIT={"/category/": "1d", "/product/": "1s", "/$": "1s"})
    _crawl(fleet, shop.url("/"))
    time.sleep(1.2)
    shop.reset()
    second = _crawl(fleet, shop.url("/"))
    assert _sum(fleet, second, "revisit/not_due") > 0  # the listings, rediscovered early
    assert _sum(fleet, second, "revisit/not_modified") == _PRODUCTS
    assert len(shop.stats()["product_hits"]) == _PRODUCTS
    assert _gone(mongo) == 0, "live products marked gone"
    assert _report(fleet, mongo, second[0])["items"]["gone"] == 0


def test_a_crawl_of_one_page_after_a_clear_marks_nothing_else_gone(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """Case c: after `fleetcrawl clear`, the fresh seen-set made the run "whole", so every
    product it was not seeded with (here: all but one) was marked gone."""
    shop = _shop(make_shop)
    _crawl(fleet, shop.url("/"))
    assert mongo["products"].count_documents({}) == _PRODUCTS
    env = {"REDIS_URL": fleet.redis_url}
    space = [
        arg for name, value in fleet.space.settings.items() for arg in ("-s", f"{name}={value}")
    ]
    cleared = run_cli("clear", "products", *space, env=env)
    assert cleared.returncode == 0, cleared.stderr
    assert "keys of products's frontier" in cleared.stdout
    with fleet.client() as client:
        assert client.scard(fleet.keys.dupefilter) == 0, "the seen-set is gone"
    product = shop.catalogue()["products"][0]["id"]
    second = _crawl(fleet, shop.url(f"/product/{product}"))
    assert _sum(fleet, second, "mongo/unchanged") == 1  # the one product, seen again
    assert _gone(mongo) == 0, "products the crawl was not seeded with marked gone"
    assert _report(fleet, mongo, second[0])["items"]["gone"] == 0


class _Proxy:
    """A TCP proxy to one address that can be cut: MongoDB gone for one node only."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_off = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut_off:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.close()

    def cut(self) -> None:
        self.cut_off = True
        self.server.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass


def test_items_a_killed_node_journaled_are_not_marked_gone(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Path
) -> None:
    """Case d: a node that journals (MongoDB gone for it alone, the outbox off) and is then
    killed takes its mongo/journaled count with it; before, the run looked whole and what it
    journaled was marked gone."""
    shop = _shop(make_shop, 60, latency_ms=50)
    fleet.settings.update(REVISIT_ALL)
    _crawl(fleet, shop.url("/"), nodes=1)
    assert mongo["products"].count_documents({}) == 60
    time.sleep(1.2)
    shop.reset()
    host, port = fleet.mongo_url.rsplit("/", 1)[0].split("//", 1)[1].rsplit(":", 1)
    proxy = _Proxy(host, int(port))
    cut_uri = fleet.mongo_url.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}")
    fleet.start_node(MONGO_URI=cut_uri, MONGO_OUTBOX_MAX_BYTES=0, MONGO_RETRY_MAX_DELAY=1.0,
                     MONGO_SERVER_SELECTION_TIMEOUT=1.0, CONCURRENT_REQUESTS=2,
                     MONGO_JOURNAL_DIR=str(tmp_path / "j1"), **WAIT_FOR_SEED)  # fmt: skip
    fleet.start_node(CONCURRENT_REQUESTS=2, **WAIT_FOR_SEED)
    with fleet.client() as client:  # node0 is done: wait_ready would count its exit
        wait_for(lambda: int(client.zcard(fleet.keys.holders)) >= 2, 60, "two nodes stepping")
    fleet.seed(shop.url("/"))
    wait_for(lambda: len(shop.stats()["product_hits"]) >= 10, 60, "the second crawl under way")
    proxy.cut()
    wait_for(lambda: "journaling to" in fleet.log(1), 30, "node1 journaling")
    time.sleep(2.0)  # it journals what it fetches meanwhile
    fleet.kill(1)
    assert fleet.procs[2].wait(180) == 0, fleet.log(2)[-3000:]
    assert _gone(mongo) == 0, "products the killed node journaled marked gone"
    assert _report(fleet, mongo, 2)["items"]["gone"] == 0


def test_a_node_whose_clock_is_behind_redis_makes_nothing_look_old(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """Case e: a run's start is Redis' time and an item's last_seen was its node's; a node
    two minutes behind made what it saw look older than the run, and it was marked gone.
    Now what a node stores is stamped by Redis' clock (project/frontier/clock.py)."""
    shop = _shop(make_shop, latency_ms=20)
    fleet.settings.update(REVISIT_ALL, CONCURRENT_REQUESTS=2)
    _crawl(fleet, shop.url("/"), nodes=1)
    time.sleep(1.2)
    first = len(fleet.procs)
    fleet.start_node("faketime", "-f", "-120s", **WAIT_FOR_SEED)
    fleet.start_node(**WAIT_FOR_SEED)
    with fleet.client() as client:  # node0 is done: wait_ready would count its exit
        wait_for(lambda: int(client.zcard(fleet.keys.holders)) >= 2, 60, "two nodes stepping")
    fleet.seed(shop.url("/"))
    assert [proc.wait(180) for proc in fleet.procs[first:]] == [0, 0], fleet.log(first)[-3000:]
    assert fleet.stat(first, "mongo/touched") > 0, "the node behind stored sightings"
    assert _gone(mongo) == 0, "live products marked gone"
    report = _report(fleet, mongo, first + 1)
    assert report["items"]["gone"] == 0
    assert mongo["products"].count_documents({"last_seen": {"$lt": report["started"]}}) == 0


def test_a_removed_product_is_gone_on_its_own_evidence(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """The evidence still marks what is gone: a product removed between two crawls is no
    longer linked, the run's sweep fetches its page (a 404) and marks it, and nothing else."""
    shop = _shop(make_shop, epoch_removed=0.05)
    fleet.settings.update(REVISIT_ALL)
    _crawl(fleet, shop.url("/"))
    shop.set_epoch(1)
    removed = shop.changes()["removed"]
    assert removed
    time.sleep(1.2)
    second = _crawl(fleet, shop.url("/"))
    gone = {doc["_id"] for doc in mongo["products"].find({"gone_at": {"$exists": True}})}
    assert gone == {shop.url(f"/product/{i}") for i in removed}
    assert _sum(fleet, second, "mongo/gone") == len(removed)
    changes = mongo["changes"].count_documents({"field": "gone_at"})
    assert changes == len(removed)


def test_a_node_that_starts_after_the_crawl_ended_fetches_nothing_again(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any]
) -> None:
    """The sweep is a run's last act, by nodes that saw its crawl: a node started late (a
    scrapyd job slow to start) finds no crawl and must not fetch the due catalogue again in a
    run of its own."""
    shop = _shop(make_shop)
    fleet.settings.update(REVISIT_ALL)
    _crawl(fleet, shop.url("/"), nodes=1)
    time.sleep(1.2)  # every page due again
    shop.reset()
    late = fleet.start_node()
    assert late.wait(60) == 0, fleet.log(1)[-3000:]
    assert shop.stats()["product_hits"] == {}
    assert mongo["crawl_runs"].count_documents({}) == 1
