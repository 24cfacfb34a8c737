"""Start-up benchmark: how soon a node is useful, and what ``fleetcrawl status`` costs.

    python -m tests.benchmarks.startup [--runs 5] [--sites 10000]

Side by side with the baseline, ``scrapy version`` run outside any project (mostly
``import scrapy``), medians of ``--runs`` interleaved runs, as ratios to that baseline:

- join: a ``scrapy crawl products`` node started while another crawls the test shop (once
  the shop served 20 pages: product requests are queued); from process start to its first
  lease (the node's own "First lease" line, from /proc).
- together: two nodes started at once on a crawl whose every product page is seeded; the
  later of their first leases.

The shop's cap has room for both nodes, so a first lease waits on the node's start-up, not on
another node's permits.
- status: ``fleetcrawl status --json`` on an empty fleet, wall time.
- join, at the site: from the same node's process start to its first request arriving at
  the shop (the shop's own arrival time; the node sends its own User-Agent), the end point
  of the floors below.
- the floors, for scale: what Scrapy itself reaches, as ``scrapy runspider`` outside the
  project (``tests/benchmarks/floor/``), from process start to its first request arriving at
  the shop: a plain spider with one hard-coded URL; the same with both clients connected
  at open (redis-py and pymongo, one round trip each), which any node that shares work in
  Redis and stores in MongoDB needs first; a stock scrapy-redis ``RedisSpider``, its one start
  URL pushed to Redis (what users run today).
- status at ``--sites`` sites: wall time, and the Redis commands it ran (INFO commandstats,
  commands inside scripts included).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from project.frontier.keys import FrontierKeys
from project.ops.services import (
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    stop_service,
)
from tests.fleet import lease_one_each, queue_requests, wait_for
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_FIRST_LEASE = re.compile(rb"First lease ([0-9.]+)s after the process started")
#: The joining node's User-Agent: its requests among the crawling node's in the shop's timeline.
_JOINING_AGENT = "fleetcrawl-startup-joining"
FLOOR = Path(__file__).resolve().parent / "floor"
#: Two nodes' worth of permits at the shop: a node's first lease waits on its start-up, not
#: on another node giving permits back. CONCURRENT_REQUESTS is set: derived from the cap it
#: would be 64 (project/frontier/politeness.py), and the crawling node would hold every permit
#: of the shop, leaving the joining one to wait for its downloads to end (0.8-0.9 s).
_NODE_SETTINGS = {"FRONTIER_IDLE_GRACE": "1.0", "LOG_LEVEL": "INFO", "FLEET_STOP_GRACE": "1",
                  "FRONTIER_SITE_CONCURRENCY": "64", "CONCURRENT_REQUESTS": "32"}  # fmt: skip


def _wall(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True, timeout=120)
    return time.monotonic() - started


def _status_wall(services: ServicesConfig) -> float:
    return _wall(
        [str(BIN / "fleetcrawl"), "status", "--json"], ROOT, _env(services, "startup_status")
    )


def _env(services: ServicesConfig, database: str) -> dict[str, str]:
    return dict(
        os.environ,
        REDIS_URL=services.redis_url,
        MONGO_URI=services.mongo_url,
        MONGO_DATABASE=database,
        PYTHONPATH=str(ROOT),
    )


def _node(env: dict[str, str], log: Path, **settings: str) -> subprocess.Popen[bytes]:
    argv = [str(BIN / "scrapy"), "crawl", "products"]
    for key, value in {**_NODE_SETTINGS, **settings}.items():
        argv += ["-s", f"{key}={value}"]
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _first_lease(log: Path, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _FIRST_LEASE.search(log.read_bytes())
        if found:
            return float(found.group(1))
        time.sleep(0.05)
    raise RuntimeError(f"no first lease in {log}:\n{log.read_text()[-2000:]}")


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _first_arrival(shop: ShopServer, agent: str | None, proc: subprocess.Popen[bytes],
                   log: Path, timeout: float = 60.0) -> float:  # fmt: skip
    """The shop's arrival time (wall clock) of the first request (sent as *agent*, if given)."""

    def arrived() -> float | None:
        if proc.poll() is not None:
            raise RuntimeError(f"{log} exited before a request:\n{log.read_text()[-2000:]}")
        arrivals = [row[0] for row in shop.timeline() if agent is None or row[3] == agent]
        return float(min(arrivals)) if arrivals else None

    arrival: float = wait_for(arrived, timeout, f"a request at the shop from {log}", 0.05)
    return arrival


def _floor(services: ServicesConfig, shop: ShopServer, outside: Path, variant: str) -> float:
    """Seconds from a floor spider's process start to its first request at the shop."""
    client = redis.Redis.from_url(services.redis_url)
    client.flushall()
    shop.reset()
    url = shop.url("/product/1")
    client.lpush("stock:start_urls", url)
    env = {k: v for k, v in _env(services, "startup_floor").items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(FLOOR), FLOOR_URL=url)
    argv = [str(BIN / "scrapy"), "runspider", str(FLOOR / f"{variant.split('+')[0]}.py")]
    if variant.endswith("+clients"):
        argv += ["-s", 'ITEM_PIPELINES={"clients.ClientsPipeline": 300}']
    log = outside / f"{variant}.log"
    with log.open("wb") as out:
        started = time.time()  # the shop stamps arrivals with the wall clock
        proc = subprocess.Popen(argv, cwd=outside, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        return _first_arrival(shop, None, proc, log) - started
    finally:
        _stop(proc)
        client.close()


def _seed(client: redis.Redis, shop: ShopServer) -> None:
    """Work ready at once: every product page seeded (a node's first lease waits on nothing
    but its start-up)."""
    client.flushall()
    client.lpush("products:start_urls", *[shop.url(f"/product/{i}") for i in range(1, 301)])


def _join(services: ServicesConfig, shop: ShopServer, state: Path) -> tuple[float, float]:
    """A node joining a crawl that another node runs (requests are queued): seconds from its
    process start to its first lease, and to its first request at the shop."""
    client = redis.Redis.from_url(services.redis_url)
    env = _env(services, f"startup_{time.monotonic_ns()}")
    client.flushall()
    shop.reset()
    client.lpush("products:start_urls", shop.url("/"))
    crawling = _node(env, state / "a.log")
    try:
        _first_lease(state / "a.log")
        while sum(shop.stats()["hits"].values()) < 20:  # the listings read: products queued
            time.sleep(0.05)
        started = time.time()
        joining = _node(env, state / "b.log", USER_AGENT=_JOINING_AGENT)
        try:
            lease = _first_lease(state / "b.log")
            return lease, _first_arrival(shop, _JOINING_AGENT, joining, state / "b.log") - started
        finally:
            _stop(joining)
    finally:
        _stop(crawling)
        client.close()


def _together(services: ServicesConfig, shop: ShopServer, state: Path) -> float:
    """The later first lease of two nodes started at once on a seeded crawl."""
    client = redis.Redis.from_url(services.redis_url)
    _seed(client, shop)
    env = _env(services, f"startup_{time.monotonic_ns()}")
    nodes = [_node(env, state / f"t{i}.log") for i in range(2)]
    try:
        return max(_first_lease(state / f"t{i}.log") for i in range(2))
    finally:
        _stop(*nodes)
        client.close()


def _fill_sites(client: redis.Redis, sites: int) -> None:
    """*sites* sites with one request queued and one leased each, as the frontier lays them out."""
    keys = FrontierKeys.from_settings(_settings(), "products")
    names = [f"shop{i}.test" for i in range(sites)]
    queue_requests(
        client, keys, ((site, {"url": f"http://{site}/1", "priority": 0}) for site in names)
    )
    lease_one_each(client, keys, names, granted=1, pushed=2)


def _settings():  # type: ignore[no-untyped-def]
    from scrapy.settings import Settings

    return Settings()


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k not in ("cmdstat_info", "cmdstat_config|resetstat", "cmdstat_config")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sites", type=int, default=10_000)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"scrapy version": [], "bare": [], "bare+clients": [],
                                        "stock": [], "join": [], "join at the site": [],
                                        "together": [], "status": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="startup-") as name:
        state = Path(name)
        outside = state / "outside"
        outside.mkdir()
        services = ServicesConfig(state_dir=state / "services", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        plain_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            with ShopServer(3000, latency_ms=300) as shop:
                client = redis.Redis.from_url(services.redis_url)
                for _ in range(args.runs):
                    results["scrapy version"].append(
                        _wall([str(BIN / "scrapy"), "version"], outside, plain_env)
                    )
                    for variant in ("bare", "bare+clients", "stock"):
                        results[variant].append(_floor(services, shop, outside, variant))
                    lease, arrival = _join(services, shop, state)
                    results["join"].append(lease)
                    results["join at the site"].append(arrival)
                    results["together"].append(_together(services, shop, state))
                    client.flushall()
                    results["status"].append(_status_wall(services))
                client.flushall()
                _fill_sites(client, args.sites)
                walls, commands = [], []
                for _ in range(args.runs):
                    client.config_resetstat()
                    walls.append(_status_wall(services))
                    commands.append(_commands(client))
                client.close()
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    base = statistics.median(results["scrapy version"])
    print(
        f"start-up, medians of {args.runs} runs, {os.cpu_count()} CPUs; a first request is"
        " its arrival at the shop"
    )
    print(f"{'':>38} {'seconds':>8} {'x scrapy version':>17} {'x, median of runs':>18}  runs (s)")
    labels = {
        "scrapy version": "scrapy version (outside a project)",
        "bare": "floor: plain Scrapy, first request",
        "bare+clients": "floor: + Redis, MongoDB clients",
        "stock": "scrapy-redis today, first request",
        "join": "node joining a crawl: first lease",
        "join at the site": "node joining: first request",
        "together": "two nodes at once: later lease",
        "status": "fleetcrawl status, empty fleet",
    }
    for key, label in labels.items():
        value = statistics.median(results[key])
        # each run's own ratio too: the machine's load drifts between runs
        paired = statistics.median(
            v / b for v, b in zip(results[key], results["scrapy version"], strict=True)
        )
        runs = " ".join(f"{v:.2f}" for v in results[key])
        print(f"{label:>38} {value:>8.2f} {value / base:>17.2f} {paired:>18.2f}  {runs}")
    print(
        f"{'status at ' + str(args.sites) + ' sites':>38} {statistics.median(walls):>8.2f}"
        f" {statistics.median(walls) / base:>17.2f}   Redis commands: {statistics.median(commands):.0f}"
    )


if __name__ == "__main__":
    main()
