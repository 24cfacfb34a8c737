"""Recurring crawls of a shop that changes: revisits, 304s, change history, gone items, the
run report and its alerts, a keep-alive fleet that revisits on its own, a Bloom-mode crawl.
Every crawl is real ``scrapy crawl`` processes against the test shop, Redis and FerretDB."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
import redis

from tests.fleet import WAIT_FOR_SEED, Fleet, run_cli, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pymongo.database

    from tests.site.server import ShopServer

#: Every page may be fetched again a second after its last fetch.
REVISIT_ALL = {"FRONTIER_REVISIT": {".": "1s"}}


def _id(product_id: int, shop: ShopServer) -> str:
    return shop.url(f"/product/{product_id}")


def _crawl(fleet: Fleet, shop: ShopServer, nodes: int = 1, **settings: Any) -> list[int]:
    """One crawl of the shop by *nodes* fresh nodes; the indexes of their logs and stats."""
    first = len(fleet.procs)
    for _ in range(nodes):
        fleet.start_node(**settings)
    fleet.seed(shop.url("/"))
    codes = [proc.wait(180) for proc in fleet.procs[first:]]
    assert codes == [0] * nodes, fleet.log(first)[-3000:]
    return list(range(first, first + nodes))


def _sum(fleet: Fleet, nodes: list[int], key: str) -> int:
    return sum(fleet.stat(i, key) for i in nodes)


@pytest.fixture
def two_crawls(fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any]) -> dict[str, Any]:
    """Two crawls of 150 products by two nodes each, the shop moved one epoch between them."""
    shop = make_shop(150, epoch_price_share=0.1, epoch_stock_share=0.05,
                     epoch_added=0.02, epoch_removed=0.02)  # fmt: skip
    fleet.settings.update(REVISIT_ALL)
    first = _crawl(fleet, shop, nodes=2)
    before = shop.stats()
    shop.reset()
    shop.set_epoch(1)
    time.sleep(1.2)  # past the revisit interval
    second = _crawl(fleet, shop, nodes=2)
    return {"shop": shop, "first": first, "second": second, "before": before,
            "after": shop.stats(), "changes": shop.changes(), "mongo": mongo}  # fmt: skip


def test_a_second_crawl_asks_conditionally_and_rewrites_only_what_changed(
    fleet: Fleet, two_crawls: dict[str, Any]
) -> None:
    shop, changes, mongo = two_crawls["shop"], two_crawls["changes"], two_crawls["mongo"]
    first, second = two_crawls["first"], two_crawls["second"]
    changed = set(changes["price"]) | set(changes["availability"])
    old_ids = {p["id"] for p in shop.catalogue(0)["products"]}
    unchanged = old_ids - changed - set(changes["removed"])
    # every unchanged product page answered 304; changed, added ones and listings in full
    assert two_crawls["after"]["not_modified"] == len(unchanged)
    assert _sum(fleet, second, "revisit/not_modified") == len(unchanged)
    assert _sum(fleet, second, "mongo/touched") == len(unchanged)
    assert _sum(fleet, second, "mongo/updated") == len(changed)
    assert _sum(fleet, second, "mongo/inserted") == len(changes["added"])
    assert _sum(fleet, first, "mongo/inserted") == len(old_ids)
    assert two_crawls["after"]["body_bytes"] < two_crawls["before"]["body_bytes"] / 2
    products = mongo["products"]
    assert products.count_documents({}) == len(old_ids) + len(changes["added"])
    gone = {doc["_id"] for doc in products.find({"gone_at": {"$exists": True}}, {"_id": 1})}
    assert gone == {_id(i, shop) for i in changes["removed"]}
    # the changes collection holds exactly the changed fields, and the gone items
    recorded = {(c["item_id"], c["field"]) for c in mongo["changes"].find()}
    expected = {(_id(i, shop), "price") for i in changes["price"]}
    expected |= {(_id(i, shop), "availability") for i in changes["availability"]}
    expected |= {(_id(i, shop), "gone_at") for i in changes["removed"]}
    assert recorded == expected
    sample = mongo["changes"].find_one({"field": "price"})
    assert sample is not None
    assert sample["old"] != sample["new"]
    assert sample["crawl_id"] == fleet.stats(second[0])["run/id"]


def test_each_run_has_one_id_and_a_stored_report_compared_with_the_last(
    fleet: Fleet, two_crawls: dict[str, Any]
) -> None:
    mongo, changes = two_crawls["mongo"], two_crawls["changes"]
    first, second = two_crawls["first"], two_crawls["second"]
    ids = {fleet.stats(i)["run/id"] for i in first}, {fleet.stats(i)["run/id"] for i in second}
    assert len(ids[0]) == len(ids[1]) == 1
    assert ids[0] != ids[1]
    runs = {run["_id"]: run for run in mongo["crawl_runs"].find()}
    assert set(runs) == ids[0] | ids[1]
    last = runs[next(iter(ids[1]))]
    assert last["previous"] == next(iter(ids[0]))
    assert last["nodes"] == 2
    assert last["not_modified"] == two_crawls["after"]["not_modified"]
    assert last["items"]["gone"] == len(changes["removed"])
    assert last["items"]["updated"] == len(set(changes["price"]) | set(changes["availability"]))
    assert last["bytes"] < runs[last["previous"]]["bytes"]
    assert last["alerts"] == []
    assert runs[last["previous"]]["coverage"]["products"]["price"] == 1.0
    # the node that ended the run printed it
    logs = "".join(fleet.log(i) for i in second)
    assert f"Crawl run {last['_id']} of products" in logs


def test_fleetcrawl_changes_and_runs_show_them(fleet: Fleet, two_crawls: dict[str, Any]) -> None:
    env = {
        "REDIS_URL": fleet.redis_url,
        "MONGO_URI": fleet.mongo_url,
        "MONGO_DATABASE": fleet.mongo_db,
    }
    changes = run_cli("changes", "--since", "1h", "--field", "price", "--json", env=env)
    assert changes.returncode == 0, changes.stderr
    lines = [json.loads(line) for line in changes.stdout.splitlines()]
    assert len(lines) == len(two_crawls["changes"]["price"])
    assert {line["field"] for line in lines} == {"price"}
    runs = run_cli("runs", "--limit", "2", env=env)
    assert runs.returncode == 0, runs.stderr
    assert runs.stdout.count("Crawl run ") == 2
    assert "not modified (304)" in runs.stdout


class _Receiver(BaseHTTPRequestHandler):
    posts: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts.append({**json.loads(body), "auth": self.headers.get("Authorization")})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP receiver of the alert webhook."""
    _Receiver.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://user:secret@127.0.0.1:{server.server_port}/hook", _Receiver.posts
    server.shutdown()
    server.server_close()


def test_a_crawl_that_lost_items_alerts_and_posts_to_the_webhook(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any], webhook: tuple[str, list[Any]]
) -> None:
    url, posts = webhook
    shop = make_shop(
        100, epoch_removed=0.4, epoch_price_share=0, epoch_stock_share=0, epoch_added=0
    )
    fleet.settings.update(REVISIT_ALL, RUNS_WEBHOOK_URL=url, RUNS_MAX_ITEM_DROP=0.25)
    _crawl(fleet, shop)
    assert posts == []  # a first run has nothing to compare with, and no errors
    shop.set_epoch(1)
    time.sleep(1.2)
    (second,) = _crawl(fleet, shop)
    (post,) = posts
    assert post["spider"] == "products"
    assert post["auth"] == "Basic dXNlcjpzZWNyZXQ="  # user:secret, from the URL
    assert any("items stored fell 40.0%" in alert for alert in post["alerts"])
    assert post["report"]["items"]["gone"] == 40
    # what became of the post is in the run's report
    report = mongo["crawl_runs"].find_one({"_id": post["run"]})
    assert report is not None
    assert report["webhook"]["delivered"] is True, report["webhook"]
    assert report["webhook"]["tries"] == 1
    assert report["webhook"]["status"] == 204
    assert "secret" not in report["webhook"]["url"]
    assert "/hook" not in report["webhook"]["url"]
    log = fleet.log(second)
    assert "ERROR: Crawl run" in log
    assert "items stored fell" in log
    assert "secret" not in log


def test_a_keep_alive_fleet_revisits_on_its_own(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(40)
    node = fleet.start_node(FRONTIER_KEEP_ALIVE=True, FRONTIER_REVISIT={"/product/": "2s"})
    fleet.seed(shop.url("/"))
    wait_for(lambda: mongo["products"].count_documents({}) == 40, 60, "the first crawl")
    # nobody seeds again: the frontier hands the product pages out when they fall due
    wait_for(lambda: shop.stats()["not_modified"] >= 40, 30, "40 revisits answered 304")
    # each run of a keep-alive fleet ends when it runs out of work: its report is stored
    wait_for(lambda: mongo["crawl_runs"].count_documents({}) >= 2, 30, "the revisit run's report")
    node.send_signal(signal.SIGINT)
    assert node.wait(60) == 0
    stats = fleet.stats(0)
    assert stats["revisit/due"] >= 40
    assert stats["revisit/not_modified"] >= 40
    assert stats.get("revisit/rediscovered", 0) == 0
    second = mongo["crawl_runs"].find_one({"not_modified": {"$gte": 1}})
    assert second is not None
    assert second["items"]["gone"] == 0


#: Every URL of the crawl through the Bloom filter (a false "seen" has odds 1e-6 each).
_BLOOM_PRODUCTS = 400


def test_a_bloom_mode_crawl_stores_every_product(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(_BLOOM_PRODUCTS)
    nodes = _crawl(fleet, shop, nodes=2, FRONTIER_SEEN_MODE="bloom", FRONTIER_SEEN_EXPECTED=100_000)
    assert mongo["products"].count_documents({}) == _BLOOM_PRODUCTS
    assert _sum(fleet, nodes, "mongo/inserted") == _BLOOM_PRODUCTS
    with redis.Redis.from_url(fleet.redis_url) as client:
        assert json.loads(client.get(fleet.keys.dupefilter + ":conf"))["mode"] == "bloom"
        assert not client.exists(fleet.keys.dupefilter)
        # the seed, the listings and every product: each marked once
        assert int(client.get(fleet.keys.dupefilter + ":n")) >= _BLOOM_PRODUCTS
    # how full it is, in the stats: 400-odd URLs of 100,000, no warning
    assert 0.3 < max(fleet.stats(i).get("frontier/seen/fill_percent", 0) for i in nodes) < 1
    assert not any("Bloom seen-set holds" in fleet.log(i) for i in nodes)


def test_a_killed_node_does_not_keep_its_run_from_ending(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(150, latency_ms=20)
    fleet.start_node(**WAIT_FOR_SEED)
    fleet.start_node(**WAIT_FOR_SEED)
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    wait_for(lambda: mongo["products"].count_documents({}) >= 20, 60, "the crawl under way")
    fleet.kill(0)
    assert fleet.procs[1].wait(120) == 0, fleet.log(1)[-3000:]
    (report,) = mongo["crawl_runs"].find()
    assert report["items"]["stored"] == 150
    assert report["nodes"] == 1  # the killed node's counters are lost with it
    assert f"Crawl run {report['_id']} of products" in fleet.log(1)


def test_pages_not_due_yet_keep_their_items_alive(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any]
) -> None:
    shop = make_shop(60)
    # listings go again after a second, products only tomorrow
    fleet.settings.update(FRONTIER_REVISIT={"/product/": "1d", ".": "1s"})
    _crawl(fleet, shop)
    shop.reset()
    time.sleep(1.2)
    (second,) = _crawl(fleet, shop)
    stats = fleet.stats(second)
    assert shop.stats()["product_hits"] == {}  # no product page fetched again
    assert stats["revisit/not_due"] == 60
    assert stats["mongo/touched"] == 60
    assert mongo["products"].count_documents({"gone_at": {"$exists": True}}) == 0
    report = mongo["crawl_runs"].find_one({"_id": stats["run/id"]})
    assert report is not None
    assert report["items"]["stored"] == 60
    assert report["alerts"] == []
