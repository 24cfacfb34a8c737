"""Recrawl benchmark: a second crawl of a shop that changed, with revisits and 304s, against
the first crawl and against today's way (the seen-set cleared, every page fetched again).

    python -m tests.benchmarks.recrawl [--products 1000] [--nodes 2] [--latency-ms 20] [--runs 1]

A private Redis and FerretDB, one test shop. Crawl 1 (epoch 0) with ``FRONTIER_REVISIT =
{".": "1s"}``; the shop moves to epoch 1 (10 % of prices and 5 % of stock change, 2 % of the
products added and 2 % removed); crawl 2 revisits; crawl 3 is the same second crawl done as
today, the frontier cleared first and no revisit policy. Per crawl: pages fetched, 304s at the
shop, products inserted, updated (changed), touched (unchanged, from a 304), gone, body bytes
the shop sent, wall seconds (seed to last exit). Ratios against crawl 1; medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import redis

from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.benchmarks.slowsite import _KEYS, DATABASE, Bench
from tests.site.server import ShopServer

REVISIT = {"FRONTIER_REVISIT": {".": "1s"}}
_CAP = 16  # FRONTIER_SITE_CONCURRENCY of every crawl


@dataclass(frozen=True)
class Figures:
    pages: int
    not_modified: int
    inserted: int
    updated: int
    touched: int
    gone: int
    body_bytes: int
    wall: float


class Recrawl(Bench):
    """Crawls that keep the frontier and the database between them."""

    def run(self, nodes: int, settings: dict[str, Any], *, clear: bool) -> Figures:
        client = redis.Redis.from_url(self.services.redis_url)
        mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(self.services.mongo_url)
        if clear:
            client.flushall()
        self.shop.reset()
        runs_before = mongo[DATABASE]["crawl_runs"].count_documents({})
        with tempfile.TemporaryDirectory(prefix="recrawl-") as name:
            tmp = Path(name)
            bench = dataclasses.replace(self, settings={**self.settings, **settings})
            client.delete(_KEYS.nodes)  # this crawl waits for its own nodes to register
            seeded, exits, _ = bench.run_nodes(nodes, _CAP, tmp, client)
        stats = self.shop.stats()
        deadline = time.monotonic() + 30
        while mongo[DATABASE]["crawl_runs"].count_documents({}) <= runs_before:
            if time.monotonic() > deadline:
                raise RuntimeError("no run report")
            time.sleep(0.1)
        report = mongo[DATABASE]["crawl_runs"].find_one(sort=[("ended", -1)])
        assert report is not None
        items = report["items"]
        mongo.close()
        client.close()
        return Figures(
            pages=stats["total"], not_modified=stats["not_modified"], inserted=items["inserted"],
            updated=items["updated"], touched=items["touched"], gone=items["gone"],
            body_bytes=stats["body_bytes"], wall=max(exits) - seeded,
        )  # fmt: skip


def _median(runs: list[Figures]) -> Figures:
    return Figures(
        *(statistics.median(getattr(r, f) for r in runs) for f in Figures.__dataclass_fields__)
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.recrawl")
    parser.add_argument("--products", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results: dict[str, list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="recrawl-state-") as state:
        services = ServicesConfig(
            state_dir=Path(state), redis_port=free_port(), mongo_port=free_port()
        )
        start_redis(services)
        try:
            start_mongo(services)
            for _ in range(args.runs):
                with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
                    bench = Recrawl(shop, services, {}, args.latency_ms / 1000, 0, args.timeout)
                    pymongo.MongoClient(services.mongo_url).drop_database(DATABASE)
                    results.setdefault("1: first crawl", []).append(
                        bench.run(args.nodes, REVISIT, clear=True)
                    )
                    shop.set_epoch(1)
                    time.sleep(1.2)
                    results.setdefault("2: revisits, 304s", []).append(
                        bench.run(args.nodes, REVISIT, clear=False)
                    )
                    results.setdefault("3: today (cleared)", []).append(
                        bench.run(args.nodes, {}, clear=True)
                    )
                    changes = shop.changes()
                    print(f"epoch 1: {len(changes['price'])} prices, {len(changes['availability'])}"
                          f" stock, {len(changes['added'])} added, {len(changes['removed'])} removed",
                          file=sys.stderr)  # fmt: skip
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    base = _median(results["1: first crawl"])
    print(
        f"{args.products} products, {args.nodes} nodes, {args.latency_ms:g} ms a page, medians of {args.runs}"
    )
    print(
        "| crawl | pages | 304s | inserted | updated | touched | gone | body bytes | x crawl 1 | wall s | x crawl 1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        f = _median(runs)
        print(f"| {name} | {f.pages:.0f} | {f.not_modified:.0f} | {f.inserted:.0f} | {f.updated:.0f}"
              f" | {f.touched:.0f} | {f.gone:.0f} | {f.body_bytes:,.0f} | {f.body_bytes / base.body_bytes:.2f}"
              f" | {f.wall:.1f} | {f.wall / base.wall:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
