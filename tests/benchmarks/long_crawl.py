"""A long crawl on the embedded store: does it keep its pace, and do the nodes keep their memory?

    python -m tests.benchmarks.long_crawl [--products 100000] [--nodes 2] [--latency-ms 0]
        [--timeout 3600]

A private Redis and FerretDB (the embedded default, as ``make demo`` runs it), one test shop,
real ``scrapy crawl`` nodes (pipelines on, each under a 4 GiB address-space cap). Once a second
it samples the products stored in MongoDB and each node's resident memory (``/proc``).
Printed: products/s over the first and the last tenth of the catalogue (stored, not fetched)
and their ratio (goal: at least 0.8), and each node's RSS at a quarter of the crawl, its peak,
and their ratio (goal: at most 1.3), with the nodes' store counters (``mongo/backpressure``,
``mongo/waiting_max``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymongo
import redis

from project.frontier.keys import FrontierKeys
from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "long_crawl_bench"
MEMORY_CAP = 4 << 30


def _node(index: int, tmp: Path, services: ServicesConfig) -> subprocess.Popen[bytes]:
    settings = {
        "LOG_FILE": str(tmp / f"node{index}.log"),
        "LOG_LEVEL": "INFO",
        "MONGO_JOURNAL_DIR": str(tmp / f"journal{index}"),
        "MONITOR_STATS_FILE": str(tmp / f"node{index}.stats.json"),
        "TELNETCONSOLE_ENABLED": False,
    }
    argv = ["prlimit", f"--as={MEMORY_CAP}", "--", sys.executable, "-m", "scrapy", "crawl",
            "products"]  # fmt: skip
    for key, value in settings.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(os.environ, REDIS_URL=services.redis_url, MONGO_URI=services.mongo_url,
               MONGO_DATABASE=DATABASE, PYTHONPATH=str(ROOT))  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _rss(pid: int) -> int:
    """Resident bytes of *pid* (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _crossing(samples: list[tuple[float, int, list[int]]], count: float) -> float:
    """Seconds at which the stored count first reached *count* (interpolated)."""
    before = samples[0]
    for sample in samples:
        if sample[1] >= count:
            t0, n0, _ = before
            t1, n1, _ = sample
            return t1 if n1 == n0 else t0 + (t1 - t0) * (count - n0) / (n1 - n0)
        before = sample
    return samples[-1][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--latency-ms", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    samples: list[tuple[float, int, list[int]]] = []  # (seconds, stored, RSS per node)
    with tempfile.TemporaryDirectory(prefix="long-crawl-") as name:
        tmp = Path(name)
        services = ServicesConfig(state_dir=tmp / "state", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        procs: list[subprocess.Popen[bytes]] = []
        mongo: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            services.mongo_url, serverSelectionTimeoutMS=5000
        )
        try:
            with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
                procs = [_node(i, tmp, services) for i in range(args.nodes)]
                keys = FrontierKeys.for_spider("products")
                client = redis.Redis.from_url(services.redis_url)
                deadline = time.monotonic() + 60
                while client.zcard(keys.holders) < args.nodes and time.monotonic() < deadline:
                    time.sleep(0.05)
                started = time.monotonic()
                client.lpush(keys.start_urls, shop.url("/"))
                client.close()
                products = mongo[DATABASE].products
                while any(p.poll() is None for p in procs):
                    now = time.monotonic() - started
                    if now > args.timeout:
                        break
                    stored = products.estimated_document_count()
                    samples.append((now, stored, [_rss(p.pid) for p in procs]))
                    time.sleep(1.0)
                samples.append((time.monotonic() - started, products.count_documents({}),
                                [0] * len(procs)))  # fmt: skip
            stats = [json.loads((tmp / f"node{i}.stats.json").read_text())
                     for i in range(len(procs))]  # fmt: skip
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            mongo.close()
            stop_service(services, "mongo")
            stop_service(services, "redis")

    total, tenth = args.products, args.products / 10
    first = tenth / max(_crossing(samples, tenth), 1e-9)
    last = tenth / max(_crossing(samples, total) - _crossing(samples, total - tenth), 1e-9)
    quarter_at = _crossing(samples, total / 4)
    print(
        f"{total} products at {args.latency_ms} ms, {args.nodes} nodes, "
        f"{samples[-1][0]:.0f} s, {samples[-1][1]} stored, exit {[p.returncode for p in procs]}"
    )
    print(f"products/s stored: first tenth {first:.0f}, last tenth {last:.0f},"
          f" last / first x{last / first:.2f} (goal >= 0.8)")  # fmt: skip
    for i in range(len(procs)):
        rss = [s[2][i] for s in samples if s[2][i]]
        at_quarter = next((s[2][i] for s in samples if s[0] >= quarter_at and s[2][i]), 0)
        peak = max(rss, default=0)
        print(f"node{i}: RSS {at_quarter / 2**20:.0f} MiB at a quarter, peak {peak / 2**20:.0f}"
              f" MiB, x{peak / max(at_quarter, 1):.2f} (goal <= 1.3); backpressure"
              f" {stats[i].get('mongo/backpressure', 0)}, waiting max"
              f" {stats[i].get('mongo/waiting_max', 0)}, inserted {stats[i].get('mongo/inserted', 0)}")  # fmt: skip


if __name__ == "__main__":
    main()
