"""The demo crawl: services, the test shop, two nodes, a redis-cli seed, a summary."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.frontier.keys import FrontierKeys
from project.ops.services import (
    ServiceError,
    ServicesConfig,
    start_mongo,
    start_redis,
    status,
    stop_service,
)
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Sequence


__all__ = ["main"]

_ROOT = Path(__file__).resolve().parents[2]


def _start_shop(products: int, latency_ms: int, log: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.site",
            "--port",
            "0",
            "--products",
            str(products),
            "--latency-ms",
            str(latency_ms),
        ],
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("LISTENING "):
        proc.kill()
        raise ServiceError(f"the test shop did not start; see {log}")
    return proc, line.split(" ", 1)[1]


def _shop_stats(base_url: str) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(base_url + "/_stats", timeout=10) as response:
        data: dict[str, Any] = json.load(response)
        return data


def _keys(spider: str) -> FrontierKeys:
    from scrapy.utils.project import get_project_settings

    return FrontierKeys.from_settings(get_project_settings(), spider)


def _reset_frontier(redis_url: str, keys: FrontierKeys) -> None:
    import redis

    from project.frontier.admin import clear_frontier

    with redis.Redis.from_url(redis_url) as client:
        clear_frontier(client, keys)


def _mongo_products(uri: str, database: str, drop: bool = False) -> int:
    import pymongo

    client: pymongo.MongoClient[dict[str, Any]]
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        if drop:
            client.drop_database(database)
            return 0
        return int(client[database]["products"].count_documents({}))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.site.demo")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--products", type=int, default=2000)
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--database", default="fleetcrawl_demo")
    parser.add_argument(
        "--keep-services", action="store_true", help="leave Redis and FerretDB running afterwards"
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """Run the demo; return the exit code (non-zero if the summary is wrong)."""
    args = _parser().parse_args(list(argv))
    cfg = ServicesConfig.from_env()
    work = cfg.state_dir / "demo"
    work.mkdir(parents=True, exist_ok=True)
    mongo_uri = os.environ.get("MONGO_URI")
    already = {name for name, s in status(cfg).items() if s.running}
    started: list[str] = []
    try:
        print(start_redis(cfg))
        started += [] if "redis" in already else ["redis"]
        if mongo_uri is None:
            print(start_mongo(cfg))
            started += [] if "mongo" in already else ["mongo"]
            mongo_uri = cfg.mongo_url
        else:
            print(f"mongo: using MONGO_URI {mask_url(mongo_uri)}")
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    shop, base_url = _start_shop(args.products, args.latency_ms, work / "shop.log")
    print(f"shop: {args.products} products at {base_url} ({args.latency_ms} ms latency)")
    env = dict(
        os.environ, REDIS_URL=cfg.redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=args.database
    )
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        keys = _keys("products")
        _reset_frontier(cfg.redis_url, keys)
        _mongo_products(mongo_uri, args.database, drop=True)
        started_at = time.monotonic()
        for index in range(args.nodes):
            with (work / f"node{index}.log").open("wb") as log:
                nodes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "scrapy",
                            "crawl",
                            "products",
                            "-s",
                            "FRONTIER_IDLE_GRACE=2",
                        ],
                        cwd=_ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        print(f"nodes: {args.nodes} x `scrapy crawl products` (logs in {work})")
        redis_cli = shutil.which("redis-cli") or "redis-cli"
        seed = [redis_cli, "-u", cfg.redis_url, "lpush", keys.start_urls, base_url + "/"]
        subprocess.run(seed, check=True, stdout=subprocess.DEVNULL)
        print(f"seed: redis-cli lpush {keys.start_urls} {base_url}/")
        codes = [node.wait() for node in nodes]
        elapsed = time.monotonic() - started_at
        stats = _shop_stats(base_url)
        stored = _mongo_products(mongo_uri, args.database)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
        shop.terminate()
        shop.wait(10)
    twice = sum(1 for n in stats["hits"].values() if n > 1)
    products_twice = sum(1 for n in stats["product_hits"].values() if n > 1)
    print()
    print("Demo crawl summary")
    print(f"  nodes                          {args.nodes} (exit codes {codes})")
    print(f"  pages fetched                  {stats['total']}")
    print(f"  products in the shop           {stats['products']}")
    print(f"  products in MongoDB            {stored}  ({args.database}.products)")
    print(f"  pages fetched more than once   {twice}")
    print(f"  products fetched more than once {products_twice}")
    print(f"  elapsed                        {elapsed:.1f} s")
    if started and not args.keep_services:
        for name in started:
            stop_service(cfg, name)
        print(f"  stopped {', '.join(started)}; `fleetcrawl services start` brings the data back")
    ok = codes == [0] * args.nodes and stored == stats["products"] and twice == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
