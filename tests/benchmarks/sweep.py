"""Sweep nodes x CONCURRENT_REQUESTS against the test shop with latency.

    python -m tests.benchmarks.sweep [--products 1500] [--latency-ms 50] [--runs 2]

Reports pages/s, CPU seconds per 1000 pages and peak RSS per node for each
combination, with pages/s as a ratio against the 1-node, 8-request baseline
measured in the same run (medians of ``--runs``). Item pipelines are off and
the fleet rate limit is off, so this shows what the fleet can do; politeness
then caps it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from project.ops.services import ServicesConfig, free_port, start_redis, stop_service
from tests.benchmarks.frontier import run_variant
from tests.site.server import ShopServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--products", type=int, default=1500)
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--concurrency", default="8,16,32")
    args = parser.parse_args()
    plan = [(int(n), int(c)) for n in args.nodes.split(",") for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as state:
        cfg = ServicesConfig(state_dir=Path(state), redis_port=free_port(), mongo_port=free_port())
        start_redis(cfg)
        try:
            with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
                results: dict[tuple[int, int], list[dict[str, float]]] = {}
                for _ in range(args.runs):
                    for nodes, concurrency in plan:
                        result = run_variant(
                            "fleet", nodes, shop, cfg.redis_url, concurrency=concurrency
                        )
                        results.setdefault((nodes, concurrency), []).append(result)
        finally:
            stop_service(cfg, "redis")
    print(f"{args.products} products, {args.latency_ms} ms latency, medians of {args.runs} runs")
    print(
        f"{'nodes':>5} {'CONC_REQ':>8} {'pages/s':>8} {'x base':>6} "
        f"{'cpu s/1k pages':>14} {'peak RSS/node MiB':>17}"
    )
    base = statistics.median(r["pages_per_s"] for r in results[plan[0]])
    for (nodes, concurrency), runs in results.items():
        rate = statistics.median(r["pages_per_s"] for r in runs)
        cpu = statistics.median(r["cpu_ms_per_page"] for r in runs)
        rss = statistics.median(r["max_rss_mib"] for r in runs)
        print(
            f"{nodes:>5} {concurrency:>8} {rate:>8.1f} {rate / base:>6.2f} "
            f"{cpu:>14.2f} {rss:>17.0f}"
        )


if __name__ == "__main__":
    main()
