"""What a step hands a node: leases become requests, seeds become the spider's requests.

A payload or seed that cannot become a request costs only itself: a dead letter with
its reason (project/frontier/rejects.py), settled like any lease.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from project.frontier.ledger import Lease
from project.frontier.meta import LEASE_META_KEY, REVISIT_META_KEY, SEED_META_KEY
from project.frontier.rejects import refusal
from project.frontier.seeds import preview
from project.frontier.spiders import requests_from_seed
from project.frontier.wire import decode_request

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.frontier.config import FrontierConfig
    from project.frontier.ledger import PermitLedger
    from project.frontier.queue import Leased, LeasedQueue
    from project.frontier.settlements import SettlementQueue

__all__ = ["Handover", "process_age"]

logger = logging.getLogger(__name__)


def process_age() -> float | None:
    """Seconds since this process started (Linux), or None where /proc cannot say."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Handover:
    """Turns a step's leases and seeds into requests of this node."""

    def __init__(
        self,
        crawler: Crawler,
        spider: Spider,
        config: FrontierConfig,
        queue: LeasedQueue,
        ledger: PermitLedger,
        settlements: SettlementQueue,
    ) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.spider = spider
        self.stats: StatsCollector = crawler.stats
        self.config = config
        self.queue = queue
        self.ledger = ledger
        self.settlements = settlements
        self.download_timeout: float = crawler.settings.getfloat("DOWNLOAD_TIMEOUT")
        #: This node was handed a lease (it logs when, once).
        self.leased_any = False

    def leases(self, leased: list[Leased]) -> None:
        """Leased requests into the ledger, best first; an undecodable one is dead-lettered."""
        now = time.monotonic()
        if leased and not self.leased_any:
            self.leased_any = True
            age = process_age()
            if age is not None:
                self.stats.set_value("frontier/first_lease_seconds", round(age, 3))
                logger.info(
                    "First lease %.2fs after the process started",
                    age,
                    extra={"spider": self.spider},
                )
        for entry in leased:
            member = self.queue.request_member(entry.site, entry.payload)
            try:
                request, data = decode_request(entry.payload, self.spider)
            except Exception as exc:  # noqa: BLE001 (a payload from Redis costs at most itself)
                self._refuse(member, "payload", "", entry.site, entry.payload, exc)
                continue
            request.meta[LEASE_META_KEY] = True
            if isinstance(data.get("revisit"), dict):
                request.meta[REVISIT_META_KEY] = data["revisit"]
            # The downloader gives up before the lease is too old to be held.
            timeout = request.meta.get("download_timeout", self.download_timeout)
            request.meta["download_timeout"] = min(timeout, self.config.max_lease_seconds)
            self.ledger.add(entry.score, request, Lease(member, entry.site, entry.payload, now))

    def seeds(self, seeds: list[bytes], kind: str) -> None:
        """Seeds through the spider into the engine; each seed's lease is acked in the
        round trip that enqueues its requests. A seed that makes no request is refused."""
        for raw in seeds:
            member = self.queue.seed_member(raw, kind)
            try:
                for request in requests_from_seed(self.spider, raw):
                    request.meta[SEED_META_KEY] = True
                    assert self.crawler.engine is not None
                    self.crawler.engine.crawl(request)
            except Exception as exc:  # noqa: BLE001 (a seed from Redis costs at most itself)
                self._refuse(member, "seed", preview(raw), None, None, exc)
                continue
            self.stats.inc_value("frontier/seeds/accepted")
            self.settlements.add(ack=member)

    def _refuse(
        self,
        member: bytes,
        kind: str,
        url: str,
        site: str | None,
        payload: bytes | None,
        exc: Exception,
    ) -> None:
        node = self.config.node_id
        record = refusal(self.stats, self.spider, node, kind, url, site, payload, exc)
        self.settlements.add(dead=(member, record))
