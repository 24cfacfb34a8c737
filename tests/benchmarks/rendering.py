"""Rendering benchmark: what adaptive rendering and the cheaper render buy, side by side.

    python -m tests.benchmarks.rendering [--runs 3] [--js-products 120] [--mixed-products 600]
        [--base REV] [--limits 1x4,1x8,...]

One ``scrapy crawl products`` node at a time against the test shop's mixed section
(tests/site/mixed.py: static pages, pages only JavaScript builds; renders counted at the shop
by a beacon only a browser sends), items stored in MongoDB (FerretDB). Variants run
interleaved, ``--runs`` times each; medians printed, with ratios against browser-only:

(a) every product needs JavaScript (``--js-products``): rendered pages/s (render starts seen
    at the shop, first to last) and the peak PSS of the node's process tree (Scrapy,
    Playwright's driver, Chromium), for
      today         the code of ``--base`` (before adaptive rendering and page reuse): a plain
                    fetch, then a rendered one through the products spider's fallback
      browser-only  this code, every product page rendered (PLAYWRIGHT_RENDER_URLS)
      adaptive      this code, PLAYWRIGHT_ADAPTIVE
(b) 70 % static, 30 % JavaScript (``--mixed-products``): the share of requests over plain
    HTTP after the first 200 (at the shop), item recall (products in MongoDB with every field
    as the shop has it, over the products), and CPU seconds per page (the node's process tree,
    from the kernel's accounting of reaped children; the node runs under
    tests/benchmarks/reaper.py, which reaps the renderers Chromium's zygote leaves behind),
    for browser-only (every page of the section rendered) and adaptive; not the CPU of
    Redis, MongoDB or the shop. "ceiling" is about the best plain share the crawl's order
    allowed: one render for each JavaScript page first asked for after the warm-up, over the
    requests after it (a plain fetch is faster than a render, so the first 200 requests hold
    fewer than 30 % of them, and the rest more); approximate, since those requests include
    adaptive rendering's own extra plain fetches.

``--limits`` adds the old sweep of browser limits (CONTEXTSxPAGES) on (a)'s site with this
code's browser-only path.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pymongo
import redis

from project.ops.services import (
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    stop_service,
)
from project.utils import child_processes
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
#: The commit before adaptive rendering and page reuse ("today" in the issue).
BASE = "d190815"
_AVAILABILITY = {"in stock": "in_stock", "out of stock": "out_of_stock"}
_NODE_SETTINGS: dict[str, Any] = {
    "FRONTIER_IDLE_GRACE": 1.0,
    "FRONTIER_MAINTENANCE_SECONDS": 0.5,
    "LOG_LEVEL": "INFO",
}
_WARM_UP = 200
_REAPER = Path(__file__).with_name("reaper.py")


def _tree(root: int) -> list[int]:
    """*root* and all its descendants."""
    found, todo = [], [str(root)]
    while todo:
        pid = todo.pop()
        found.append(int(pid))
        todo += child_processes(pid)
    return found


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of *root* and its descendants so far: each live one's own and that of
    the children it reaped (utime, stime, cutime, cstime of /proc/<pid>/stat)."""
    ticks = 0
    for pid in _tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(v) for v in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_pss_kib(root: int, *, with_root: bool = True) -> int:
    """PSS of *root* (unless not *with_root*) and all its descendants, from
    /proc/<pid>/smaps_rollup."""
    total = 0
    for pid in _tree(root)[0 if with_root else 1 :]:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue  # exited between the listing and the read
    return total


class _Sampler(threading.Thread):
    """Samples the node's tree PSS and the shop's counts of the mixed section until stopped."""

    def __init__(self, pid: int, shop: ShopServer, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.shop, self.interval = pid, shop, interval
        self.peak_kib = 0
        self.render_starts: dict[str, float] = {}
        #: (hits, renders, pages, CPU seconds of the node) when the shop had answered
        #: _WARM_UP requests of the section
        self.warm: tuple[int, int, int, float] | None = None
        #: the pages the shop had served by then
        self.warm_paths: frozenset[str] = frozenset()
        self.last: tuple[int, int] = (0, 0)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            # the node's tree, not the reaper above it
            self.peak_kib = max(self.peak_kib, tree_pss_kib(self.pid, with_root=False))
            self.sample()
            self.done.wait(self.interval)
        self.sample()

    def sample(self) -> None:
        stats = self.shop.stats()
        now = time.monotonic()
        for path, n in stats["mixed_renders"].items():
            if n and path not in self.render_starts and "/app/" in path:
                self.render_starts[path] = now
        hits = sum(stats["mixed_hits"].values())
        renders = sum(stats["mixed_renders"].values())
        self.last = (hits, renders)
        if self.warm is None and hits >= _WARM_UP:
            pages = len(stats["mixed_hits"])
            self.warm = (hits, renders, pages, tree_cpu_seconds(self.pid))
            self.warm_paths = frozenset(stats["mixed_hits"])


def run_node(
    shop: ShopServer, services: ServicesConfig, state: Path, cwd: Path, **settings: Any
) -> dict[str, float]:
    """Crawl the shop's mixed section with one node; return what it measured."""
    client = redis.Redis.from_url(services.redis_url)
    client.flushall()
    client.close()
    shop.reset()
    database = f"bench_{os.getpid()}_{time.monotonic_ns()}"
    merged = {**_NODE_SETTINGS, "MONGO_JOURNAL_DIR": str(state / "journal"), **settings}
    # through the reaper, so that the renderers' CPU is counted (tests/benchmarks/reaper.py)
    argv = [sys.executable, str(_REAPER), sys.executable, "-m", "scrapy", "crawl", "products"]
    for key, value in merged.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(
        os.environ,
        REDIS_URL=services.redis_url,
        MONGO_URI=services.mongo_url,
        MONGO_DATABASE=database,
        PYTHONPATH=str(cwd),
    )
    log_path = state / "node.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    sampler = _Sampler(proc.pid, shop)
    sampler.start()
    redis.Redis.from_url(services.redis_url).lpush("products:start_urls", shop.url("/mixed/"))
    try:
        code = proc.wait(900)
    finally:
        if proc.poll() is None:
            # the reaper, the node and its browser; again while the tree forks (the orphans
            # go to the reaper, which is killed last)
            for _ in range(20):
                tree = _tree(proc.pid)
                for pid in reversed(tree):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                if len(tree) == 1:
                    break
                time.sleep(0.1)
            proc.wait()
        sampler.done.set()
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"node exited with {code}:\n{log_path.read_text()[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    starts = sorted(sampler.render_starts.values())
    rate = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0
    hits, renders = sampler.last
    pages = len(shop.stats()["mixed_hits"])
    warm_hits, warm_renders, warm_pages, warm_cpu = sampler.warm or (hits, renders, pages, cpu)
    after_warm = hits - warm_hits
    plain_share = (after_warm - (renders - warm_renders)) / after_warm if after_warm else 0.0
    # the best plain share this crawl's order allowed: every JavaScript page first asked for
    # after the warm-up rendered once, nothing else rendered
    served = shop.stats()["mixed_hits"]
    late_js = sum(1 for path in served if "/app/" in path and path not in sampler.warm_paths)
    ceiling = (after_warm - late_js) / after_warm if after_warm else 0.0
    expected = shop.mixed_expected()["products"]
    with pymongo.MongoClient(services.mongo_url) as mongo:
        stored = {doc["url"]: doc for doc in mongo[database].products.find({})}
        mongo.drop_database(database)
    found = sum(1 for url, product in expected.items() if _as_expected(stored.get(url), product))
    return {
        "pages_per_s": rate,
        "peak_mib": sampler.peak_kib / 1024,
        "plain_share": plain_share,
        "plain_ceiling": ceiling,
        "recall": found / len(expected),
        "cpu_per_page": cpu / pages if pages else 0.0,
        "warm_cpu_per_page": (cpu - warm_cpu) / (pages - warm_pages) if pages > warm_pages else 0.0,
        "renders": renders,
        "requests": hits,
    }


def _as_expected(doc: dict[str, Any] | None, product: dict[str, Any]) -> bool:
    if doc is None:
        return False
    fields = ("name", "price", "currency", "sku", "description")
    return all(doc.get(f) == product[f] for f in fields) and doc.get(
        "availability"
    ) == _AVAILABILITY.get(product["availability"])


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


@contextlib.contextmanager
def _worktree(rev: str):
    where = Path(tempfile.mkdtemp(prefix="rendering-base-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(where), rev],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(where)],
            cwd=ROOT, capture_output=True, check=False,
        )  # fmt: skip
        shutil.rmtree(where, ignore_errors=True)


_VARIANTS_A = {
    "today": {},
    "browser-only": {"PLAYWRIGHT_RENDER_URLS": '["/mixed/app/"]'},
    "adaptive": {"PLAYWRIGHT_ADAPTIVE": True},
}
_VARIANTS_B = {
    "browser-only": {"PLAYWRIGHT_RENDER_URLS": '["/mixed/"]'},
    "adaptive": {"PLAYWRIGHT_ADAPTIVE": True},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--js-products", type=int, default=120)
    parser.add_argument("--mixed-products", type=int, default=600)
    parser.add_argument("--base", default=BASE, help="the commit 'today' runs")
    parser.add_argument("--limits", default="", help="CONTEXTSxPAGES sweep, e.g. 1x4,1x8")
    parser.add_argument("--only", default="a,b", help="the parts to run: a, b or both")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="rendering-") as name, _worktree(args.base) as base:
        state = Path(name)
        services = ServicesConfig(state_dir=state / "services", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        try:
            if "a" in parts:
                _part_a(args, services, state, base)
            if "b" in parts:
                _part_b(args, services, state)
            if args.limits:
                _limits(args, services, state)
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")


def _part_a(args: argparse.Namespace, services: ServicesConfig, state: Path, base: Path) -> None:
    results: dict[str, list[dict[str, float]]] = {v: [] for v in _VARIANTS_A}
    with ShopServer(1, mixed=args.js_products, mixed_js_share=1.0) as shop:
        for run in range(args.runs):
            order = list(_VARIANTS_A)[run % 3 :] + list(_VARIANTS_A)[: run % 3]
            for variant in order:
                cwd = base if variant == "today" else ROOT
                results[variant].append(
                    run_node(shop, services, state, cwd, **_VARIANTS_A[variant])
                )
    print(
        f"(a) {args.js_products} products, all JavaScript; one node (1 context x 6 pages, the default);"
        f" medians of {args.runs} runs; {os.cpu_count()} CPUs; today = {args.base}"
    )
    print(
        f"{'variant':>14} {'pages/s':>8} {'x browser-only':>15} {'x today':>8}"
        f" {'peak PSS MiB':>13} {'recall':>7}"
    )
    medians = {v: _medians(r) for v, r in results.items()}
    only, today = medians["browser-only"], medians["today"]
    for variant, m in medians.items():
        print(
            f"{variant:>14} {m['pages_per_s']:>8.2f}"
            f" {m['pages_per_s'] / only['pages_per_s']:>15.2f}"
            f" {m['pages_per_s'] / today['pages_per_s']:>8.2f} {m['peak_mib']:>13.0f}"
            f" {m['recall']:>7.1%}"
        )
    print()


def _part_b(args: argparse.Namespace, services: ServicesConfig, state: Path) -> None:
    results: dict[str, list[dict[str, float]]] = {v: [] for v in _VARIANTS_B}
    with ShopServer(1, mixed=args.mixed_products, mixed_js_share=0.3) as shop:
        for run in range(args.runs):
            order = list(_VARIANTS_B)[run % 2 :] + list(_VARIANTS_B)[: run % 2]
            for variant in order:
                results[variant].append(
                    run_node(shop, services, state, ROOT, **_VARIANTS_B[variant])
                )
    print(
        f"(b) {args.mixed_products} products, 70 % static, 30 % JavaScript; one node;"
        f" plain share after the first {_WARM_UP} requests; medians of {args.runs} runs"
    )
    print(
        f"{'variant':>14} {'requests':>9} {'renders':>8} {'plain':>7} {'ceiling':>8} {'recall':>8}"
        f" {'x recall':>9} {'CPU s/page':>11} {'x fewer':>8} {'after warm-up':>14}"
        f" {'x fewer':>8}"
    )
    medians = {v: _medians(r) for v, r in results.items()}
    only = medians["browser-only"]
    for variant, m in medians.items():
        print(
            f"{variant:>14} {m['requests']:>9.0f} {m['renders']:>8.0f} {m['plain_share']:>7.1%}"
            f" {m['plain_ceiling']:>8.1%} {m['recall']:>8.2%} {m['recall'] / only['recall']:>9.3f}"
            f" {m['cpu_per_page']:>11.4f} {only['cpu_per_page'] / m['cpu_per_page']:>8.2f}"
            f" {m['warm_cpu_per_page']:>14.4f}"
            f" {only['warm_cpu_per_page'] / m['warm_cpu_per_page']:>8.2f}"
        )
    for variant, runs in results.items():
        shares = ", ".join(f"{r['plain_share']:.1%} of {r['plain_ceiling']:.1%}" for r in runs)
        cpu = ", ".join(f"{r['cpu_per_page']:.4f}" for r in runs)
        print(f"{variant:>14} runs: plain {shares}; CPU s/page {cpu}")
    # each run's pair ran back to back: their ratio is spared the machine's drift over minutes
    pairs = [o["cpu_per_page"] / a["cpu_per_page"]
             for o, a in zip(results["browser-only"], results["adaptive"], strict=True)]  # fmt: skip
    print(
        f"{'':>14} CPU x fewer, run by run (adaptive against the browser-only run beside it):"
        f" {', '.join(f'{r:.2f}' for r in pairs)}; median {statistics.median(pairs):.2f}"
    )
    print()


def _limits(args: argparse.Namespace, services: ServicesConfig, state: Path) -> None:
    configs = [tuple(int(n) for n in c.split("x")) for c in args.limits.split(",")]
    results: dict[tuple[int, ...], list[dict[str, float]]] = {c: [] for c in configs}
    with ShopServer(1, mixed=args.js_products, mixed_js_share=1.0) as shop:
        for _ in range(args.runs):
            for contexts, pages in configs:
                results[(contexts, pages)].append(
                    run_node(
                        shop, services, state, ROOT,
                        PLAYWRIGHT_RENDER_URLS='["/mixed/app/"]',
                        PLAYWRIGHT_MAX_CONTEXTS=contexts,
                        PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=pages,
                    )
                )  # fmt: skip
    print(f"browser limits, browser-only, {args.js_products} JavaScript products")
    print(
        f"{'contexts x pages':>16} {'pages/s':>8} {'x base':>7} {'peak PSS MiB':>12} {'x base':>7}"
    )
    base = _medians(results[configs[0]])
    for config in configs:
        row = _medians(results[config])
        label = "x".join(map(str, config)) + (" (base)" if config == configs[0] else "")
        print(
            f"{label:>16} {row['pages_per_s']:>8.2f} {row['pages_per_s'] / base['pages_per_s']:>7.2f}"
            f" {row['peak_mib']:>12.0f} {row['peak_mib'] / base['peak_mib']:>7.2f}"
        )


if __name__ == "__main__":
    main()
