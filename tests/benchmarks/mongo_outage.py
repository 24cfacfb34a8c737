"""A crawl that ends while MongoDB is away: is every item stored when the last node exits?

    python -m tests.benchmarks.mongo_outage [--products 3000] [--latency-ms 20] [--nodes 2]
        [--stop-at 0.3] [--back-after 30] [--drain-timeout 600]

A private Redis and FerretDB, one test shop. The nodes crawl it; MongoDB is stopped once
``--stop-at`` of the products are stored and started again ``--back-after`` seconds after the
shop served its last product page. Printed: where the outage began, each node's exit status and
exit time against MongoDB's return, products in MongoDB when the last node exited, duplicates
(inserted beyond the catalogue, updated), what the nodes left in their journals (deleted
afterwards, as a container's disk is) and in the outbox, and whether the run's report is stored.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymongo
import redis

from project.frontier.keys import FrontierKeys
from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from project.storage.journal import journal_backlog
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "outage_bench"
MEMORY_CAP = 4 << 30


def _node(
    index: int, tmp: Path, services: ServicesConfig, drain_timeout: float
) -> subprocess.Popen[bytes]:
    settings = {
        "LOG_FILE": str(tmp / f"node{index}.log"),
        "LOG_LEVEL": "INFO",
        "MONGO_JOURNAL_DIR": str(tmp / f"journal{index}"),
        "MONITOR_STATS_FILE": str(tmp / f"node{index}.stats.json"),
        "MONGO_RETRY_MAX_DELAY": 2.0,
        "MONGO_DRAIN_TIMEOUT": drain_timeout,
        "TELNETCONSOLE_ENABLED": False,
    }
    argv = [
        "prlimit",
        f"--as={MEMORY_CAP}",
        "--",
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        "products",
    ]
    for key, value in settings.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(os.environ, REDIS_URL=services.redis_url, MONGO_URI=services.mongo_url,
               MONGO_DATABASE=DATABASE, PYTHONPATH=str(ROOT))  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _count(uri: str) -> int:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=3000) as client:
        return client[DATABASE].products.count_documents({})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--stop-at", type=float, default=0.3)
    parser.add_argument("--back-after", type=float, default=30.0)
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="outage-") as name:
        tmp = Path(name)
        services = ServicesConfig(state_dir=tmp / "state", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
                procs = [_node(i, tmp, services, args.drain_timeout) for i in range(args.nodes)]
                keys = FrontierKeys.for_spider("products")
                client = redis.Redis.from_url(services.redis_url)
                deadline = time.monotonic() + 60
                while client.zcard(keys.holders) < args.nodes and time.monotonic() < deadline:
                    time.sleep(0.05)
                started = time.monotonic()
                client.lpush(keys.start_urls, shop.url("/"))
                while _count(services.mongo_url) < args.products * args.stop_at:
                    time.sleep(0.05)
                fetched_at_stop = len(shop.stats()["product_hits"])
                stop_service(services, "mongo")
                stopped = time.monotonic() - started
                fetched_stopped = len(shop.stats()["product_hits"])
                while len(shop.stats()["product_hits"]) < args.products:
                    if all(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.1)
                last_page = time.monotonic() - started
                back_at = last_page + args.back_after
                exits: list[float | None] = [None] * len(procs)
                back = False
                while any(e is None for e in exits):
                    now = time.monotonic() - started
                    for i, proc in enumerate(procs):
                        if exits[i] is None and proc.poll() is not None:
                            exits[i] = now
                    if not back and now >= back_at:
                        start_mongo(services)
                        back = True
                    time.sleep(0.1)
                if not back:
                    start_mongo(services)
                codes = [p.returncode for p in procs]
                stats = [json.loads((tmp / f"node{i}.stats.json").read_text())
                         for i in range(len(procs))]  # fmt: skip
                journals = [journal_backlog(tmp / f"journal{i}") for i in range(len(procs))]
                outbox_key = f"{keys.outbox}:{DATABASE}"
                outbox = int(client.llen(outbox_key))
                with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as mc:
                    db = mc[DATABASE]
                    stored_at_exit = db.products.count_documents({})
                    reports = db.crawl_runs.count_documents({})
                for i in range(len(procs)):
                    shutil.rmtree(tmp / f"journal{i}", ignore_errors=True)
                client.close()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            stop_service(services, "mongo")
            stop_service(services, "redis")

    def total(key: str) -> int:
        return int(sum(s.get(key, 0) for s in stats))

    print(f"catalogue {args.products} products at {args.latency_ms} ms, {args.nodes} nodes")
    print(f"MongoDB stopped at {stopped:.1f} s ({fetched_at_stop} -> {fetched_stopped} products"
          f" fetched while it stopped); last product page at {last_page:.1f} s; MongoDB back at"
          f" {back_at:.1f} s")  # fmt: skip
    print("exit status, time: " + ", ".join(
        f"node{i} {code} at {t:.1f} s" for i, (code, t) in enumerate(zip(codes, exits, strict=True))
    ))  # fmt: skip
    print(f"products in MongoDB when the last node exited: {stored_at_exit} of {args.products}")
    print(f"inserted {total('mongo/inserted')}, updated {total('mongo/updated')},"
          f" outboxed {total('mongo/outboxed')}, drained {total('mongo/drained')},"
          f" journaled {total('mongo/journaled')}, not stored {total('mongo/not_stored')}")  # fmt: skip
    print(f"left in the nodes' journals: {journals} (deleted); in the outbox: {outbox};"
          f" run reports stored: {reports}")  # fmt: skip


if __name__ == "__main__":
    main()
