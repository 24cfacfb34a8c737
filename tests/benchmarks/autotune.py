"""Autotune benchmark: a tuned node against fixed concurrencies, on a shop with a latency knee.

    python -m tests.benchmarks.autotune [--knee 16] [--latency-ms 300] [--fixed 4,8,16,32,64]
        [--fixed-seconds 60] [--tuned-seconds 180] [--runs 1]

The test shop serves ``--knee`` requests at once, ``--latency-ms`` each; the others queue, so
past the knee latency grows with concurrency and throughput stays at knee / latency. One
``scrapy crawl products`` node at a time (items in FerretDB): fixed ``CONCURRENT_REQUESTS``
settings, then ``FLEET_AUTOTUNE`` starting from 2, each run as long as given (then SIGTERM).
Printed: pages/s at the shop over the second half of each run, as a ratio to the best fixed
setting; for the tuned node, its limit at the end (from its heartbeats, every second) and
when it settled for good within 15 % of the knee.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from project.ops.services import (
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    stop_service,
)
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
_NODE = {
    "FRONTIER_IDLE_GRACE": "1.0",
    "LOG_LEVEL": "INFO",
    "MONITOR_INTERVAL": "1.0",
    "FLEET_STOP_GRACE": "2",
}


def _run(
    services: ServicesConfig,
    shop: ShopServer,
    state: Path,
    seconds: float,
    settings: dict[str, str],
) -> dict[str, object]:
    client = redis.Redis.from_url(services.redis_url)
    client.flushall()
    shop.reset()
    argv = [sys.executable, "-m", "scrapy", "crawl", "products"]
    for key, value in {**_NODE, **settings}.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(
        os.environ,
        REDIS_URL=services.redis_url,
        MONGO_URI=services.mongo_url,
        MONGO_DATABASE=f"autotune_{time.monotonic_ns()}",
        PYTHONPATH=str(ROOT),
    )
    hits: list[tuple[float, int]] = []
    limits: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            now = time.monotonic()
            hits.append((now, sum(shop.stats()["hits"].values())))
            for raw in client.hvals("products:nodes"):
                record = json.loads(raw)
                if record.get("state") == "running":
                    limits.append((now, int(record.get("concurrency") or 0)))

    with (state / "node.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    client.lpush("products:start_urls", shop.url("/"))
    started = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(seconds)
        if proc.poll() is not None:
            raise RuntimeError("the node ended before the run did: give the shop more products")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        done.set()
        sampler.join()
        client.close()
    half = [(t, n) for t, n in hits if t - started >= seconds / 2]
    rate = (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0]) if len(half) > 1 else 0.0
    return {"pages_per_s": rate, "limits": [(t - started, n) for t, n in limits]}


def _settled(limits: list[tuple[float, int]], knee: int) -> float | None:
    """Seconds after which the limit stayed within 15 % of *knee* to the end."""
    inside = [abs(n - knee) <= 0.15 * knee for _, n in limits]
    if not inside or not inside[-1]:
        return None
    last_out = max((i for i, ok in enumerate(inside) if not ok), default=-1)
    return limits[last_out + 1][0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--knee", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--fixed", default="4,8,16,32,64")
    parser.add_argument("--fixed-seconds", type=float, default=60.0)
    parser.add_argument("--tuned-seconds", type=float, default=180.0)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    fixed = [int(n) for n in args.fixed.split(",")]
    most = max(*fixed, 64)
    products = int(args.knee / (args.latency_ms / 1000) * args.tuned_seconds * 1.5) + 500
    common = {"CONCURRENT_REQUESTS_PER_DOMAIN": str(most), "FRONTIER_SITE_CONCURRENCY": str(most)}
    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="autotune-") as name:
        state = Path(name)
        services = ServicesConfig(state_dir=state / "services", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        try:
            with ShopServer(products, latency_ms=args.latency_ms, knee=args.knee) as shop:
                for _ in range(args.runs):
                    for n in fixed:
                        results.setdefault(f"fixed {n}", []).append(
                            _run(
                                services,
                                shop,
                                state,
                                args.fixed_seconds,
                                {**common, "CONCURRENT_REQUESTS": str(n)},
                            )
                        )
                    results.setdefault("tuned", []).append(
                        _run(
                            services,
                            shop,
                            state,
                            args.tuned_seconds,
                            {
                                **common,
                                "CONCURRENT_REQUESTS": str(most),
                                "FLEET_AUTOTUNE": "True",
                                "FLEET_AUTOTUNE_START": "2",
                            },
                        )
                    )
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    rates = {v: statistics.median(float(r["pages_per_s"]) for r in runs)  # type: ignore[arg-type]
             for v, runs in results.items()}  # fmt: skip
    best = max(v for k, v in rates.items() if k != "tuned")
    print(
        f"autotune: knee {args.knee} at {args.latency_ms:g} ms (at most"
        f" {args.knee / args.latency_ms * 1000:.1f} pages/s); medians of {args.runs} run(s);"
        f" {os.cpu_count()} CPUs"
    )
    print(
        f"{'variant':>10} {'pages/s':>8} {'x best fixed':>13} {'limit at end':>13} {'settled s':>10}"
    )
    for variant, rate in rates.items():
        line = f"{variant:>10} {rate:>8.2f} {rate / best:>13.2f}"
        if variant == "tuned":
            run = results[variant][-1]
            limits = run["limits"]  # type: ignore[assignment]
            end = limits[-1][1] if limits else 0  # type: ignore[index]
            settled = _settled(limits, args.knee)  # type: ignore[arg-type]
            line += f" {end:>13} {'never' if settled is None else f'{settled:.0f}':>10}"
            print(line)
            print("   limit every 10 s:", [n for t, n in limits][::10])  # type: ignore[misc]
        else:
            print(line)


if __name__ == "__main__":
    main()
