"""Rendering benchmark: pages/s and memory of one node for several browser limits.

    python -m tests.benchmarks.rendering [--products 120] [--runs 3] [--configs 1x4,1x1,...]

One ``scrapy crawl products`` node against the test shop with ``js_share=1.0``:
every product page is fetched, found empty, and rendered by Chromium through
the spider's fallback (the production path). Item pipelines are off. For each
``CONTEXTSxPAGES`` setting (PLAYWRIGHT_MAX_CONTEXTS x
PLAYWRIGHT_MAX_PAGES_PER_CONTEXT) it prints rendered pages/s (render starts
in the shop's log, first to last) and the peak PSS of the node's whole process
tree (Scrapy, Playwright's driver, Chromium), medians of ``--runs`` runs,
interleaved so machine noise hits every setting alike, with ratios against
the first setting. Then the same for a node whose crawl needs no rendering.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from project.ops.services import ServicesConfig, free_port, start_redis, stop_service
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]

_NODE_SETTINGS: dict[str, Any] = {
    "ITEM_PIPELINES": "{}",
    "FRONTIER_IDLE_GRACE": 1.0,
    "FRONTIER_MAINTENANCE_SECONDS": 0.5,
    "LOG_LEVEL": "INFO",
}


def tree_pss_kib(root: int) -> int:
    """PSS of *root* and all its descendants, from /proc/<pid>/smaps_rollup."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue  # exited between the listing and the read
    return total


class _Sampler(threading.Thread):
    """Samples the node's tree PSS and the shop's render starts until stopped."""

    def __init__(self, pid: int, shop: ShopServer, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.shop, self.interval = pid, shop, interval
        self.peak_kib = 0
        self.render_starts: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak_kib = max(self.peak_kib, tree_pss_kib(self.pid))
            now = time.monotonic()
            for pid, hits in self.shop.stats()["product_hits"].items():
                if hits >= 2 and pid not in self.render_starts:
                    self.render_starts[pid] = now
            self.done.wait(self.interval)


def run_node(shop: ShopServer, redis_url: str, log_dir: Path, **settings: Any) -> dict[str, float]:
    """Crawl the shop with one node; return rendered pages/s and peak PSS in MiB."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    shop.reset()
    merged = {**_NODE_SETTINGS, "MONGO_JOURNAL_DIR": str(log_dir / "journal"), **settings}
    argv = [sys.executable, "-m", "scrapy", "crawl", "products"]
    for key, value in merged.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(os.environ, REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    log_path = log_dir / "node.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    sampler = _Sampler(proc.pid, shop)
    sampler.start()
    client.lpush("products:start_urls", shop.url("/"))
    try:
        code = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sampler.done.set()
        sampler.join()
        client.close()
    if code != 0:
        raise RuntimeError(f"node exited with {code}:\n{log_path.read_text()[-3000:]}")
    starts = sorted(sampler.render_starts.values())
    rate = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0
    return {"rendered": len(starts), "pages_per_s": rate, "peak_mib": sampler.peak_kib / 1024}


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--products", type=int, default=120)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", default="1x4,1x1,1x8,2x4,4x1,8x1")
    args = parser.parse_args()
    configs = [tuple(int(n) for n in c.split("x")) for c in args.configs.split(",")]
    with tempfile.TemporaryDirectory() as state:
        cfg = ServicesConfig(state_dir=Path(state), redis_port=free_port(), mongo_port=free_port())
        start_redis(cfg)
        try:
            _run_all(args, configs, cfg.redis_url, Path(state))
        finally:
            stop_service(cfg, "redis")


def _run_all(
    args: argparse.Namespace, configs: list[tuple[int, ...]], redis_url: str, state: Path
) -> None:
    results: dict[tuple[int, ...], list[dict[str, float]]] = {c: [] for c in configs}
    with ShopServer(args.products, js_share=1.0) as shop:
        for _ in range(args.runs):
            for contexts, pages in configs:
                results[(contexts, pages)].append(
                    run_node(
                        shop,
                        redis_url,
                        state,
                        PLAYWRIGHT_MAX_CONTEXTS=contexts,
                        PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=pages,
                    )
                )
    idle: dict[str, list[dict[str, float]]] = {"lazy": [], "eager": []}
    eager = "scrapy_playwright.provider.PlaywrightBrowserProvider"
    with ShopServer(args.products, js_share=0.0) as shop:
        for _ in range(args.runs):
            idle["lazy"].append(run_node(shop, redis_url, state))
            idle["eager"].append(
                run_node(shop, redis_url, state, PLAYWRIGHT_BROWSER_PROVIDER=eager)
            )

    print(
        f"shop: {args.products} products, js_share=1.0 (every product rendered through the"
        f" fallback); one node; medians of {args.runs} runs; pipelines off; {os.cpu_count()} CPUs"
    )
    print(
        f"{'contexts x pages':>16} {'rendered':>8} {'pages/s':>8} {'x base':>7}"
        f" {'peak PSS MiB':>12} {'x base':>7}"
    )
    base = _medians(results[configs[0]])
    for config in configs:
        row = _medians(results[config])
        label = "x".join(map(str, config)) + (" (base)" if config == configs[0] else "")
        print(
            f"{label:>16} {row['rendered']:>8.0f} {row['pages_per_s']:>8.2f}"
            f" {row['pages_per_s'] / base['pages_per_s']:>7.2f} {row['peak_mib']:>12.0f}"
            f" {row['peak_mib'] / base['peak_mib']:>7.2f}"
        )
    print()
    print("node whose crawl renders nothing (js_share=0.0):")
    print(f"{'provider':>16} {'peak PSS MiB':>12} {'x base':>7}")
    for name, runs in idle.items():
        row = _medians(runs)
        label = {"lazy": "lazy (project)", "eager": "scrapy-playwright"}[name]
        print(f"{label:>16} {row['peak_mib']:>12.0f} {row['peak_mib'] / base['peak_mib']:>7.2f}")


if __name__ == "__main__":
    main()
