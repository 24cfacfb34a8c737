"""One politeness knob: FRONTIER_SITE_CONCURRENCY counts downloads, and nothing per node
silently keeps a site below it."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings

from project.addon import FleetAddon
from project.frontier.config import FrontierConfig
from project.frontier.politeness import derive, unreachable
from tests.fleet import wait_for

if TYPE_CHECKING:
    from tests.fleet import Fleet


def _settings(**values: object) -> Settings:
    settings = Settings()
    settings.setdict(values, priority="project")
    return settings


def _open_at_once(timeline: list[list]) -> int:
    """Most requests the shop had open at one instant."""
    events = []
    for arrival, finish, _ in timeline:
        events += [(arrival, 1), (finish if finish is not None else arrival, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def test_the_add_on_derives_node_limits_from_the_fleet_cap() -> None:
    settings = _settings(FRONTIER_SITE_CONCURRENCY=64)
    FleetAddon().update_settings(settings)
    assert settings.getint("CONCURRENT_REQUESTS") == 64
    assert settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") == 64
    # Scrapy's 16 at least, and the largest per-site cap counts
    settings = _settings(
        FRONTIER_SITE_CONCURRENCY=4, FRONTIER_SITE_LIMITS={"big.example": {"concurrency": 40}}
    )
    derive(settings, "addon")
    assert settings.getint("CONCURRENT_REQUESTS") == 40
    settings = _settings(FRONTIER_SITE_CONCURRENCY=0)
    derive(settings, "addon")
    assert settings.getint("CONCURRENT_REQUESTS") == 16
    assert settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") == 16


def test_a_projects_own_limits_win_and_are_warned_about_with_numbers() -> None:
    settings = _settings(
        CONCURRENT_REQUESTS=24, CONCURRENT_REQUESTS_PER_DOMAIN=1, DOWNLOAD_DELAY=1.0
    )
    FleetAddon().update_settings(settings)
    assert settings.getint("CONCURRENT_REQUESTS") == 24
    assert settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") == 1
    lines = unreachable(settings, FrontierConfig.from_settings(settings))
    assert len(lines) == 2
    assert "CONCURRENT_REQUESTS_PER_DOMAIN=1" in lines[0]
    assert "32 such nodes reach FRONTIER_SITE_CONCURRENCY=32" in lines[0]
    assert "DOWNLOAD_DELAY=1" in lines[1]
    assert "FRONTIER_SITE_RATE" in lines[1]
    # the derived values say nothing
    settings = _settings()
    FleetAddon().update_settings(settings)
    assert unreachable(settings, FrontierConfig.from_settings(settings)) == []


@pytest.mark.crawl
def test_two_nodes_keep_a_slow_site_at_its_cap_and_never_above(
    fleet: Fleet, make_shop, mongo
) -> None:
    """Permits, not leases, count: the shop sees exactly the cap at once, never more."""
    shop = make_shop(products=200, latency_ms=150)
    for _ in range(2):
        fleet.start_node(FRONTIER_SITE_CONCURRENCY=6)
    fleet.seed(shop.url("/"))
    assert fleet.wait(180) == [0, 0]
    assert mongo.products.count_documents({}) == 200
    assert _open_at_once(shop.timeline()) == 6
    for index in (0, 1):
        stats = fleet.stats(index)
        assert stats["frontier/permits/granted"] > 0, f"node{index} never downloaded"
        assert stats.get("frontier/politeness/node_limits", 0) == 0


@pytest.mark.crawl
def test_a_node_limited_per_site_says_so_at_start(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=5)
    fleet.start_node(CONCURRENT_REQUESTS_PER_DOMAIN=2)
    fleet.seed(shop.url("/product/1"))
    assert fleet.wait(120) == [0]
    log = fleet.log(0)
    assert "Site cap unreachable: CONCURRENT_REQUESTS_PER_DOMAIN=2 lets this node" in log
    assert "16 such nodes reach FRONTIER_SITE_CONCURRENCY=32" in log
    assert fleet.stat(0, "frontier/politeness/node_limits") == 1


@pytest.mark.crawl
def test_a_node_stopped_past_its_lease_never_takes_the_site_above_its_cap(
    fleet: Fleet, make_shop, mongo
) -> None:
    """A stalled node's permits go to the fleet after its lease; back, it learns that before
    it starts another download with them (SIGSTOP stands for a GC pause, a full disk)."""
    shop = make_shop(products=150, latency_ms=150)
    for _ in range(2):
        fleet.start_node(FRONTIER_SITE_CONCURRENCY=6)
    fleet.seed(shop.url("/"))
    wait_for(lambda: mongo.products.estimated_document_count() >= 20, 60, "20 products")
    stopped = fleet.procs[0]
    stopped_at = time.time()
    stopped.send_signal(signal.SIGSTOP)
    try:
        # past FRONTIER_LEASE_SECONDS (6 s in tests): its leases and permits go to node1
        wait_for(lambda: "expired leases of dead or stalled" in fleet.log(1), 30, "a reap", 0.2)
        time.sleep(1.0)  # node1 downloads with the permits it took over
    finally:
        resumed_at = time.time()
        stopped.send_signal(signal.SIGCONT)
    assert fleet.wait(180) == [0, 0]
    assert mongo.products.count_documents({}) == 150
    timeline = shop.timeline()
    most = _open_at_once(timeline)
    if most > 6:
        peak = max(
            (t for t, *_ in timeline),
            key=lambda t: sum(1 for a, f, _ in timeline if a <= t < (f or a + 1e-9)),
        )
        open_then = [
            (round(a - stopped_at, 3), round((f or a) - stopped_at, 3), path)
            for a, f, path in timeline
            if a <= peak < (f or a + 1e-9)
        ]
        print(
            "stopped 0, resumed", round(resumed_at - stopped_at, 3), "open at the peak", open_then
        )
    assert most <= 6
    assert fleet.stat(0, "frontier/permits/reclaimed") > 0
