"""SIGTERM: a node stops within its grace, hands back what it holds, and the fleet loses nothing.

Real ``scrapy crawl`` nodes against the test shop; what was fetched is counted at the shop.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.fleet import wait_for

if TYPE_CHECKING:
    from tests.fleet import Fleet

ROOT = Path(__file__).resolve().parents[1]

#: A page some node's stop cut: it may be fetched once more.
_CUT = re.compile(r"Download cut by the node's stop: (\S+) goes back to the fleet")
#: Under the 30 s most platforms give between SIGTERM and SIGKILL.
_PLATFORM_GRACE = 30.0


@pytest.mark.crawl
@pytest.mark.slow("three SIGTERMs in turn, each waiting out a 2 s grace, and a crawl to the end")
def test_nodes_stopped_by_sigterm_mid_crawl_lose_nothing(fleet: Fleet, make_shop, mongo) -> None:
    """Three times a node is sent SIGTERM mid-crawl while some of its downloads take 20 s
    (once twice): it exits 0 within the platform's grace, the slow downloads cut and handed
    back; a new node takes its place. Every product is stored, and no page is fetched twice but those
    whose download was cut."""
    shop = make_shop(products=120, latency_ms=100, slow_share=0.05, slow_ms=20_000)
    grace = 2.0
    node = {"FLEET_STOP_GRACE": grace, "DOWNLOAD_TIMEOUT": 60}
    fleet.start_node(**node)
    fleet.start_node(**node)
    fleet.seed(shop.url("/"))
    stops = []
    for round_ in range(3):
        wait_for(
            lambda n=20 * (round_ + 1): mongo.products.estimated_document_count() >= n,
            120,
            "products stored",
        )
        index = next(i for i, p in enumerate(fleet.procs) if p.poll() is None)
        asked = time.monotonic()
        fleet.procs[index].send_signal(signal.SIGTERM)
        if round_ == 1:
            # a platform's own SIGTERM after a preStop hook's: the close is not cut short
            time.sleep(0.5)
            fleet.procs[index].send_signal(signal.SIGTERM)
        assert fleet.procs[index].wait(60) == 0, fleet.log(index)[-3000:]
        stops.append((index, time.monotonic() - asked))
        fleet.start_node(**node)
    assert fleet.wait(240) == [0] * len(fleet.procs)

    for index, took in stops:
        stats = fleet.stats(index)
        assert stats["finish_reason"] == "shutdown"
        assert stats["fleet/stop/signal"] == "SIGTERM"
        assert took < _PLATFORM_GRACE, (index, took)
        assert "SIGTERM: stopping; nothing more is leased" in fleet.log(index)
        # the close hands back its permits itself: none is taken back from it
        assert "the fleet took back" not in fleet.log(index)
        assert "frontier/permits/reclaimed" not in stats
    assert "SIGTERM again: already stopping" in fleet.log(stops[1][0])
    assert mongo.products.count_documents({}) == 120
    # a slow page may be cut by two of the nodes stopped in turn
    cut = [m.group(1) for i, _ in stops for m in _CUT.finditer(fleet.log(i))]
    twice = {
        path for path, n in shop.stats()["hits"].items() if n > 1 and path.startswith("/product/")
    }
    assert twice <= {urlsplit(url).path for url in cut}
    assert sum(fleet.stat(i, "fleet/stop/cut") for i, _ in stops) == len(cut)
    print("stops (node, seconds):", stops, "cut:", len(cut), "fetched twice:", len(twice))
    # nothing is left behind: no lease, no dead letter
    assert fleet.client().zcard(fleet.keys.inflight) == 0
    assert fleet.client().llen(fleet.keys.dead) == 0


def _fleetcrawl(*args: str | Path) -> int:
    """The command a platform runs (a probe, a preStop hook); its exit status."""
    command = [sys.executable, "-m", "project.ops.cli", *map(str, args)]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, timeout=60, check=False
    ).returncode


@pytest.mark.crawl
def test_requests_waiting_in_a_download_slot_are_cut_with_the_grace(
    fleet, make_shop, mongo
) -> None:
    """Scrapy's DOWNLOAD_DELAY (per node) holds the node's leased requests in its download
    slot, one every 2 s: at the end of the grace they are cut and handed back at once, not
    sent one a delay apart for half a minute."""
    shop = make_shop(products=200, latency_ms=50)
    node = {"FLEET_STOP_GRACE": 1.0, "DOWNLOAD_DELAY": 2, "RANDOMIZE_DOWNLOAD_DELAY": False}
    fleet.start_node(**node)
    fleet.seed(shop.url("/"))
    wait_for(lambda: fleet.client().zcard(fleet.keys.inflight) >= 8, 60, "requests leased ahead")
    asked = time.monotonic()
    fleet.procs[0].send_signal(signal.SIGTERM)
    assert fleet.procs[0].wait(60) == 0
    took = time.monotonic() - asked
    queued = fleet.stat(0, "fleet/stop/cut_queued")
    print(f"stopped in {took:.1f} s, {queued} requests cut in the slot")
    assert queued >= 4
    assert took < _PLATFORM_GRACE / 2  # one a delay apart, they would have taken 2 s each
    # nothing lost: another node crawls what was cut
    fleet.start_node()
    assert fleet.wait(120) == [0, 0]
    assert mongo.products.count_documents({}) == 200


@pytest.mark.crawl
def test_the_health_file_answers_probes_and_stop(fleet: Fleet, make_shop, tmp_path: Path) -> None:
    """``fleetcrawl probe ready|live`` and ``fleetcrawl stop`` against a real node."""
    shop = make_shop(products=400, latency_ms=200)
    health = tmp_path / "node.health"
    fleet.start_node(FLEET_HEALTH_FILE=str(health), FLEET_STOP_GRACE=1.0)
    fleet.seed(shop.url("/"))
    wait_for(lambda: health.exists() and json.loads(health.read_text())["state"] == "crawling",
             60, "a crawling node")  # fmt: skip
    wait_for(lambda: _fleetcrawl("probe", "ready", "--file", health) == 0, 30, "ready")
    assert _fleetcrawl("probe", "live", "--file", health) == 0
    # a crawling node whose last round trip is older than --max-age is not live
    assert _fleetcrawl("probe", "live", "--file", health, "--max-age", "0.001") == 1
    asked = time.monotonic()
    assert _fleetcrawl("stop", "--file", health, "--wait", str(_PLATFORM_GRACE)) == 0
    assert time.monotonic() - asked < _PLATFORM_GRACE
    assert fleet.procs[0].wait(5) == 0
    assert fleet.stats(0)["fleet/stop/signal"] == "SIGTERM"
    assert not health.exists()  # removed at close: the probes say so
    assert _fleetcrawl("probe", "live", "--file", health) == 1


@pytest.mark.crawl
def test_a_render_cut_by_the_stop_closes_its_page(fleet: Fleet, make_shop) -> None:
    """A render still running at the end of the grace is cut like a download, and its page is
    closed (scrapy-playwright closes pages on errors, not on a cancellation): none is left
    holding its context's permit."""
    shop = make_shop(products=20, latency_ms=50, slow_share=1.0, slow_ms=20_000)
    fleet.start_node(FLEET_STOP_GRACE=1.0, PLAYWRIGHT_RENDER_URLS='["/product/"]')
    fleet.seed(shop.url("/"))
    wait_for(lambda: "Launching browser" in fleet.log(0), 60, "a render", 0.2)
    time.sleep(2.0)  # the product renders wait on their pages (20 s each)
    fleet.procs[0].send_signal(signal.SIGTERM)
    assert fleet.procs[0].wait(60) == 0, fleet.log(0)[-3000:]
    stats = fleet.stats(0)
    assert stats["fleet/stop/cut"] >= 1
    opened = stats.get("playwright/page_count", 0)
    assert opened >= 1
    assert opened == stats.get("playwright/page_count/closed", 0) + stats.get(
        "playwright/page_count/idle", 0
    )
