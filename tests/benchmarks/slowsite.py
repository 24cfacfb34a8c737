"""Slow-site benchmark: how close real nodes get to the fleet's concurrency cap on a slow site.

    python -m tests.benchmarks.slowsite [--products 1000] [--latency-ms 600] [--nodes 1,2,3]
        [--caps 16,32,64] [--runs 1] [--settings JSON]

A private Redis and FerretDB, one test shop answering every page after ``--latency-ms``. For each
run, cap and node count (interleaved, so machine noise hits them all alike), N ``scrapy crawl
products`` processes crawl the whole shop with ``FRONTIER_SITE_CONCURRENCY=<cap>``, the one knob
measured; ``--settings '{"NAME": value}'`` adds ``-s`` pairs. The seed is pushed once every node
has registered in Redis, so node start-up is left out of the wall time (it is printed apart).

Columns, medians over ``--runs``:

- wall s: last node exit - seed time; x sequential: pages x latency / wall;
- x ideal: wall / (pages x latency / cap + depth x latency), depth being the crawl's critical
  path in pages (robots.txt, the root, the longest category's listing pages, a product);
- mean conc: requests open at the shop, time-weighted, between the 10th and 90th percentile of
  arrivals (steady, and as a % of the cap), and over the whole crawl (sum of durations / (last
  finish - first arrival));
- last page->exit s: last node exit - last response finished at the shop;
- products stored (MongoDB) and pages fetched twice (one path twice at the shop): correctness.
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
import time
from collections import Counter
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

import pymongo
import redis

from project.frontier.keys import FrontierKeys
from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.site.server import ShopServer

ROOT = Path(__file__).resolve().parents[2]
SPIDER = "products"
DATABASE = "slowsite"
#: Address space of each node: a runaway node fails alone instead of taking the machine down.
MEMORY_CAP = 4 * 1024**3  # bytes: prlimit reads "4G" as 4
STARTUP_TIMEOUT = 120.0
_KEYS = FrontierKeys.for_spider(SPIDER)


@dataclass(frozen=True)
class Crawl:
    """The figures of one crawl."""

    pages: int
    wall: float
    x_sequential: float
    x_ideal: float
    steady: float
    steady_share: float
    whole: float
    tail: float
    stored: int
    twice: int
    #: Seconds from the first node's start to the last node's registration in Redis.
    startup: float
    #: Seconds from the seed to the first request at the shop.
    first_request: float
    #: Nodes killed at ``--timeout``.
    killed: int

    def __str__(self) -> str:
        return (
            f"{self.pages} pages, wall {self.wall:.1f} s, start-up {self.startup:.1f} s,"
            f" seed to first request {self.first_request:.1f} s"
        )


def critical_path(catalogue: dict[str, Any]) -> int:
    """Pages a crawl fetches one after another, however many it may fetch at once."""
    # robots.txt, then the root, then a category's listing pages one by one (each links only the
    # next page), then a product of the last one: the category with the most pages is the longest
    # chain. Related and see-also links lead to pages the root or page 1 already reach.
    return 3 + max(int(category["pages"]) for category in catalogue["categories"])


def mean_open(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Time-weighted mean number of *spans* open between *start* and *end*."""
    if end <= start:
        return 0.0
    overlap = sum(max(0.0, min(finish, end) - max(arrival, start)) for arrival, finish in spans)
    return overlap / (end - start)


def _tail(tmp: Path, index: int) -> str:
    """The end of node *index*'s output and log, to tell why it failed."""
    paths = (tmp / f"node{index}.out", tmp / f"node{index}.log")
    return "".join(p.read_text(errors="replace")[-1500:] for p in paths if p.exists())


@dataclass(frozen=True)
class Bench:
    """What every crawl of one benchmark run shares."""

    shop: ShopServer
    services: ServicesConfig
    #: Extra ``-s`` settings of every node (``--settings``).
    settings: dict[str, Any]
    #: The shop's latency, seconds.
    latency: float
    depth: int
    timeout: float

    def crawl(self, nodes: int, cap: int) -> Crawl:
        """Crawl the whole shop with *nodes* fresh nodes; the figures of that crawl."""
        client = redis.Redis.from_url(self.services.redis_url)
        mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            self.services.mongo_url, serverSelectionTimeoutMS=10_000
        )
        client.flushall()
        self.shop.reset()
        mongo.drop_database(DATABASE)
        with tempfile.TemporaryDirectory(prefix="slowsite-") as name:
            tmp = Path(name)
            started = time.time()
            seeded, exits, killed = self.run_nodes(nodes, cap, tmp, client)
            startup = seeded - started
        stored = mongo[DATABASE]["products"].count_documents({})
        mongo.close()
        client.close()
        figures = self._figures(self.shop.timeline(), cap, seeded, max(exits))
        return Crawl(**figures, stored=stored, startup=startup, killed=killed)

    def run_nodes(
        self, nodes: int, cap: int, tmp: Path, client: redis.Redis
    ) -> tuple[float, list[float], int]:
        """Start *nodes* nodes, seed once they registered, wait for their exits (killing any
        left): seed time, exit times, nodes killed after the timeout."""
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs = [self._node(index, cap, tmp) for index in range(nodes)]
            _wait_registered(client, procs, tmp)
            seeded = time.time()
            client.lpush(_KEYS.start_urls, self.shop.url("/"))
            exits, killed = _wait_exits(procs, tmp, self.timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return seeded, exits, killed

    def _node(self, index: int, cap: int, tmp: Path) -> subprocess.Popen[bytes]:
        settings = {
            "FRONTIER_SITE_CONCURRENCY": cap,
            "LOG_FILE": str(tmp / f"node{index}.log"),
            "LOG_LEVEL": "INFO",
            # A journal left by another crawl would be replayed into this one's database.
            "MONGO_JOURNAL_DIR": str(tmp / "journal"),
            **self.settings,
        }
        argv = ["prlimit", f"--as={MEMORY_CAP}", "--", sys.executable, "-m", "scrapy", "crawl"]
        argv.append(SPIDER)
        for key, value in settings.items():
            text = json.dumps(value) if isinstance(value, dict | list) else str(value)
            argv += ["-s", f"{key}={text}"]
        env = dict(
            os.environ,
            REDIS_URL=self.services.redis_url,
            MONGO_URI=self.services.mongo_url,
            MONGO_DATABASE=DATABASE,
            PYTHONPATH=str(ROOT),
        )
        with (tmp / f"node{index}.out").open("wb") as out:
            # What comes before Scrapy's logging is set up (a traceback, prlimit's errors).
            return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)

    def _figures(
        self, timeline: list[list[Any]], cap: int, seeded: float, last_exit: float
    ) -> dict[str, Any]:
        # A request still open when the last node went (none, normally) is open until then.
        spans = [(a, last_exit if finish is None else finish) for a, finish, *_ in timeline]
        pages, wall, latency = len(spans), last_exit - seeded, self.latency
        arrivals = sorted(arrival for arrival, _ in spans)
        cuts = statistics.quantiles(arrivals, n=10, method="inclusive") if pages > 1 else [0, 0]
        steady = mean_open(spans, cuts[0], cuts[-1])
        first, last = min(arrivals, default=0.0), max((f for _, f in spans), default=0.0)
        paths = Counter(path for _, _, path, _ in timeline)
        return {
            "pages": pages,
            "wall": wall,
            "x_sequential": pages * latency / wall,
            "x_ideal": wall / (pages * latency / cap + self.depth * latency),
            "steady": steady,
            "steady_share": 100 * steady / cap,
            "whole": sum(f - a for a, f in spans) / (last - first) if last > first else 0.0,
            "tail": last_exit - last,
            "twice": sum(1 for count in paths.values() if count > 1),
            "first_request": first - seeded,
        }


def _wait_registered(client: redis.Redis, procs: list[subprocess.Popen[bytes]], tmp: Path) -> None:
    """Until every node's monitor has written its first heartbeat (its spider is open)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while int(client.hlen(_KEYS.nodes)) < len(procs):
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                tail = _tail(tmp, index)
                raise RuntimeError(f"node{index} exited {proc.returncode} at start:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nodes not registered after {STARTUP_TIMEOUT:.0f}s")
        time.sleep(0.02)


def _wait_exits(
    procs: list[subprocess.Popen[bytes]], tmp: Path, timeout: float
) -> tuple[list[float], int]:
    """Wall-clock exit time of each node, and how many were killed after *timeout* seconds."""
    exits: dict[int, float] = {}
    killed = 0
    deadline = time.monotonic() + timeout
    while len(exits) < len(procs):
        for index, proc in enumerate(procs):
            if index in exits:
                continue
            if proc.poll() is None and time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                killed += 1
                print(f"node{index} killed after {timeout:g}s", file=sys.stderr)
            if proc.poll() is not None:
                exits[index] = time.time()
                if proc.returncode:
                    message = f"node{index} exited {proc.returncode}:\n{_tail(tmp, index)}"
                    print(message, file=sys.stderr)
        time.sleep(0.02)
    return [exits[index] for index in range(len(procs))], killed


def _median(crawls: list[Crawl]) -> Crawl:
    columns = zip(*(astuple(c) for c in crawls), strict=True)
    values = [statistics.median(column) for column in columns]
    return Crawl(**{f.name: v for f, v in zip(fields(Crawl), values, strict=True)})


def _print_table(
    args: argparse.Namespace, depth: int, results: dict[tuple[int, int], list[Crawl]]
) -> None:
    print(
        f"slow site: {args.products} products, {args.latency_ms:g} ms latency, "
        f"medians of {args.runs} run(s); critical path {depth} pages"
    )
    pages = statistics.median(c.pages for runs in results.values() for c in runs)
    print(f"sequential (pages x latency): {pages * args.latency_ms / 1000:.1f} s")
    print(
        f"{'nodes':>5} {'cap':>4} {'pages':>6} {'wall s':>7} {'x sequential':>12} {'x ideal':>7} "
        f"{'mean conc (steady)':>18} {'% of cap':>8} {'mean conc (whole)':>17} "
        f"{'last page->exit s':>17} {'products stored':>15} {'fetched twice':>13}"
    )
    for (nodes, cap), runs in sorted(results.items()):
        m = _median(runs)
        print(
            f"{nodes:>5} {cap:>4} {m.pages:>6.0f} {m.wall:>7.1f} {m.x_sequential:>12.1f} "
            f"{m.x_ideal:>7.2f} {m.steady:>18.1f} {m.steady_share:>8.0f} {m.whole:>17.1f} "
            f"{m.tail:>17.1f} {m.stored:>15.0f} {m.twice:>13.0f}"
        )
    startup = statistics.median(c.startup for runs in results.values() for c in runs)
    first = statistics.median(c.first_request for runs in results.values() for c in runs)
    print(
        f"medians: node start-up (start to registered in Redis) {startup:.1f} s, "
        f"seed to first request {first:.1f} s"
    )
    killed = sum(c.killed for runs in results.values() for c in runs)
    if killed:
        print(f"{killed} node(s) killed after {args.timeout:g} s: their figures are wrong")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.slowsite", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--products", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=600.0)
    parser.add_argument("--nodes", type=_ints, default=[1, 2, 3], help="node counts: 1,2,3")
    parser.add_argument(
        "--caps", type=_ints, default=[16, 32, 64], help="FRONTIER_SITE_CONCURRENCY"
    )
    parser.add_argument("--runs", type=int, default=1, help="repetitions; medians are printed")
    parser.add_argument("--settings", type=json.loads, default={}, help="extra -s pairs, JSON")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per crawl")
    args = parser.parse_args()
    if not isinstance(args.settings, dict) or "FRONTIER_SITE_CONCURRENCY" in args.settings:
        parser.error("--settings is a JSON object and leaves FRONTIER_SITE_CONCURRENCY to --caps")
    # The services run in their own session: a SIGTERM (timeout, kill) must still stop them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    results: dict[tuple[int, int], list[Crawl]] = {}
    with tempfile.TemporaryDirectory(prefix="slowsite-state-") as state:
        services = ServicesConfig(
            state_dir=Path(state), redis_port=free_port(), mongo_port=free_port()
        )
        start_redis(services)
        try:
            start_mongo(services)
            with ShopServer(args.products, latency_ms=args.latency_ms) as shop:
                depth = critical_path(shop.catalogue())
                bench = Bench(
                    shop, services, args.settings, args.latency_ms / 1000, depth, args.timeout
                )
                for _ in range(args.runs):
                    for cap in args.caps:
                        for nodes in args.nodes:
                            done = bench.crawl(nodes, cap)
                            results.setdefault((nodes, cap), []).append(done)
                            print(f"{nodes} node(s), cap {cap}: {done}", file=sys.stderr)
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    _print_table(args, depth, results)


if __name__ == "__main__":
    main()
