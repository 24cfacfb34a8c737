"""Blocks a fleet wastes: fleet-wide sessions and proxies against scrapy-rotating-proxies.

    python -m tests.benchmarks.blocking [--products 2000] [--proxies 8] [--banned 3]
        [--nodes 2] [--runs 3] [--latency-ms 20]

A private Redis and FerretDB, the test shop defending itself (tests/site/defense.py) and
``--proxies`` local forward proxies, each sending from its own loopback address
(tests/site/proxies.py). ``--banned`` of the proxies' addresses are banned from the start
(answered in turn a challenge page, a 403 and a soft-blocked page), and one more is banned
(challenge) once half of the products were served. Two variants, side by side in each run,
with ``--nodes`` real ``scrapy crawl products`` nodes each:

- ``fleet``: ``PROXY_POOL`` (project/blocking): sessions and (proxy, site) bans in Redis,
  one verdict for every node;
- ``rotating``: scrapy-rotating-proxies 0.6 on each node (``RotatingProxyMiddleware`` and
  ``BanDetectionMiddleware``), the per-process baseline. Its ban policy is the fleet's own
  BlockPolicy (:class:`FleetBanPolicy`), so both variants see the same blocks and differ
  only in where the knowledge of a ban lives;
- ``rotating-default``: the same with scrapy-rotating-proxies' own ban policy, as it ships
  (a ban is a status other than 200, 301 and 302, or an empty 200: a challenge or a soft
  block answered 200 is no ban to it, and its proxy stays in use).

Every variant has the fleet's block detection (BLOCK_REQUIRED_CSS: a product page has the
shop's header), so no challenge page becomes an item; a page blocked BLOCK_MAX_TRIES times
is a dead letter. Counted at the shop: requests answered with a block (wasted), all
requests; in MongoDB: products stored. Printed: the median of ``--runs`` of each, and the
fleet's wasted requests as a ratio of each baseline's (goal: at most 0.2, at least 80 %
fewer). With N nodes a per-process baseline pays at least one request per node for each
banned pair, the fleet one: against the baseline with the fleet's policy the ratio cannot
fall much below 1/N.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
import redis

from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.fleet import WAIT_FOR_SEED, Fleet
from tests.site.proxies import ProxyRig
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

VARIANTS = ("fleet", "rotating", "rotating-default")
BASELINES = VARIANTS[1:]
#: What the addresses banned from the start are answered, in turn.
_START_ANSWERS = ("challenge", "403", "soft")


class FleetBanPolicy:
    """scrapy-rotating-proxies' ban policy (``ROTATING_PROXY_BAN_POLICY``) that asks the
    fleet's BlockPolicy: a response is a ban when the fleet would call it a block."""

    def __init__(self, crawler: Crawler) -> None:
        from scrapy.utils.misc import build_from_crawler

        from project.blocking.policy import BlockPolicy

        self.crawler = crawler
        self.policy = build_from_crawler(BlockPolicy, crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetBanPolicy:
        return cls(crawler)

    def response_is_ban(self, request: Request, response: Response) -> bool:
        from project.frontier.sites import site_of

        if request.url.endswith("/robots.txt"):
            return False
        site = site_of(request.url)
        signal = self.policy.blocked(request, response, site, self.crawler.spider)
        if signal is None:
            self.policy.passed(response, site)
        return signal is not None

    def exception_is_ban(self, request: Request, exception: Exception) -> None:
        return None  # a connection error tells nothing of a ban here (the fleet's view too)


def _settings(variant: str, proxies: list[str]) -> dict[str, Any]:
    common: dict[str, Any] = {
        **WAIT_FOR_SEED,
        "BLOCK_REQUIRED_CSS": {"*": "header .home"},
        "FRONTIER_SITE_CONCURRENCY": 8,
        "FRONTIER_RETRY_BACKOFF_BASE": 0.2,
        "LOG_LEVEL": "INFO",
    }
    if variant == "fleet":
        return {**common, "PROXY_POOL": proxies}
    baseline = {
        **common,
        "ROTATING_PROXY_LIST": ",".join(proxies),  # Scrapy's getlist() of a -s value
        "DOWNLOADER_MIDDLEWARES": {
            "rotating_proxies.middlewares.RotatingProxyMiddleware": 610,
            "rotating_proxies.middlewares.BanDetectionMiddleware": 620,
        },
    }
    if variant == "rotating":
        baseline["ROTATING_PROXY_BAN_POLICY"] = "tests.benchmarks.blocking.FleetBanPolicy"
    return baseline


def _served_products(stats: dict[str, Any]) -> int:
    return sum(1 for v in stats["visits"] if v[3] == "ok" and v[4].startswith("/product/"))


def _run(
    variant: str, args: argparse.Namespace, services: ServicesConfig, where: Path, run: int
) -> dict[str, float]:
    database = f"bench_blocking_{variant}_{run}"
    with ProxyRig(args.proxies) as rig:
        bans = [
            f"{source}={_START_ANSWERS[n % len(_START_ANSWERS)]}"
            for n, source in enumerate(rig.sources[: args.banned])
        ]
        later = rig.sources[args.banned]
        with ShopServer(args.products, latency_ms=args.latency_ms, ban=bans) as shop:
            with redis.Redis.from_url(services.redis_url) as client:
                client.flushall()
            run_dir = where / f"{variant}{run}"
            run_dir.mkdir()
            fleet = Fleet(services.redis_url, services.mongo_url, database, run_dir)
            try:
                for _ in range(args.nodes):
                    fleet.start_node(**_settings(variant, rig.urls))
                fleet.wait_ready()
                started = time.monotonic()
                fleet.seed(shop.url("/"))
                banned_later = False
                while any(p.poll() is None for p in fleet.procs):
                    if time.monotonic() - started > args.timeout:
                        raise SystemExit(f"{variant}: still crawling after {args.timeout} s")
                    if not banned_later and _served_products(shop.stats()) >= args.products / 2:
                        shop.ban(later, "challenge")
                        banned_later = True
                    time.sleep(0.25)
                wall = time.monotonic() - started
                codes = [p.returncode for p in fleet.procs]
                if args.keep_logs:
                    for index in range(len(fleet.procs)):
                        kept = Path(args.keep_logs) / f"{variant}{run}-node{index}.log"
                        kept.parent.mkdir(parents=True, exist_ok=True)
                        kept.write_text(fleet.log(index))
                if args.verbose:
                    for index in range(len(fleet.procs)):
                        told = {k: v for k, v in fleet.stats(index).items()
                                if k.startswith(("sessions/", "frontier/retry/", "blocks/"))}  # fmt: skip
                        print(f"  {variant} node{index}: {told}")
                if any(codes) or _served_products(shop.stats()) < args.products:
                    for index in range(len(fleet.procs)):
                        tail = "\n".join(fleet.log(index).splitlines()[-25:])
                        print(f"  {variant} node{index} exit {codes[index]}:\n{tail}")
            finally:
                fleet.stop()
            stats = shop.stats()
    mongo: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(services.mongo_url)
    try:
        stored = mongo[database].products.count_documents({})
        empty = mongo[database].products.count_documents({"sku": {"$in": [None, ""]}})
        mongo.drop_database(database)
    finally:
        mongo.close()
    answers: dict[str, int] = {}
    for counts in stats["clients"].values():
        for answer, n in counts.items():
            answers[answer] = answers.get(answer, 0) + n
    requests = sum(answers.values())
    wasted = requests - answers.get("ok", 0)
    print(
        f"  run {run + 1} {variant:>16}: {wall:6.1f} s, {stored} stored ({empty} empty), "
        f"{requests} requests, {wasted} wasted {dict(sorted(answers.items()))}, exit {codes}",
        flush=True,
    )
    return {"wall": wall, "stored": stored, "requests": requests, "wasted": wasted,
            "served": _served_products(stats)}  # fmt: skip


def main() -> None:
    """Run both variants ``--runs`` times and print the medians."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.blocking", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--products", type=int, default=2000)
    parser.add_argument("--proxies", type=int, default=8)
    parser.add_argument("--banned", type=int, default=3, help="proxies banned from the start")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a crawl may take")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="the variants to run")
    parser.add_argument("--verbose", action="store_true", help="each node's block counters")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy each node's log there")
    args = parser.parse_args()
    if not 0 <= args.banned < args.proxies:
        parser.error("--banned must leave a proxy to ban half-way")
    try:
        import rotating_proxies  # noqa: F401 (the baseline: pip install scrapy-rotating-proxies)
    except ImportError:
        parser.error("the baseline needs scrapy-rotating-proxies (it is in the dev extra)")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="blocking-") as name:
        where = Path(name)
        services = ServicesConfig(state_dir=where / "state", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        start_mongo(services)
        try:
            print(f"{args.products} products, {args.proxies} proxies ({args.banned} banned, one"
                  f" more half-way), {args.nodes} nodes, {args.latency_ms} ms")  # fmt: skip
            for run in range(args.runs):
                order = VARIANTS[run % 3 :] + VARIANTS[: run % 3]
                for variant in (v for v in order if v in args.variants.split(",")):
                    results[variant].append(_run(variant, args, services, where, run))
        finally:
            stop_service(services, "mongo")
            stop_service(services, "redis")
    print(f"median of {args.runs} runs")
    print(f"{'variant':>16} {'wall s':>7} {'stored':>7} {'requests':>9} {'wasted':>7}")
    ran = [v for v in VARIANTS if results[v]]
    medians = {
        v: {k: statistics.median(r[k] for r in results[v]) for k in results[v][0]} for v in ran
    }
    for variant in ran:
        m = medians[variant]
        print(f"{variant:>16} {m['wall']:7.1f} {m['stored']:7.0f} {m['requests']:9.0f}"
              f" {m['wasted']:7.0f}")  # fmt: skip
    fleet = medians.get("fleet")
    for baseline in (b for b in BASELINES if b in medians and fleet is not None):
        assert fleet is not None
        base = medians[baseline]
        ratio = fleet["wasted"] / base["wasted"] if base["wasted"] else float("nan")
        print(f"fleet / {baseline}: wasted requests x{ratio:.2f} (goal <= 0.2),"
              f" wall time x{fleet['wall'] / base['wall']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
