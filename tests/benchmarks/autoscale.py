"""Autoscale benchmark: the useful nodes the fleet reports against the node count that pays.

    python -m tests.benchmarks.autoscale [--seconds 20] [--latency-ms 500]

For a few crawl shapes, the test shops' pages at ``--latency-ms`` each and every node running
``CONCURRENT_REQUESTS`` downloads:

- one site capped at 8 downloads at once, 2 a node;
- 12 sites capped at 1 each, 2 a node;
- 50 sites capped at 1 each, 8 a node, their pages at 2 s each (so that 9 nodes of 8 fit on
  2 CPUs without the CPU being what limits them);
- one site capped at 1 (what is left of a crawl), 2 a node.

``--shapes 1,3`` runs some of them (numbered from 1 in that order).

For each node count of the shape, real ``scrapy crawl`` nodes crawl for ``--seconds`` after a
warm-up, and the pages/s the shops served are measured; the best count is the smallest that
reaches 90 % of the highest rate. ``useful_nodes`` is read from the frontier (what
``/api/v1/scale`` serves) while one node crawls the same shape.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis
from scrapy.settings import Settings

from project.frontier.keys import FrontierKeys
from project.monitoring.status import fleet_status
from project.ops.services import (
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    stop_service,
)
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
_WARM_UP = 8.0


@dataclass(frozen=True)
class Shape:
    name: str
    sites: int
    cap: int
    per_node: int
    counts: tuple[int, ...]
    #: its pages' latency, when not --latency-ms
    latency_ms: float | None = None


SHAPES = (
    Shape("one site, cap 8", 1, 8, 2, (1, 2, 3, 4, 6)),
    Shape("12 sites, cap 1 each", 12, 1, 2, (2, 4, 6, 8)),
    Shape("50 sites, cap 1 each", 50, 1, 8, (3, 5, 7, 9), latency_ms=2000.0),
    Shape("one site, cap 1 (left)", 1, 1, 2, (1, 2, 3)),
)


def _nodes(
    services: ServicesConfig, shape: Shape, count: int, state: Path
) -> list[subprocess.Popen[bytes]]:
    env = dict(
        os.environ,
        REDIS_URL=services.redis_url,
        MONGO_URI=services.mongo_url,
        MONGO_DATABASE=f"autoscale_{time.monotonic_ns()}",
        PYTHONPATH=str(ROOT),
    )
    settings = {
        "FRONTIER_IDLE_GRACE": "1.0",
        "LOG_LEVEL": "INFO",
        "MONITOR_INTERVAL": "1.0",
        "FLEET_STOP_GRACE": "1",
        "CONCURRENT_REQUESTS": str(shape.per_node),
        "CONCURRENT_REQUESTS_PER_DOMAIN": str(shape.per_node),
        "FRONTIER_SITE_CONCURRENCY": str(shape.cap),
    }
    argv = [sys.executable, "-m", "scrapy", "crawl", "products"]
    for key, value in settings.items():
        argv += ["-s", f"{key}={value}"]
    procs = []
    for i in range(count):
        with (state / f"node{i}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _hits(shops: list[ShopServer]) -> int:
    return sum(sum(shop.stats()["hits"].values()) for shop in shops)


def _crawl(
    services: ServicesConfig,
    shops: list[ShopServer],
    shape: Shape,
    count: int,
    seconds: float,
    state: Path,
) -> tuple[float, int]:
    """Pages/s the shops served with *count* nodes, and the useful nodes read meanwhile."""
    client = redis.Redis.from_url(services.redis_url)
    client.flushall()
    for shop in shops:
        shop.reset()
    client.lpush("products:start_urls", *[shop.url("/") for shop in shops])
    procs = _nodes(services, shape, count, state)
    try:
        time.sleep(_WARM_UP)
        useful = fleet_status(client, FrontierKeys.from_settings(Settings(), "products"))["scale"]
        before, started = _hits(shops), time.monotonic()
        time.sleep(seconds)
        rate = (_hits(shops) - before) / (time.monotonic() - started)
        if any(proc.poll() is not None for proc in procs):
            raise RuntimeError("a node ended before the measure did: more products needed")
    finally:
        _stop(procs)
        client.close()
    return rate, int(useful["useful_nodes"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--shapes", default="", help="the shapes to run, e.g. 1,3 (all)")
    args = parser.parse_args()
    chosen = [int(n) for n in args.shapes.split(",") if n] or range(1, len(SHAPES) + 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoscale-") as name:
        state = Path(name)
        services = ServicesConfig(state_dir=state / "services", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        try:
            for shape in (SHAPES[n - 1] for n in chosen):
                latency = shape.latency_ms or args.latency_ms
                # enough pages for the busiest count: every slot busy the whole run
                pages = int(shape.cap * (_WARM_UP + args.seconds + 10) / (latency / 1000))
                with ExitStack() as stack:
                    shops = [
                        stack.enter_context(ShopServer(pages + 50, latency_ms=latency, seed=i))
                        for i in range(shape.sites)
                    ]
                    rates = {}
                    useful_seen = []
                    for count in shape.counts:
                        rate, useful = _crawl(services, shops, shape, count, args.seconds, state)
                        rates[count] = rate
                        useful_seen.append(useful)
                        print(
                            f"  {shape.name}: {count} nodes, {rate:.1f} pages/s, useful {useful}",
                            flush=True,
                        )
                top = max(rates.values())
                best = min(n for n, r in rates.items() if r >= 0.9 * top)
                rows.append((shape, rates, best, useful_seen))
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    print(
        f"autoscale: {args.latency_ms:g} ms a page (unless the shape says), {os.cpu_count()} CPUs,"
        f" {args.seconds:g} s a run"
    )
    print(f"{'shape':>24} {'pages/s by nodes':>40} {'best':>5} {'useful (read per run)':>22}")
    for shape, rates, best, useful_seen in rows:
        by = ", ".join(f"{n}: {r:.1f}" for n, r in rates.items())
        print(f"{shape.name:>24} {by:>40} {best:>5} {useful_seen!s:>22}")


if __name__ == "__main__":
    main()
