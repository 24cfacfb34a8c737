"""Soak benchmark: the frontier at ten million queued requests.

    python -m tests.benchmarks.soak [--total 1e7] [--sites 1e4] [--batch-sites 50]
        [--lease-per-step 50] [--zset-listpack N] [--runs 5] [--phase-timeout 3600]

A private Redis (AOF on, as ``fleetcrawl services`` runs it, capped with ``prlimit --as`` and
``maxmemory``) and FerretDB (``fleetcrawl status`` counts documents). Requests for ``--sites``
hosts (``site0000.example``..., never contacted) go through the real enqueue path: entries built
as a node builds them (``crawler.request_fingerprinter``, ``site_of``, the priority, the
``encode_request`` payload with its ``id``, scope ``=`` as FRONTIER_FOLLOW = "seeds" sends),
``StepBatch(enqueue=...)`` of FRONTIER_BATCH_MAX (500) requests over ``--batch-sites`` sites,
each URL 48-64 characters (56 on average), priorities 10 (listing pages, 15 %), 0 (products,
80 %) and -10 (5 %). Payloads are built by ``--producers`` processes, outside the timed steps.

Meanwhile a second process steps as a node does, every FRONTIER_TICK_SECONDS (0.1 s): it leases
``--lease-per-step`` requests with a download permit each, acknowledges the previous step's
leases and gives their permits back in the next step, and runs maintenance once a second.

The queue grows to 10^5, 10^6 and 10^7 queued (and ``--total``); at each size both processes
pause and the benchmark prints, besides the growth's step latencies and enqueue rate:

- memory: ``MEMORY USAGE`` (exact, ``SAMPLES 0``) summed over every key of the site queues
  (each site's priority lists and index, the counts per site), over the requests queued;
  ``used_memory`` of ``INFO memory`` over the empty frontier's, over the requests queued
  (that includes the seen-set, the indexes and the site hashes); stock
  scrapy-redis (``PriorityQueue`` with pickle and ``RFPDupeFilter``) measured the same two ways on
  ``--stock-sample`` of the same requests, in the same Redis, before the soak;
- ``fleetcrawl status`` (the CLI, median of ``--runs``), one ``StatusReader.read()`` in this
  process, and the dashboard's endpoints (``fleetcrawl dashboard`` on 127.0.0.1), each with the
  Redis commands it issued (``INFO commandstats``, commands run by scripts included) and, for the
  read, its round trips; ratios against the empty frontier measured first.

Step latencies are of the steps of each growth segment (the previous size to this one); ratios
against the first segment. URLFrontier's published enqueue rate (49,000-63,000 URLs/s, in
batches, on its authors' hardware) is the only figure not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import pickle
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from scrapy import Request
from scrapy.utils.project import get_project_settings
from scrapy.utils.test import get_crawler

from project.frontier.config import SiteLimits
from project.frontier.keys import FrontierKeys
from project.frontier.queue import LeasedQueue, StepBatch
from project.frontier.site_queues import read_site_queues, site_queue_bytes, site_queue_keys
from project.frontier.sites import site_of
from project.frontier.wire import encode_request
from project.monitoring.status import StatusReader
from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from project.storage.config import MongoConfig
from spiders.products import ProductsSpider

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.synchronize import Event

ROOT = Path(__file__).resolve().parents[2]
SPIDER = "soak"
BATCH = 500  # FRONTIER_BATCH_MAX
TICK = 0.1  # FRONTIER_TICK_SECONDS
MAINTENANCE = 1.0  # FRONTIER_MAINTENANCE_SECONDS
LEASE_MS = 60_000  # FRONTIER_LEASE_SECONDS
#: URLFrontier's published enqueue rate, URLs/s in batches (not measured here).
URLFRONTIER = (49_000, 63_000)
#: Bytes per queued request in docs/architecture.md today, and the target.
DOCUMENTED, TARGET = 79, 120
_GIB = 1024**3
_SECTIONS = ("products", "category", "item", "shop/catalog", "deals")
_WORDS = ("blue-widget", "garden-chair", "desk-lamp", "usb-cable", "rain-jacket", "oak-table")
_STATUS_PATHS = ("/api/status", "/metrics")  # read through the dashboard's 1 s cache
_DASHBOARD_PATHS = ("/", *_STATUS_PATHS, "/api/history", "/api/dead-letters")


def site_name(index: int, sites: int) -> str:
    """The host of site *index*: ``site0042.example``."""
    return f"site{index:0{max(4, len(str(sites - 1)))}d}.example"


def _request(spider: ProductsSpider, n: int, site: str) -> Request:
    """Request number *n* of the soak: a listing, product or low-priority page of *site*."""
    url = f"https://{site}/{_SECTIONS[n % 5]}/{_WORDS[n // 5 % 6]}-{n}.html"
    # Knuth's multiplicative hash: kinds spread over every site, not by position in a batch
    kind = (((n * 2654435761) & 0xFFFFFFFF) >> 16) % 20
    if kind < 3:
        return Request(url, callback=spider.parse_listing, priority=10)
    if kind == 3:
        return Request(url, callback=spider.parse, priority=-10)
    return Request(url, callback=spider.parse_product, priority=0)


def _produce(out: Any, index: int, producers: int, sites: int, batch_sites: int) -> None:
    """Process: batch ``index``, ``index + producers``, ... of step entries, for ever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    crawler = get_crawler(ProductsSpider)
    spider = ProductsSpider.from_crawler(crawler)
    fingerprint = crawler.request_fingerprinter.fingerprint
    number = index
    while True:
        entries = []
        first = number * batch_sites
        for j in range(BATCH):
            request = _request(
                spider, number * BATCH + j, site_name((first + j % batch_sites) % sites, sites)
            )
            payload = encode_request(request, spider, id=os.urandom(6).hex())
            entries.append((b"f" + fingerprint(request), site_of(request.url), request.priority, payload, "="))  # fmt: skip
        out.put((entries, sum(len(entry[3]) for entry in entries)))
        number += producers


@dataclass
class _LeaseControl:
    """What the parent and the leasing process share."""

    run: Event
    paused: Event
    stop: Event
    leased: Any  # multiprocessing.Value("q"): requests leased so far
    conn: Connection


def _lease_node(url: str, keys: FrontierKeys, per_step: int, control: _LeaseControl) -> None:
    """Process: step as a node does; send (start, seconds, leased) of each step at each pause."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def steps() -> None:
        client = redis.asyncio.from_url(url)
        queue = LeasedQueue(client, None, keys, "soak-leaser", LEASE_MS, SiteLimits())  # type: ignore[arg-type]
        acks: list[bytes] = []
        back: list[tuple[str, int]] = []
        samples: list[tuple[float, float, int]] = []
        last_maintenance = 0.0
        while not control.stop.is_set():
            if not control.run.is_set():
                control.conn.send(samples)
                samples = []
                control.paused.set()
                while not control.run.is_set() and not control.stop.is_set():
                    await asyncio.sleep(0.01)
                continue
            began = time.monotonic()
            maintain = began - last_maintenance >= MAINTENANCE
            batch = StepBatch(
                acks=acks, give_back=back, want=per_step, slots=per_step, maintain=maintain
            )
            result = await queue.step(batch)
            took = time.monotonic() - began
            if maintain:
                last_maintenance = began
            samples.append((began, took, len(result.leased)))
            acks = [queue.request_member(entry.site, entry.payload) for entry in result.leased]
            back = result.permits
            with control.leased.get_lock():
                control.leased.value += len(result.leased)
            await asyncio.sleep(max(0.0, TICK - (time.monotonic() - began)))
        await client.aclose()

    asyncio.run(steps())


class _CountingConnection(redis.Connection):
    """Counts what it sends: one send is one round trip (tests/test_status_sites.py)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _CountingConnection.sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def _commands(client: redis.Redis) -> int:
    """Commands Redis ran so far, those scripts ran included, INFO left out."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _stock_bytes(client: redis.Redis, n: int, sites: int, batch_sites: int) -> dict[str, float]:
    """Bytes per request of stock scrapy-redis (pickle) on *n* of the soak's requests."""
    from scrapy_redis.dupefilter import RFPDupeFilter
    from scrapy_redis.queue import PriorityQueue

    crawler = get_crawler(ProductsSpider)
    spider = ProductsSpider.from_crawler(crawler)
    queue = PriorityQueue(client, spider, "stock:requests", pickle)
    seen = RFPDupeFilter(client, "stock:dupefilter")
    before = _used(client)
    sizes = 0
    for number in range(n):
        first = number // BATCH * batch_sites
        site = site_name((first + number % BATCH % batch_sites) % sites, sites)
        request = _request(spider, number, site)
        seen.request_seen(request)
        queue.push(request)
        sizes += len(queue._encode_request(request))  # the pickle it pushed
    used = (_used(client) - before) / n
    queued = int(client.memory_usage("stock:requests", samples=0) or 0) / n
    client.delete("stock:requests", "stock:dupefilter")
    return {"queued": queued, "used": used, "payload": sizes / n}


@dataclass
class Segment:
    """Steps of one growth segment, from the previous size to *size*."""

    size: int
    pushed: int = 0
    enqueue: list[float] = field(default_factory=list)
    lease: list[float] = field(default_factory=list)
    leased: int = 0
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def rate_in_steps(self) -> float:
        return self.pushed / sum(self.enqueue) if self.enqueue else 0.0

    @property
    def rate_wall(self) -> float:
        return self.pushed / self.seconds if self.seconds else 0.0


@dataclass
class Checkpoint:
    """Memory and status costs at one size of the queue."""

    queued: int
    pushed: int
    memory: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)


def _memory(client: redis.Redis, keys: FrontierKeys, sites: list[str], base: int) -> dict[str, Any]:
    """Bytes of the site queues (every one, exact) and of the whole frontier, per request."""
    info = client.info("memory")
    stats = client.memory_stats()
    forks = client.info("stats")
    queued = int(client.get(keys.queued) or 0)
    queue_bytes, entries = site_queue_bytes(client, keys, sites)
    # the encodings of a sample of the site queues' keys (index, lists), by kind
    sample = random.Random(0).sample(sites, min(200, len(sites)))
    pipe = client.pipeline(transaction=False)
    for queue in read_site_queues(client, keys, sample):
        for key in site_queue_keys(keys, queue.site, [m for m, _ in queue.heads]):
            pipe.type(key)
            pipe.object("encoding", key)
    replies = [r.decode() if isinstance(r, bytes) else str(r) for r in pipe.execute()]
    encodings = Counter(
        f"{kind} {encoding}" for kind, encoding in zip(replies[0::2], replies[1::2], strict=True)
    )
    seen_bytes = int(client.memory_usage(keys.dupefilter, samples=0) or 0)
    seen = int(client.scard(keys.dupefilter))
    others = 0
    for key in keys.frontier():
        if key not in (keys.dupefilter,):
            others += int(client.memory_usage(key, samples=0) or 0)
    per = max(1, queued)
    return {
        "queued": queued,
        "entries": entries,
        "queues_per_request": queue_bytes / max(1, entries),
        "used_per_request": (int(info["used_memory"]) - base) / per,
        "rss": int(info["used_memory_rss"]),
        "used": int(info["used_memory"]),
        "seen_per_url": seen_bytes / max(1, seen),
        "seen_per_request": seen_bytes / per,
        "others_per_request": others / per,
        # used_memory outside the keys: clients' buffers, the AOF buffer, the keyspace
        "overhead": int(stats.get("overhead.total", 0)),
        "clients": int(stats.get("clients.normal", 0)),
        "aof_buffer": int(stats.get("aof.buffer", 0)),
        "encodings": dict(encodings),
        "forks": int(forks["total_forks"]),
        "last_fork_ms": int(forks["latest_fork_usec"]) / 1000,
    }


class _Dashboard:
    """``fleetcrawl dashboard`` started as the CLI does, on 127.0.0.1 and a free port."""

    def __init__(self, argv_settings: list[str], log: Path) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "project.ops.cli", "dashboard", "--spider", SPIDER]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), *argv_settings]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=out, stderr=out)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/")
                break
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text()[-2000:]
                    raise RuntimeError(f"dashboard did not start:\n{tail}") from exc
                time.sleep(0.2)
        self.last_read = 0.0

    def get(self, path: str) -> float:
        """Seconds to fetch *path* whole."""
        began = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=300) as reply:
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{path}: HTTP {reply.status}")
        return time.perf_counter() - began

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _status_costs(
    client: redis.Redis,
    services: ServicesConfig,
    keys: FrontierKeys,
    dashboard: _Dashboard,
    argv_settings: list[str],
    runs: int,
) -> dict[str, Any]:
    """Medians of *runs*: the CLI, one in-process read, each dashboard endpoint; commands."""
    settings = get_project_settings()
    settings.set("MONGO_URI", services.mongo_url, priority="cmdline")
    reader = StatusReader(
        services.redis_url, keys, MongoConfig.from_settings(settings, spider_name=SPIDER)
    )
    # the reader's own client, as it builds it, with connections that count round trips
    reader.redis.close()
    reader.redis = redis.Redis.from_url(
        services.redis_url,
        socket_connect_timeout=5,
        socket_timeout=10,
        connection_class=_CountingConnection,
    )
    reads, read_cmds, trips = [], [], []
    sites = 0
    try:
        reader.redis.ping()
        for _ in range(runs):
            _CountingConnection.sent = 0
            before = _commands(client)
            began = time.perf_counter()
            snapshot = reader.read()
            reads.append(time.perf_counter() - began)
            trips.append(_CountingConnection.sent)
            read_cmds.append(_commands(client) - before)
            sites = snapshot["site_count"]["with_work"]
    finally:
        reader.close()
    cli, cli_cmds = [], []
    argv = [sys.executable, "-m", "project.ops.cli", "status", "--spider", SPIDER, *argv_settings]
    for _ in range(runs):
        before = _commands(client)
        began = time.perf_counter()
        done = subprocess.run(
            argv, check=False, cwd=ROOT, env=_env(), capture_output=True, timeout=600
        )
        cli.append(time.perf_counter() - began)
        cli_cmds.append(_commands(client) - before)
        if done.returncode:
            raise RuntimeError(
                f"fleetcrawl status exited {done.returncode}: {done.stderr[-2000:]!r}"
            )
    endpoints: dict[str, tuple[float, float]] = {}
    for path in _DASHBOARD_PATHS:
        times, cmds = [], []
        for _ in range(runs):
            if path in _STATUS_PATHS:
                # past the dashboard's 1 s cache: every request reads Redis
                time.sleep(max(0.0, dashboard.last_read + 1.1 - time.monotonic()))
            before = _commands(client)
            times.append(dashboard.get(path))
            cmds.append(_commands(client) - before)
            if path in _STATUS_PATHS:
                dashboard.last_read = time.monotonic()
        endpoints[path] = (statistics.median(times), statistics.median(cmds))
    return {
        "sites": sites,
        "read": statistics.median(reads),
        "read_cmds": statistics.median(read_cmds),
        "read_trips": statistics.median(trips),
        "cli": statistics.median(cli),
        "cli_cmds": statistics.median(cli_cmds),
        "endpoints": endpoints,
    }


@dataclass
class Soak:
    """One soak run: its services, processes and figures."""

    args: argparse.Namespace
    services: ServicesConfig
    tmp: Path
    keys: FrontierKeys = field(init=False)
    client: redis.Redis = field(init=False)
    sites: list[str] = field(init=False)
    argv_settings: list[str] = field(init=False)
    segments: list[Segment] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    stock: dict[str, float] = field(default_factory=dict)
    payload_bytes: int = 0
    pushed: int = 0
    redis_version: str = ""
    #: The Redis server's peak address space (VmPeak), bytes.
    redis_peak: int = 0

    def __post_init__(self) -> None:
        self.keys = FrontierKeys.for_project_spider(get_project_settings(), SPIDER)
        self.client = redis.Redis.from_url(self.services.redis_url, socket_timeout=900)
        self.sites = [site_name(i, self.args.sites) for i in range(self.args.sites)]
        self.argv_settings = ["-s", f"REDIS_URL={self.services.redis_url}"]
        self.argv_settings += ["-s", f"MONGO_URI={self.services.mongo_url}"]

    def run(self) -> None:
        args, client = self.args, self.client
        self.redis_version = str(client.info("server")["redis_version"])
        self.stock = _stock_bytes(client, args.stock_sample, args.sites, args.batch_sites)
        if args.zset_listpack:
            client.config_set("zset-max-listpack-entries", args.zset_listpack)
            client.config_set("zset-max-listpack-value", 512)
        base = _used(client)
        # the sites the seeds would have allowed (FRONTIER_FOLLOW = "seeds")
        for start in range(0, len(self.sites), 1000):
            client.sadd(self.keys.allowed, *self.sites[start : start + 1000])
        ctx = multiprocessing.get_context("spawn")
        batches = ctx.Queue(maxsize=8 * args.producers)
        producers = [
            ctx.Process(
                target=_produce,
                args=(batches, i, args.producers, args.sites, args.batch_sites),
                daemon=True,
            )
            for i in range(args.producers)
        ]
        mine, theirs = ctx.Pipe()
        control = _LeaseControl(ctx.Event(), ctx.Event(), ctx.Event(), ctx.Value("q", 0), theirs)
        leaser = ctx.Process(
            target=_lease_node,
            args=(self.services.redis_url, self.keys, args.lease_per_step, control),
            daemon=True,
        )
        dashboard = None
        try:
            for proc in [*producers, leaser]:
                proc.start()
            dashboard = _Dashboard(self.argv_settings, self.tmp / "dashboard.log")
            self._pause(control, mine)  # its first report, before any step
            empty = Checkpoint(0, 0, status=self._status(dashboard))
            self.checkpoints.append(empty)
            print(f"empty frontier: status read {empty.status['read']:.3f} s", file=sys.stderr)
            asyncio.run(self._grow(batches, control, mine, dashboard, base))
        finally:
            control.stop.set()
            control.run.set()
            if dashboard is not None:
                dashboard.stop()
            leaser.join(10)
            for proc in [*producers, leaser]:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(10)
            batches.cancel_join_thread()

    def _status(self, dashboard: _Dashboard) -> dict[str, Any]:
        return _status_costs(
            self.client, self.services, self.keys, dashboard, self.argv_settings, self.args.runs
        )

    @staticmethod
    def _pause(control: _LeaseControl, conn: Connection) -> list[tuple[float, float, int]]:
        control.run.clear()
        # its samples first: a report bigger than the pipe's buffer waits to be read
        if not conn.poll(120):
            raise RuntimeError("the leasing process did not pause")
        samples: list[tuple[float, float, int]] = conn.recv()
        control.paused.wait(10)
        return samples

    async def _grow(
        self,
        batches: Any,
        control: _LeaseControl,
        conn: Connection,
        dashboard: _Dashboard,
        base: int,
    ) -> None:
        args = self.args
        aclient = redis.asyncio.from_url(self.services.redis_url)
        queue = LeasedQueue(aclient, None, self.keys, "soak-enqueuer", LEASE_MS, SiteLimits())  # type: ignore[arg-type]
        try:
            for size in _sizes(args.total):
                segment = Segment(size)
                control.paused.clear()
                control.run.set()
                began = time.monotonic()
                deadline = began + args.phase_timeout
                while self.pushed - control.leased.value < size:
                    if time.monotonic() > deadline:
                        segment.timed_out = True
                        break
                    entries, payload_bytes = batches.get(timeout=600)
                    started = time.perf_counter()
                    result = await queue.step(StepBatch(enqueue=entries))
                    segment.enqueue.append(time.perf_counter() - started)
                    segment.pushed += result.added
                    self.pushed += result.added
                    self.payload_bytes += payload_bytes
                    if self.pushed % 1_000_000 < BATCH:
                        rate = segment.pushed / (time.monotonic() - began)
                        print(f"{self.pushed:,} pushed, {rate:,.0f}/s", file=sys.stderr)
                segment.seconds = time.monotonic() - began
                samples = self._pause(control, conn)
                segment.lease = [took for _, took, _ in samples]
                segment.leased = sum(n for *_, n in samples)
                self.segments.append(segment)
                memory = _memory(self.client, self.keys, self.sites, base)
                print(
                    f"{memory['queued']:,} queued: memory read; MEMORY STATS overhead.total"
                    f" {memory['overhead'] / 2**20:.1f} MiB (clients.normal"
                    f" {memory['clients'] / 2**20:.1f}, aof.buffer {memory['aof_buffer'] / 2**20:.1f})",
                    file=sys.stderr,
                )
                status = self._status(dashboard)
                self.checkpoints.append(Checkpoint(memory["queued"], self.pushed, memory, status))
                print(f"{memory['queued']:,} queued: status read", file=sys.stderr)
                if segment.timed_out:
                    print(f"growth to {size:,} timed out after {args.phase_timeout:g} s")
                    break
        finally:
            await aclient.aclose()

    def report(self) -> None:
        """Print every table."""
        args = self.args
        payload = self.payload_bytes / max(1, self.pushed)
        encoding = f"zset-max-listpack-entries {args.zset_listpack or '128 (default)'}"
        print(
            f"soak: {self.pushed:,} requests pushed over {args.sites:,} sites"
            f" ({self.sites[0]}, ...), batches of {BATCH} over {args.batch_sites} sites,"
            f" priorities 10/0/-10 (15/80/5 %), mean payload {payload:.1f} B;"
            f" leasing node: {args.lease_per_step} per step every {TICK:g} s; {encoding};"
            f" Redis {self.redis_version}, AOF everysec, peak address space"
            f" {self.redis_peak / _GIB:.2f} GiB of its {args.redis_memory:g} GiB cap"
        )
        first = self.segments[0] if self.segments else None
        print()
        print("enqueue steps (StepBatch(enqueue=500)), growth from the previous size")
        print(
            f"{'queued':>10} {'pushed':>10} {'steps':>6} {'URLs/s':>8} {'x first':>7}"
            f" {'x URLFrontier':>13} {'wall URLs/s':>11} {'p50 ms':>7} {'p99 ms':>7}"
            f" {'max ms':>7} {'x first p50':>11} {'x first p99':>11} {'forks':>5}"
            f" {'last fork ms':>12}"
        )
        forks = 0
        for cp, seg in zip(self.checkpoints[1:], self.segments, strict=False):
            rate = seg.rate_in_steps
            low, high = rate / URLFRONTIER[1], rate / URLFRONTIER[0]
            p50, p99 = _percentile(seg.enqueue, 0.5), _percentile(seg.enqueue, 0.99)
            assert first is not None
            print(
                f"{cp.queued:>10,} {seg.pushed:>10,} {len(seg.enqueue):>6} {rate:>8,.0f}"
                f" {rate / first.rate_in_steps:>7.2f} {f'{low:.2f}-{high:.2f}':>13}"
                f" {seg.rate_wall:>11,.0f} {1000 * p50:>7.1f} {1000 * p99:>7.1f}"
                f" {1000 * max(seg.enqueue):>7.1f} {p50 / _percentile(first.enqueue, 0.5):>11.2f}"
                f" {p99 / _percentile(first.enqueue, 0.99):>11.2f}"
                f" {cp.memory['forks'] - forks:>5} {cp.memory['last_fork_ms']:>12.1f}"
                + ("  (timed out)" if seg.timed_out else "")
            )
            forks = cp.memory["forks"]
        print()
        print("leasing node steps (lease, ack the previous step's, maintenance every 1 s)")
        print(
            f"{'queued':>10} {'steps':>6} {'leases/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
            f" {'max ms':>7} {'x first p50':>11} {'x first p99':>11}"
        )
        for cp, seg in zip(self.checkpoints[1:], self.segments, strict=False):
            assert first is not None
            p50, p99 = _percentile(seg.lease, 0.5), _percentile(seg.lease, 0.99)
            print(
                f"{cp.queued:>10,} {len(seg.lease):>6} {seg.leased / seg.seconds:>8.0f}"
                f" {1000 * p50:>7.2f} {1000 * p99:>7.2f} {1000 * max(seg.lease or [0]):>7.1f}"
                f" {p50 / _percentile(first.lease, 0.5):>11.2f}"
                f" {p99 / _percentile(first.lease, 0.99):>11.2f}"
            )
        self._report_memory(payload)
        self._report_status()

    def _report_memory(self, payload: float) -> None:
        stock = self.stock
        print()
        print(
            f"memory per queued request, bytes (stock scrapy-redis on {self.args.stock_sample:,}"
            f" of the same requests: queue {stock['queued']:.1f}, used_memory"
            f" {stock['used']:.1f}, pickle payload {stock['payload']:.1f};"
            f" docs today {DOCUMENTED}, target {TARGET})"
        )
        print(
            f"{'queued':>10} {'site queues':>11} {'x stock':>7} {'x target':>8}"
            f" {'payload':>7} {'overhead':>13} {'used_memory':>11} {'x stock':>7}"
            f" {'of it seen':>10} {'indexes':>7} {'elsewhere':>9} {'seen B/URL':>10}"
            f" {'RSS MiB':>7} encodings"
        )
        for cp in self.checkpoints[1:]:
            m = cp.memory
            queues = m["queues_per_request"]
            print(
                f"{cp.queued:>10,} {queues:>11.1f} {queues / stock['queued']:>7.2f}"
                f" {queues / TARGET:>8.2f} {payload:>7.1f} {queues - payload:>13.1f}"
                f" {m['used_per_request']:>11.1f} {m['used_per_request'] / stock['used']:>7.2f}"
                f" {m['seen_per_request']:>10.1f} {m['others_per_request']:>7.1f}"
                f" {m['used_per_request'] - queues - m['seen_per_request'] - m['others_per_request']:>9.1f}"
                f" {m['seen_per_url']:>10.1f} {m['rss'] / 2**20:>7.0f} "
                + ",".join(f"{k} {v}" for k, v in sorted(m["encodings"].items()))
            )

    def _report_status(self) -> None:
        empty = self.checkpoints[0].status
        print()
        print(
            f"fleetcrawl status and the dashboard, medians of {self.args.runs}; cmds: Redis"
            " commands (scripts' included), trips: round trips; x empty: against the empty"
            " frontier (first row)"
        )
        print(
            f"{'queued':>10} {'sites':>6} {'CLI s':>6} {'x empty':>7} {'cmds/CLI':>8}"
            f" {'read s':>7} {'x empty':>7} {'cmds/read':>9} {'trips/read':>10}"
        )
        for cp in self.checkpoints:
            s = cp.status
            print(
                f"{cp.queued:>10,} {s['sites']:>6,} {s['cli']:>6.2f} {s['cli'] / empty['cli']:>7.2f}"
                f" {s['cli_cmds']:>8.0f} {s['read']:>7.3f} {s['read'] / empty['read']:>7.2f}"
                f" {s['read_cmds']:>9.0f} {s['read_trips']:>10.0f}"
            )
        print()
        header = f"{'queued':>10}"
        for path in _DASHBOARD_PATHS:
            header += f" {path + ' s':>20} {'x empty':>7} {'cmds':>6}"
        print(header)
        for cp in self.checkpoints:
            line = f"{cp.queued:>10,}"
            for path in _DASHBOARD_PATHS:
                seconds, cmds = cp.status["endpoints"][path]
                line += (
                    f" {seconds:>20.3f} {seconds / empty['endpoints'][path][0]:>7.2f} {cmds:>6.0f}"
                )
            print(line)


def _sizes(total: int) -> list[int]:
    """10^5, 10^6, 10^7 up to *total*, and *total*."""
    sizes = [10**k for k in range(5, 12) if 10**k < total]
    return [*sizes, total]


def _cap_process(pid: int, limit: int) -> None:
    """Address space of a running process, as ``prlimit --as`` sets it."""
    subprocess.run(["prlimit", f"--pid={pid}", f"--as={limit}"], check=True)


def _count(text: str) -> int:
    return int(float(text))


def main() -> None:
    """Run the soak and print its tables."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--total", type=_count, default=10**7, help="queued at the end (pushed: +leased)"
    )
    parser.add_argument("--sites", type=_count, default=10**4)
    parser.add_argument("--batch-sites", type=_count, default=50, help="sites in one batch")
    parser.add_argument("--lease-per-step", type=_count, default=50, help="every 0.1 s")
    parser.add_argument("--producers", type=_count, default=1, help="payload-building processes")
    parser.add_argument("--zset-listpack", type=_count, default=0, metavar="N",
                        help="CONFIG SET zset-max-listpack-entries N, -value 512")  # fmt: skip
    parser.add_argument("--runs", type=_count, default=5, help="status calls timed per size")
    parser.add_argument("--stock-sample", type=_count, default=20_000)
    parser.add_argument("--phase-timeout", type=float, default=3600.0, help="s per growth")
    parser.add_argument("--redis-memory", type=float, default=6.0, help="GiB, prlimit --as")
    parser.add_argument("--client-memory", type=float, default=3.0, help="GiB per process")
    args = parser.parse_args()
    if args.sites < args.batch_sites or args.total < BATCH:
        parser.error("--sites must be at least --batch-sites, --total at least 500")
    # The services run in their own session: a SIGTERM (timeout, kill) must still stop them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="soak-") as name:
        tmp = Path(name)
        services = ServicesConfig(
            state_dir=tmp / "state", redis_port=free_port(), mongo_port=free_port()
        )
        soak = info = None
        try:
            info = start_redis(services)
            limit = int(args.redis_memory * _GIB)
            _cap_process(info.pid, limit)
            client = redis.Redis.from_url(services.redis_url)
            # a write past this fails with OOM instead of the server dying at its cap
            client.config_set("maxmemory", int(limit * 0.8))
            client.config_set("maxmemory-policy", "noeviction")
            client.close()
            _cap_process(start_mongo(services).pid, 2 * _GIB)
            # this process and what it starts (CLI, dashboard, producers, the leasing node)
            cap = int(args.client_memory * _GIB)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            soak = Soak(args, services, tmp)
            soak.run()
        finally:
            if info is not None and soak is not None:
                with contextlib.suppress(OSError, StopIteration, ValueError):
                    lines = Path(f"/proc/{info.pid}/status").read_text().splitlines()
                    peak = next(line for line in lines if line.startswith("VmPeak:"))
                    soak.redis_peak = int(peak.split()[1]) * 1024
            stop_service(services, "mongo")
            stop_service(services, "redis")
            if soak is not None and soak.segments:
                soak.report()  # what was measured, also when a later phase failed


if __name__ == "__main__":
    main()
