"""Server-side request rate for 1, 2 and 3 nodes, with and without a fleet limit.

    python -m tests.benchmarks.politeness [--limit 20] [--products 400]

"with limit": FRONTIER_SITE_RATE = limit. "per-process": no fleet limit, each
node with Scrapy's DOWNLOAD_DELAY = 1/limit (what stock Scrapy or
scrapy-redis gives). The shop counts requests per second on its side; the
table shows the median and maximum of the full seconds, as a ratio to the limit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import redis

from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.fleet import Fleet
from tests.site.server import ShopServer


def _rates(shop: ShopServer) -> list[int]:
    per_second = {int(k): v for k, v in shop.stats()["per_second"].items()}
    first, last = min(per_second), max(per_second)
    return [per_second.get(s, 0) for s in range(first + 1, last)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=float, default=20.0)
    parser.add_argument("--products", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        cfg = ServicesConfig(state_dir=Path(state), redis_port=free_port(), mongo_port=free_port())
        start_redis(cfg)
        start_mongo(cfg)
        try:
            print(f"limit {args.limit:g} requests/s; {args.products} products, 20 ms latency")
            print(f"{'mode':>12} {'nodes':>5} {'median/s':>8} {'max/s':>6} {'x limit':>7}")
            for mode in ("fleet limit", "per-process"):
                for nodes in (1, 2, 3):
                    settings = (
                        {"FRONTIER_SITE_RATE": args.limit}
                        if mode == "fleet limit"
                        else {
                            "FRONTIER_SITE_RATE": 0,
                            "DOWNLOAD_DELAY": 1 / args.limit,
                            "RANDOMIZE_DOWNLOAD_DELAY": False,
                            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                        }
                    )
                    with ShopServer(args.products, latency_ms=20) as shop:
                        run = Path(state) / f"{mode[0]}{nodes}"
                        run.mkdir()
                        fleet = Fleet(cfg.redis_url, cfg.mongo_url, f"bench_{mode[0]}{nodes}", run)
                        with redis.Redis.from_url(cfg.redis_url) as client:
                            client.flushall()
                        fleet.seed(shop.url("/"))
                        for _ in range(nodes):
                            fleet.start_node(**settings)
                        fleet.wait(300)
                        rates = _rates(shop)
                    median = statistics.median(rates)
                    print(
                        f"{mode:>12} {nodes:>5} {median:>8.1f} {max(rates):>6} "
                        f"{median / args.limit:>7.2f}"
                    )
        finally:
            stop_service(cfg, "mongo")
            stop_service(cfg, "redis")


if __name__ == "__main__":
    main()
