"""A two-node crawl of the hostile test shop: links to other schemes, other local ports (the
crawl's own Redis among them) and invalid URLs, a 30 MB page, Retry-After abuse, 429 for ever
and a page that never finishes. The crawl ends by itself, stores every good product once,
dead-letters each broken page with its reason, sends nothing anywhere else, and each node's
memory stays bounded (the nodes run under an address-space cap)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from project.ops.services import free_port, status
from tests.fleet import wait_for
from tests.site.hostile import Canary
from tests.site.pages import HOSTILE_PAGES

if TYPE_CHECKING:
    from collections.abc import Callable

    import pymongo
    import redis

    from project.ops.services import ServicesConfig
    from tests.fleet import Fleet
    from tests.site.server import ShopServer

pytestmark = pytest.mark.crawl

#: Address space of a node without Chromium: VmPeak was 330-630 MiB on this crawl (Python,
#: Scrapy, Twisted, the Redis and MongoDB clients, thread stacks and malloc arenas); the cap
#: leaves room for that and stops a runaway download long before it could hurt the machine.
ADDRESS_SPACE_CAP = 2_000_000_000
#: Resident memory a node may reach on this crawl (the page cap is 16 MiB).
PEAK_RSS_BOUND = 400 * 1024 * 1024

_SETTINGS = {
    "RETRY_TIMES": 1,
    "FRONTIER_RETRY_BACKOFF_BASE": 0.2,
    # The never-ending page is cut by the lease's age, not by Scrapy's download timeout.
    "FRONTIER_MAX_LEASE_SECONDS": 6,
    "DOWNLOAD_TIMEOUT": 30,
    # One Retry-After pauses the whole site; keep that pause short here (60 s by default).
    "FRONTIER_RETRY_AFTER_MAX_PAUSE": 2,
}

#: Each broken page: (attempts it may take with RETRY_TIMES = 1, what its dead
#: letter's reason must say).
_DEAD_REASONS: dict[str, tuple[set[int], re.Pattern[str]]] = {
    "retry-after-huge": ({1}, re.compile(r"Retry-After")),
    "retry-after-garbage": ({2}, re.compile(r"HTTP 503")),
    "throttled": ({2}, re.compile(r"HTTP 429")),
    # Over DOWNLOAD_MAXSIZE (16 MiB): retried like a download error, or dead at once.
    "huge": ({1, 2}, re.compile(r"max(imum)? ?size|MAXSIZE|larger than", re.IGNORECASE)),
    # DOWNLOAD_TIMEOUT is 30 s: the download was cut at FRONTIER_MAX_LEASE_SECONDS.
    "stall": ({2}, re.compile(r"DownloadTimeoutError: .* took longer than 6(\.0)? seconds")),
}


class PeakMemory:
    """Samples ``VmHWM`` (peak resident set) and ``VmPeak`` of a process until it exits."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.hwm = 0
        self.vm_peak = 0
        self._interval = interval
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        status_file = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                text = status_file.read_text()
            except OSError:
                return
            if "State:\tZ" in text:  # exited, not yet reaped: the figures are gone
                return
            for line in text.splitlines():
                if line.startswith("VmHWM:"):
                    self.hwm = max(self.hwm, int(line.split()[1]) * 1024)
                elif line.startswith("VmPeak:"):
                    self.vm_peak = max(self.vm_peak, int(line.split()[1]) * 1024)
            time.sleep(self._interval)

    def join(self) -> None:
        self._thread.join(10)


def _redis_log(services: ServicesConfig) -> Path:
    return status(services)["redis"].log_file


def _flushall_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_flushall", {}).get("calls", 0))


def test_redis_logs_http_requests_as_attacks(
    services: ServicesConfig, redis_client: redis.Redis
) -> None:
    """The proof the crawl test relies on: HTTP that reaches Redis shows in its log."""
    log = _redis_log(services)
    offset = log.stat().st_size
    with socket.create_connection(("127.0.0.1", services.redis_port), timeout=5) as conn:
        conn.sendall(b"GET /FLUSHALL HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        conn.recv(4096)

    def attack_logged() -> bool:
        with log.open("rb") as file:
            file.seek(offset)
            return b"SECURITY ATTACK" in file.read()

    wait_for(attack_logged, 10, "Redis to log the HTTP request")
    assert redis_client.ping()


@pytest.mark.slow("a page that never ends is cut at its 6 s lease age, and once more on retry")
def test_hostile_shop_costs_only_itself(
    fleet: Fleet,
    make_shop: Callable[..., ShopServer],
    mongo: pymongo.database.Database[Any],
    services: ServicesConfig,
    redis_client: redis.Redis,
) -> None:
    started = time.monotonic()
    canary = Canary().start()
    closed_port = free_port()
    try:
        shop = make_shop(
            products=100,
            hostile=True,
            hostile_ports=[services.redis_port, canary.port, closed_port],
            stall_seconds=120,
            # Larger than DOWNLOAD_MAXSIZE (16 MiB) plus what the kernel may buffer between
            # the shop and a node that is slow to read (tcp_rmem's 32 MiB here, tcp_wmem's
            # 4 MiB): at 30 MB, a loaded node's socket took the whole page before the node
            # read past its limit, so the shop counted it sent whole.
            huge_bytes=64_000_000,
        )
        log = _redis_log(services)
        log_offset = log.stat().st_size
        flushall_before = _flushall_calls(redis_client)

        fleet.seed(shop.url("/"))
        cap = ("prlimit", f"--as={ADDRESS_SPACE_CAP}", "--")
        nodes = [fleet.start_node(*cap, **_SETTINGS) for _ in range(2)]
        memory = [PeakMemory(node.pid) for node in nodes]
        codes = fleet.wait(240)
        for sampler in memory:
            sampler.join()
        elapsed = time.monotonic() - started
        shop_stats = shop.stats()
        dead = [json.loads(raw) for raw in redis_client.lrange(fleet.keys.dead, 0, -1)]
        refused = _refusals([fleet.stats(i) for i in range(2)])
        _print_summary(mongo, dead, memory, refused, elapsed, shop_stats)

        # The crawl ends by itself.
        assert codes == [0, 0], [fleet.log(i)[-3000:] for i in range(2)]
        for index in (0, 1):
            assert fleet.stats(index)["finish_reason"] == "finished"

        # Every good product stored once, each fetched once.
        good = [p for p in shop.catalogue()["products"] if p["kind"] == "plain"]
        assert mongo.products.count_documents({}) == len(good) == 100
        assert {d["sku"] for d in mongo.products.find({}, {"sku": 1})} == {p["sku"] for p in good}
        assert shop_stats["product_hits"] == {str(p["id"]): 1 for p in good}

        # Nothing was sent to another scheme or port.
        assert canary.connections == 0, canary.received
        with log.open("rb") as file:
            file.seek(log_offset)
            assert b"SECURITY ATTACK" not in file.read()
        assert _flushall_calls(redis_client) == flushall_before

        # Bounded memory.
        for index, sampler in enumerate(memory):
            assert 0 < sampler.hwm < PEAK_RSS_BOUND, f"node{index} peaked at {sampler.hwm} B"
        # No huge page was sent whole (what a node read stops at 16 MiB), no stall ran its
        # course.
        assert shop_stats["hostile_completed"] == {}

        # The links to the three local ports, on every listing page fetched, refused as offsite.
        listings = sum(n for path, n in shop_stats["hits"].items() if path.startswith("/category/"))
        assert listings >= 5
        assert refused["frontier/refused/offsite"] == 3 * listings

        # Each broken page dead-lettered with its reason, and nothing else.
        by_page = {_hostile_name(letter["url"]): letter for letter in dead}
        assert set(by_page) == set(_DEAD_REASONS), dead
        for name, (attempts, reason) in _DEAD_REASONS.items():
            letter = by_page[name]
            assert reason.search(letter["error"]), (name, letter["error"])
            assert letter["attempts"] in attempts, (name, letter)
        assert len(dead) == len(_DEAD_REASONS)
        assert mongo.failures.count_documents({}) == len(dead)
        hostile = shop_stats["hostile"]
        assert hostile["retry-after-huge"] == 1
        assert hostile["retry-after-garbage"] == hostile["throttled"] == 2
        assert hostile["huge"] <= 2
        assert hostile["stall"] <= 2

        # Every foreign link refused, whichever layer refused it: the frontier
        # (frontier/refused/<reason>), the spider (products/bad_links: not a URL to Scrapy) or
        # Scrapy's UrlLengthMiddleware (urllength/request_ignored_count); none reached the shop
        # as some other URL of it (``http:///nohost`` read as ``/nohost`` on the page's site).
        foreign = len(shop_stats["hostile_links"]) - (len(HOSTILE_PAGES) - 1)
        assert sum(refused.values()) == foreign * listings, refused
        assert "long-url" not in hostile
        assert not [name for name in hostile if name.startswith("stray:")], hostile
        assert all(_on_shop(path) for path in shop_stats["hits"]), shop_stats["hits"].keys()
    finally:
        canary.stop()


def _hostile_name(url: str) -> str:
    path = urlsplit(url).path
    return next((name for name, page in HOSTILE_PAGES.items() if path == page), path)


def _on_shop(path_with_query: str) -> bool:
    """Paths a well-behaved crawl of the hostile shop asks for."""
    path = urlsplit(path_with_query).path
    return (
        path in ("/", "/robots.txt")
        or path.startswith(("/category/", "/product/"))
        or path in HOSTILE_PAGES.values()
    )


_REFUSAL_STATS = ("products/bad_links", "frontier/unserializable")


def _refusals(node_stats: list[dict[str, Any]]) -> Counter[str]:
    """Requests refused by reason, summed over the nodes."""
    total: Counter[str] = Counter()
    for stats in node_stats:
        for key, value in stats.items():
            if (
                key.startswith(("frontier/refused/", "urllength/"))
                or key in _REFUSAL_STATS
                or ("offsite" in key and isinstance(value, int))
            ):
                total[key] += value
    return total


def _print_summary(
    mongo: pymongo.database.Database[Any],
    dead: list[dict[str, Any]],
    memory: list[PeakMemory],
    refused: Counter[str],
    elapsed: float,
    shop_stats: dict[str, Any],
) -> None:
    lines = ["", "hostile crawl, 2 nodes", f"  run time                {elapsed:8.1f} s"]
    lines.append(f"  products stored         {mongo.products.count_documents({}):8d}")
    lines.append("  dead letters")
    for letter in sorted(dead, key=lambda d: d["url"]):
        name = _hostile_name(letter["url"])
        lines.append(f"    {name:22s} attempts {letter['attempts']}  {letter['error'][:110]}")
    lines.append("  peak memory per node")
    for index, sampler in enumerate(memory):
        lines.append(
            f"    node{index}  VmHWM {sampler.hwm / 2**20:7.1f} MiB"
            f"  VmPeak {sampler.vm_peak / 2**20:7.1f} MiB"
        )
    lines.append("  requests refused by reason (both nodes)")
    lines.extend(f"    {key:34s} {value:6d}" for key, value in sorted(refused.items()))
    lines.append(f"  shop: hostile pages requested {shop_stats['hostile']}")
    lines.append(f"        hostile bytes sent {shop_stats['hostile_sent']}")
    print("\n".join(lines))  # pytest -s shows what the crawl cost
