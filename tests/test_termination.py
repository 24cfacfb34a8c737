"""The end of a crawl: seen the moment nothing is left anywhere, never before.

No grace period decides it: a lease is acknowledged only in the round trip that
enqueues what its page yielded, so "nothing queued, leased, retried or seeded" is
exact. These run real ``scrapy crawl`` nodes; each test sets FRONTIER_IDLE_GRACE
(which now only bounds how long a node waits for a crawl to begin) far above the
times it looks at, so a node that ended by waiting would fail it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.fleet import wait_for

if TYPE_CHECKING:
    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl


def test_the_crawl_ends_as_soon_as_its_last_page_is_stored(fleet: Fleet, make_shop, mongo) -> None:
    shop = make_shop(products=120, latency_ms=20)
    for _ in range(2):
        fleet.start_node(FRONTIER_IDLE_GRACE=60)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]
    ended = time.time()
    last_page = max(finish for _, finish, *_ in shop.timeline() if finish is not None)
    assert mongo.products.count_documents({}) == 120
    for index in (0, 1):
        assert fleet.stats(index)["finish_reason"] == "finished"
        assert "Crawl over: no request queued, leased or retried" in fleet.log(index)
    # Far below FRONTIER_IDLE_GRACE (60 s): the end was seen, not waited for. The figure
    # itself (about 1 s) is the slowsite benchmark's, not an assert's.
    assert ended - last_page < 20


def test_a_last_page_that_answers_after_8s_still_gets_its_links_crawled(
    fleet: Fleet, make_shop, mongo
) -> None:
    """Every other page is done long before the slow one answers; the idle node waits."""
    probe = make_shop(products=60)
    slug = probe.catalogue()["categories"][0]["slug"]
    shop = make_shop(products=60, slow_paths=[f"/category/{slug}?page=1"], slow_ms=8000)
    pages = next(c for c in shop.catalogue()["categories"] if c["slug"] == slug)["pages"]
    assert pages >= 2, "the slow category must have a page only it links to"
    for _ in range(2):
        fleet.start_node(FRONTIER_IDLE_GRACE=1.0)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]
    hits = shop.stats()["hits"]
    for page in range(1, pages + 1):
        assert hits.get(f"/category/{slug}?page={page}") == 1, f"page {page} of {slug}"
    assert mongo.products.count_documents({}) == 60
    for index in (0, 1):
        assert fleet.stats(index)["finish_reason"] == "finished"


def test_nodes_started_before_the_seed_wait_for_it(fleet: Fleet, make_shop, mongo) -> None:
    shop = make_shop(products=40)
    for _ in range(2):
        fleet.start_node(FRONTIER_IDLE_GRACE=30)
    time.sleep(4)  # both are up and see an empty frontier
    assert all(proc.poll() is None for proc in fleet.procs)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]
    assert mongo.products.count_documents({}) == 40


def test_a_starting_node_leases_what_its_seeds_made_a_round_trip_later(
    fleet: Fleet, make_shop
) -> None:
    """Seeds become requests in one round trip and are leased in the next: a node that has
    leased nothing yet sends that next one at once, not a FRONTIER_TICK_SECONDS later."""
    shop = make_shop(products=5)
    fleet.seed(shop.url("/product/1"))
    fleet.start_node(FRONTIER_TICK_SECONDS=10, FRONTIER_LEASE_SECONDS=30,
                     FRONTIER_HEARTBEAT_SECONDS=8, FRONTIER_IDLE_GRACE=30)  # fmt: skip
    wait_for(lambda: "Frontier node" in fleet.log(0), 60, "the node's frontier to start")
    frontier = time.monotonic()
    wait_for(lambda: "First lease" in fleet.log(0), 60, "the node's first lease")
    lease = time.monotonic()
    # Under the tick: the step that leased did not wait one out. The first step may wait up
    # to 2 s for the run join; the figure itself, a few milliseconds, is the startup
    # benchmark's, not an assert's.
    assert lease - frontier < 6.0, fleet.log(0)[-3000:]


def test_a_node_that_starts_late_neither_ends_the_crawl_nor_waits_for_ever(
    fleet: Fleet, make_shop, mongo
) -> None:
    """A node slow to start joins a running crawl; one started after it ended leaves after
    FRONTIER_IDLE_GRACE with nothing done."""
    shop = make_shop(products=200, latency_ms=300)
    fleet.start_node(FRONTIER_IDLE_GRACE=1.0)
    fleet.seed(shop.url("/"))
    time.sleep(1)
    late = fleet.start_node(FRONTIER_IDLE_GRACE=1.0)
    assert fleet.wait(120) == [0, 0]
    assert mongo.products.count_documents({}) == 200
    assert fleet.stat(1, "frontier/leased") > 0, "the late node joined the crawl"
    assert late.returncode == 0
    after = fleet.start_node(FRONTIER_IDLE_GRACE=2.0)
    started = time.monotonic()
    assert after.wait(60) == 0
    assert time.monotonic() - started >= 2.0
    assert "No crawl to join" in fleet.log(2)
    assert fleet.stat(2, "frontier/leased") == 0


def test_a_keep_alive_fleet_stays_up_and_crawls_new_seeds(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=20)
    node = fleet.start_node(FRONTIER_KEEP_ALIVE=True)
    fleet.seed(shop.url("/product/1"))
    deadline = time.monotonic() + 60
    while shop.stats()["product_hits"].get("1") != 1:
        assert time.monotonic() < deadline, "the first seed was not crawled"
        time.sleep(0.2)
    time.sleep(3)  # the crawl is over: a keep-alive node stays
    assert node.poll() is None
    fleet.seed(shop.url("/product/2"))
    while shop.stats()["product_hits"].get("2") != 1:
        assert time.monotonic() < deadline, "the later seed was not crawled"
        time.sleep(0.2)
    assert node.poll() is None
    fleet.stop()
