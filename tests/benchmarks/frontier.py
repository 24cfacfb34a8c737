"""Frontier benchmark: in-memory Scrapy vs stock scrapy-redis vs fleetcrawl.

    python -m tests.benchmarks.frontier [--products 3000] [--runs 3]

Same catalogue, same run, item pipelines off (this measures the frontier).
Prints pages/s, CPU ms per page, Redis commands per page (those the Lua
scripts run counted one by one, as ``INFO commandstats`` does since Redis 7),
Redis server CPU per page (``INFO cpu``, user + system, over the crawl) and
round trips per page, with ratios against the in-memory scheduler (CPU) and
stock scrapy-redis (Redis figures), medians of ``--runs`` runs. Then bytes per
seen URL and per queued request for stock and fleetcrawl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from scrapy import Request
from scrapy.utils.test import get_crawler

from project.frontier.config import SiteLimits
from project.frontier.keys import FrontierKeys
from project.frontier.queue import LeasedQueue, StepBatch
from project.frontier.site_queues import site_queue_bytes
from project.frontier.sites import site_of
from project.frontier.wire import encode_request
from project.ops.services import ServicesConfig, free_port, start_redis, stop_service
from spiders.products import ProductsSpider
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if "info" not in k)


def run_variant(
    variant: str, nodes: int, shop: ShopServer, redis_url: str, concurrency: int = 16
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.config_resetstat()
    cpu_before = _redis_cpu(client)
    shop.reset()
    env = dict(
        os.environ,
        REDIS_URL=redis_url,
        BENCH_SEED=shop.url("/"),
        BENCH_CONCURRENCY=str(concurrency),
        PYTHONPATH=str(ROOT),
    )
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"node{i}.json" for i in range(nodes)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.benchmarks.frontier_node", variant, str(out)],
                cwd=ROOT,
                env=env,
                stderr=subprocess.DEVNULL,
            )
            for out in outs
        ]
        if variant != "memory":
            client.lpush("products:start_urls", shop.url("/"))
        for proc in procs:
            proc.wait(600)
        results = [json.loads(out.read_text()) for out in outs]
    pages = sum(r["pages"] for r in results)
    seconds = max(r["seconds"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    redis_cpu = _redis_cpu(client) - cpu_before
    commands = _commands(client) if variant != "memory" else 0
    stats = client.info("commandstats")
    evalsha = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    nested = sum(int(v["calls"]) for k, v in stats.items()) - evalsha
    round_trips = evalsha + (nested if variant == "stock" else 0)
    client.close()
    return {
        "pages": pages,
        "pages_per_s": pages / seconds if seconds else 0.0,
        "cpu_ms_per_page": 1000 * cpu / pages,
        "commands_per_page": commands / pages if variant != "memory" else 0.0,
        "round_trips_per_page": round_trips / pages if variant != "memory" else 0.0,
        "redis_us_per_page": 1e6 * redis_cpu / pages if variant != "memory" else 0.0,
        "max_rss_mib": statistics.median(r["max_rss_kib"] for r in results) / 1024,
    }


def _product_requests(spider: ProductsSpider, base: str, n: int) -> list[Request]:
    return [
        Request(f"{base}/product/{i}", callback=spider.parse_product, priority=0) for i in range(n)
    ]


def storage_bytes(redis_url: str, base: str, n: int = 5000) -> dict[str, dict[str, float]]:
    """Bytes per seen URL and per queued request, stock vs fleetcrawl."""
    from scrapy_redis.dupefilter import RFPDupeFilter
    from scrapy_redis.queue import PriorityQueue

    client = redis.Redis.from_url(redis_url)
    crawler = get_crawler(ProductsSpider)
    spider = ProductsSpider.from_crawler(crawler)
    requests = _product_requests(spider, base, n)
    client.flushall()
    queue = PriorityQueue(client, spider, "stock:requests", pickle)
    stock_df = RFPDupeFilter(client, "stock:dupefilter")
    for request in requests:
        stock_df.request_seen(request)
        queue.push(request)

    keys = FrontierKeys.for_spider("fleet")
    site = site_of(base)

    async def fleet() -> None:
        aclient = redis.asyncio.from_url(redis_url)
        leased = LeasedQueue(aclient, spider, keys, "bench", 60000, SiteLimits())
        fps = crawler.request_fingerprinter
        batch = [
            (
                b"f" + fps.fingerprint(r),
                site_of(r.url),
                r.priority,
                encode_request(r, spider, id=os.urandom(6).hex()),
                "",
            )
            for r in requests
        ]
        for start in range(0, n, 500):
            await leased.step(StepBatch(enqueue=batch[start : start + 500]))
        await aclient.aclose()

    asyncio.run(fleet())

    def per(key: str) -> float:
        return int(client.memory_usage(key, samples=0) or 0) / n

    result = {
        "stock": {"seen": per("stock:dupefilter"), "queued": per("stock:requests")},
        "fleet": {
            "seen": per("fleet:dupefilter"),
            "queued": site_queue_bytes(client, keys, [site])[0] / n,
        },
    }
    client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latencies", default="0,50")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        cfg = ServicesConfig(state_dir=Path(state), redis_port=free_port(), mongo_port=free_port())
        start_redis(cfg)
        try:
            _run_all(args, cfg.redis_url)
        finally:
            stop_service(cfg, "redis")


def _run_all(args: argparse.Namespace, redis_url: str) -> None:
    plan = [("memory", 1), ("stock", 1), ("fleet", 1), ("stock", 2), ("fleet", 2)]
    print(f"catalogue: {args.products} products; medians of {args.runs} runs; pipelines off")
    header = (
        f"{'latency':>7} {'variant':>8} {'nodes':>5} {'pages':>6} {'pages/s':>8} "
        f"{'cpu ms/page':>11} {'x memory':>8} {'cmds/page':>9} {'x stock':>7} "
        f"{'trips/page':>10} {'redis us/page':>13} {'x stock':>7}"
    )
    print(header)
    for latency in (int(x) for x in args.latencies.split(",")):
        with ShopServer(args.products, latency_ms=latency) as shop:
            medians: dict[tuple[str, int], dict[str, float]] = {}
            for _ in range(args.runs):
                # Interleaved, so machine noise hits every variant alike.
                for variant, nodes in plan:
                    result = run_variant(variant, nodes, shop, redis_url)
                    medians.setdefault((variant, nodes), {}).setdefault("runs", []).append(result)  # type: ignore[union-attr, attr-defined]
            rows = {}
            for key, value in medians.items():
                runs = value["runs"]  # type: ignore[index]
                rows[key] = {
                    field: statistics.median(r[field] for r in runs)  # type: ignore[index, union-attr]
                    for field in runs[0]  # type: ignore[index]
                }
            base_cpu = rows[("memory", 1)]["cpu_ms_per_page"]
            for (variant, nodes), row in rows.items():
                stock = rows.get(("stock", nodes), {}).get("commands_per_page") or 0
                stock_cpu = rows.get(("stock", nodes), {}).get("redis_us_per_page") or 0
                print(
                    f"{latency:>5}ms {variant:>8} {nodes:>5} {row['pages']:>6.0f} "
                    f"{row['pages_per_s']:>8.1f} {row['cpu_ms_per_page']:>11.2f} "
                    f"{row['cpu_ms_per_page'] / base_cpu:>8.2f} {row['commands_per_page']:>9.2f} "
                    f"{(row['commands_per_page'] / stock) if stock else 0:>7.2f} "
                    f"{row['round_trips_per_page']:>10.2f} {row['redis_us_per_page']:>13.1f} "
                    f"{(row['redis_us_per_page'] / stock_cpu) if stock_cpu else 0:>7.2f}"
                )
    with ShopServer(10) as shop:
        sizes = storage_bytes(redis_url, shop.url("").rstrip("/"))
    print()
    print(f"{'':>8} {'bytes/seen URL':>14} {'bytes/queued request':>20}")
    for variant, row in sizes.items():
        print(f"{variant:>8} {row['seen']:>14.1f} {row['queued']:>20.1f}")
    ratio_seen = sizes["fleet"]["seen"] / sizes["stock"]["seen"]
    ratio_queued = sizes["fleet"]["queued"] / sizes["stock"]["queued"]
    print(f"{'x stock':>8} {ratio_seen:>14.2f} {ratio_queued:>20.2f}")


if __name__ == "__main__":
    main()
