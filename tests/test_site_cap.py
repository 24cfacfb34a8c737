"""One politeness knob: FRONTIER_SITE_CONCURRENCY counts downloads, and nothing per node
silently keeps a site below it."""

from __future__ import annotations

import re
import signal
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from scrapy.settings import Settings

from project.addon import FleetAddon
from project.frontier.config import FrontierConfig
from project.frontier.politeness import derive, unreachable
from tests.fleet import WAIT_FOR_SEED, wait_for
from tests.site.stats import open_at_once
from tests.tcp_proxy import TcpProxy

if TYPE_CHECKING:
    from tests.fleet import Fleet


def _settings(**values: object) -> Settings:
    settings = Settings()
    settings.setdict(values, priority="project")
    return settings


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
    assert open_at_once(shop.timeline()) == 6
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


#: node0 logs when each download passes the last permit gate, to the microsecond.
_GATE_LOG = {"LOG_LEVEL": "DEBUG", "LOG_FORMAT": "%(created).6f [%(name)s] %(message)s"}
_GATE_PASSED = re.compile(r"^(\d+\.\d+) \S+ Download passes the permit gate: (\S+)$", re.MULTILINE)


@pytest.mark.crawl
@pytest.mark.slow("node0 stays stopped past its 6 s lease, then the crawl runs to its end")
@pytest.mark.parametrize(
    "slot",
    [
        pytest.param({}, id="default"),
        # Scrapy's slot spaces the node's downloads: its other permitted requests wait in the
        # slot, past the downloader middlewares, when the node is stopped; back, they went at
        # once before the download handler waited at the gate too (failed 1 run in 2)
        pytest.param({"DOWNLOAD_DELAY": 0.05}, id="queued-in-the-slot"),
    ],
)
def test_a_node_stopped_past_its_lease_never_takes_the_site_above_its_cap(
    fleet: Fleet, make_shop, mongo, slot: dict[str, int]
) -> None:
    """A stalled node's permits go to the fleet after its lease; back, it learns that before
    it starts another download with them (SIGSTOP stands for a GC pause, a full disk)."""
    shop = make_shop(products=150, latency_ms=150)
    fleet.start_node(FRONTIER_SITE_CONCURRENCY=6, USER_AGENT="node0", **_GATE_LOG, **slot)
    fleet.start_node(FRONTIER_SITE_CONCURRENCY=6, USER_AGENT="node1")
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
    # A download that passed node0's last gate before the stop (in the HTTP client, its
    # connection opening or the request not yet written, which takes a starved process tens
    # of milliseconds) goes on the wire when it runs again: nothing can call it back. What
    # the fleet guarantees is that the node starts no other download with permits it lost.
    passed: dict[str, list[float]] = {}
    for created, url in _GATE_PASSED.findall(fleet.log(0)):
        path = url.removeprefix(shop.base_url)
        passed.setdefault(path, []).append(float(created))
    everything = shop.timeline()
    timeline, before_the_stop = [], []
    for a, f, path, agent in sorted(everything):
        if agent == "node0":
            # each of node0's downloads pairs with its own gate pass, the latest before it
            gated = [t for t in passed.get(path, ()) if t <= a]
            assert gated, f"node0 downloaded {path} without passing the permit gate"
            passed[path].remove(max(gated))
            if a >= resumed_at and max(gated) < resumed_at:
                before_the_stop.append(path)
                continue
        timeline.append([a, f, path, agent])
    # at most the permits node0 held when it stopped: its share of the cap, two nodes stepping
    assert len(before_the_stop) <= 3, before_the_stop
    # at the shop, counting them too: the cap, and no more than those few above it
    assert open_at_once(everything) <= 6 + len(before_the_stop)
    most = open_at_once(timeline)
    if most > 6:
        peak = max(
            (t for t, *_ in timeline),
            key=lambda t: sum(1 for a, f, *_ in timeline if a <= t < (f or a + 1e-9)),
        )
        open_then = [
            (round(a - stopped_at, 3), round((f or a) - stopped_at, 3), path, agent)
            for a, f, path, agent in timeline
            if a <= peak < (f or a + 1e-9)
        ]
        print(
            "stopped 0, resumed", round(resumed_at - stopped_at, 3), "open at the peak", open_then
        )
    assert most <= 6
    assert fleet.stat(0, "frontier/permits/reclaimed") > 0


#: A step's reply that granted a download permit (``permits`` followed by a non-empty array).
_GRANTING_REPLY = rb"\$7\r\npermits\r\n\*[1-9]"


@pytest.mark.crawl
def test_a_step_whose_reply_is_lost_leaves_a_cap_of_one_leased_and_the_crawl_ends(
    fleet: Fleet, make_shop, mongo
) -> None:
    """Redis ran the step and granted the site's only permit; the node never read the reply
    (a proxy drops it with its connection). Its next heartbeat's permit table gives that
    permit back, so the site is leased again and the crawl ends, one download at a time."""
    shop = make_shop(products=30, latency_ms=50)
    redis_at = urlsplit(fleet.redis_url)
    with TcpProxy((redis_at.hostname or "127.0.0.1", redis_at.port or 6379)) as proxy:
        for _ in range(2):
            fleet.start_node(FRONTIER_SITE_CONCURRENCY=1, REDIS_URL=proxy.url(), **WAIT_FOR_SEED)
        fleet.wait_ready()
        proxy.drop_next(_GRANTING_REPLY)  # the crawl's first permit
        fleet.seed(shop.url("/"))
        wait_for(lambda: proxy.dropped, 30, "a node granted the permit", 0.05)
        assert fleet.wait(120) == [0, 0], fleet.log(0)[-3000:]
    assert mongo.products.count_documents({}) == 30
    assert open_at_once(shop.timeline()) == 1
    assert sum(fleet.stat(i, "frontier/redis_errors") for i in range(2)) >= 1
    # the permit the lost reply granted went back by the table (or the step was replayed)
    fixed = sum(
        fleet.stat(i, "frontier/permits/corrected") + fleet.stat(i, "frontier/steps_replayed")
        for i in range(2)
    )
    assert fixed >= 1, [fleet.stats(i) for i in range(2)]
