"""The web dashboard: served by ``fleetcrawl dashboard``, drawn by headless Chromium."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.benchmarks.dashboard_screenshot import (
    MONITORED,
    chromium,
    dashboard_process,
    wait_for_charts,
)
from tests.test_monitor import metric, parse_prometheus

pytestmark = pytest.mark.crawl

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(":".join(auth).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:  # it holds the connection's socket
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _nodes(fleet, count: int) -> None:
    for index in range(count):
        fleet.start_node(**MONITORED, MONGO_JOURNAL_DIR=str(fleet.log_dir / f"journal{index}"))


def test_basic_auth_guards_every_route(fleet) -> None:
    env = {**fleet.env(), "DASHBOARD_USERNAME": "ops", "DASHBOARD_PASSWORD": "s3cret:pw"}
    with dashboard_process(
        env, fleet.log_dir / "dashboard.log", args=fleet.space.cli_args()
    ) as url:
        for path in (
            "",
            "static/charts.js",
            "api/status",
            "api/history",
            "metrics",
            "api/v1/scale",
        ):
            status, _, _ = _get(url + path)
            assert status == 401, path
            assert _get(url + path, ("ops", "wrong"))[0] == 401, path
            assert _get(url + path, ("ops", "s3cret:pw"))[0] == 200, path
        status, content_type, body = _get(url + "metrics", ("ops", "s3cret:pw"))
    assert content_type.startswith("text/plain")
    samples = parse_prometheus(body)  # an empty fleet still gives a valid exposition
    assert metric(samples, "fleetcrawl_queue_depth") == 0
    assert metric(samples, "fleetcrawl_nodes", state="alive") == 0
    assert metric(samples, "fleetcrawl_useful_nodes") == 0  # nothing to do: no node is useful


def test_dashboard_charts_a_two_node_crawl(fleet, make_shop) -> None:
    shop = make_shop(products=1000, latency_ms=60)
    _nodes(fleet, 2)
    fleet.seed(shop.url("/"))
    console: list[str] = []
    with (
        dashboard_process(
            fleet.env(), fleet.log_dir / "dashboard.log", args=fleet.space.cli_args()
        ) as url,
        chromium() as browser,
    ):
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.goto(url)
        figures = wait_for_charts(page, nodes=2, samples=4)
        assert figures["rows"] == 2
        assert all(n > 0 for series in figures["series"].values() for n in series[:1]), figures
        # pages/s: one series for the fleet and one per node
        assert len(figures["series"]["pages"]) == 3
        inked = page.evaluate(
            """() => [...document.querySelectorAll('canvas')].map((canvas) => {
                const data = canvas.getContext('2d')
                    .getImageData(0, 0, canvas.width, canvas.height).data;
                let inked = 0;
                for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
                return inked;
            })"""
        )
        assert len(inked) == 4
        assert min(inked) > 2000, f"a chart is blank: {inked}"
        names = page.locator("#nodes tbody td:first-child").all_inner_texts()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

        status, _, body = _get(url + "metrics")
        assert status == 200
        samples = parse_prometheus(body)
        for node in names:
            assert metric(samples, "fleetcrawl_node_up", node=node, host=node.split(":")[0]) == 1
        assert metric(samples, "fleetcrawl_nodes", state="alive") == 2
        # 1000 products on one site at Scrapy's 8 downloads a site: one node is enough
        _, content_type, scale = _get(url + "api/v1/scale")
        assert content_type.startswith("application/json")
        assert json.loads(scale)["useful_nodes"] in (0, 1)  # 0 once the crawl has ended
        assert metric(samples, "fleetcrawl_useful_nodes") in (0, 1)
        _, _, dead = _get(url + "api/dead-letters")
        assert json.loads(dead) == []
    assert console == [], console
    # Node ids are host:pid:random: the table lists exactly the two crawling processes.
    assert sorted(int(n.split(":")[1]) for n in names) == sorted(p.pid for p in fleet.procs)
