"""Screenshot of the dashboard during a two-node crawl, for the README.

    python -m tests.benchmarks.dashboard_screenshot [--out docs/dashboard.png] [--products 800]

Starts a private Redis and FerretDB, the test shop with some latency (so the crawl lasts about
half a minute), two ``scrapy crawl`` nodes and ``fleetcrawl dashboard``, opens the dashboard in
headless Chromium and saves a screenshot once the charts have some history. Also holds the
helpers ``tests/test_dashboard.py`` uses to start the dashboard and Chromium.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from project.rendering.config import RenderingConfig
from tests.fleet import ROOT, Fleet
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
#: The same flags as the crawler nodes' Chromium (root, closed network).
CHROMIUM_ARGS: list[str] = RenderingConfig().launch_options["args"]
#: Node settings for a lively dashboard: a heartbeat every half second.
MONITORED = {"MONITOR_INTERVAL": 0.5, "MONITOR_NODE_TIMEOUT": 3.0}


@contextlib.contextmanager
def dashboard_process(
    env: dict[str, str], log: Path, spider: str = "products", args: Sequence[str] = ()
) -> Iterator[str]:
    """``fleetcrawl dashboard`` on a free port; yields its base URL, stops it afterwards."""
    port = free_port()
    argv = [sys.executable, "-m", "project.ops.cli", "dashboard", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--spider", spider], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "static/charts.js", timeout=2).close()
                break
            except urllib.error.HTTPError as exc:
                exc.close()  # it holds the connection's socket
                break  # answering (401 with basic auth, 400 for a Host it refuses)
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dashboard did not start:\n{log.read_text()}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Debian Chromium through Playwright; closed (and its processes gone) afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_for_charts(page: Page, nodes: int, samples: int, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until the page has *samples* history points and *nodes* alive nodes; return figures."""
    deadline = time.monotonic() + timeout
    figures: dict[str, Any] = {}
    while time.monotonic() < deadline:
        figures = page.evaluate(
            """() => ({
                samples: dashboard.state.samples.length,
                alive: [...document.querySelectorAll('#nodes tbody td.state')]
                    .filter((td) => td.textContent === 'alive').length,
                rows: document.querySelectorAll('#nodes tbody tr').length,
                series: Object.fromEntries(Object.entries(dashboard.charts).map(([k, c]) =>
                    [k, c.series.map((s) => s.values.filter((v) => v !== null).length)])),
                maxPages: Math.max(0, ...(dashboard.charts.pages.series[0] || {values: []}).values),
            })"""
        )
        if figures["samples"] >= samples and figures["alive"] >= nodes and figures["maxPages"] > 0:
            return figures
        time.sleep(0.25)
    raise AssertionError(f"dashboard never showed {nodes} live nodes and data: {figures}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--products", type=int, default=800)
    parser.add_argument("--latency-ms", type=float, default=100)
    parser.add_argument("--after", type=float, default=20.0, help="seconds of history to show")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fleetcrawl-shot-"))
    cfg = ServicesConfig(state_dir=work / "state", redis_port=free_port(), mongo_port=free_port())
    start_redis(cfg)
    try:
        start_mongo(cfg)
        crew = Fleet(cfg.redis_url, cfg.mongo_url, "dashboard_shot", work, settings=MONITORED)
        with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
            for index in range(2):
                crew.start_node(MONGO_JOURNAL_DIR=str(work / f"journal{index}"))
            crew.seed(shop.url("/"))
            started = time.monotonic()
            try:
                with dashboard_process(crew.env(), work / "dashboard.log") as url, chromium() as b:
                    page = b.new_page(viewport={"width": 1280, "height": 1000})
                    page.goto(url)
                    # A sample every MONITOR_INTERVAL: wait for --after seconds of history.
                    samples = int(args.after / MONITORED["MONITOR_INTERVAL"] * 0.9)
                    wait_for_charts(page, nodes=2, samples=samples, timeout=args.after + 90)
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(args.out), full_page=True)
                    print(f"screenshot {time.monotonic() - started:.0f}s after start: {args.out}")
            finally:
                crew.stop()
    finally:
        stop_service(cfg, "mongo")
        stop_service(cfg, "redis")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
