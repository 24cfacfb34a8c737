"""A request that left the engine becomes its lease's settlement: an ack (with its
revisit record), a retry, a dead letter, and a site pause when the page asked for one."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from project.frontier.meta import REVISIT_META_KEY
from project.frontier.rejects import dead_record
from project.frontier.revisit import MAX_RECORD_BYTES, mark_gone, revisit_entries, touch_items
from project.frontier.wire import encode_request
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.frontier.ledger import Lease
    from project.frontier.queue import StepBatch, StepResult
    from project.frontier.settlements import SettlementQueue

__all__ = ["count_step", "settle_request"]

logger = logging.getLogger(__name__)


def settle_request(
    request: Request,
    lease: Lease,
    outcome: dict[str, Any] | None,
    settlements: SettlementQueue,
    crawler: Crawler,
    spider: Spider,
    node: str,
    now: float,
    max_record: int = MAX_RECORD_BYTES,
) -> None:
    """Queue the settlement of *lease*, whose *request* left the engine with *outcome*
    (None: done; else what the retry and robots middlewares decided); *now*: Redis' time;
    *max_record*: FRONTIER_REVISIT_MAX_RECORD_BYTES."""
    if outcome is None:
        settlements.add(ack=lease.member)
        entries = revisit_entries(request, lease.site, lease.payload, now, max_record)
        if entries is None:
            _too_big(crawler, request, len(lease.payload), max_record)
            entries = []
        for revisit in entries:
            settlements.add(revisit=revisit)
        mark_gone(crawler, request)
        return
    if outcome["action"] == "retry":
        try:
            again = outcome.get("request") or request  # Scrapy's retry copy
            payload = encode_request(again, spider, id=os.urandom(6).hex())
        except Exception as exc:  # noqa: BLE001 (whatever it is, this one request pays)
            outcome = {**outcome, "action": "dead", "error": f"cannot retry: {exc}"}
        else:
            delay_ms = int(outcome["delay"] * 1000)
            settlements.add(retry=(lease.member, delay_ms, lease.site, payload))
    if outcome["action"] != "retry":
        record = dead_record(request.url, lease.site, outcome, lease.payload, node)
        settlements.add(dead=(lease.member, record))
        last = request.meta.get(REVISIT_META_KEY)
        if isinstance(last, dict):
            # a revisit that failed tells nothing of its items: they stay alive
            touch_items(crawler, [json.dumps(last).encode()])
    if outcome.get("pause"):
        settlements.add(pause=(lease.site, int(outcome["pause"] * 1000)))


def _too_big(crawler: Crawler, request: Request, size: int, most: int) -> None:
    """A request under a revisit policy too big to keep a record of: it is not revisited."""
    assert crawler.stats is not None
    crawler.stats.inc_value("revisit/too_big")
    logger.warning(
        "%s: its request is %d bytes, over FRONTIER_REVISIT_MAX_RECORD_BYTES=%d: no revisit"
        " record is kept, so it is fetched again only as a new URL",
        mask_url(request.url)[:200],
        size,
        most,
    )


def count_step(stats: StatsCollector, batch: StepBatch, result: StepResult) -> None:
    """The stats of one round trip that ran: what it sent, and what the fleet did with it."""
    counts = {
        "frontier/site_paused": len(batch.pauses),
        "frontier/acked": len(batch.acks),
        "frontier/retried": len(batch.retries),
        "frontier/dead": len(batch.dead),
        "frontier/poison": len(result.poisoned),
        "frontier/settled_stale": result.stale,
        "frontier/refused/offsite": result.offsite,
        "frontier/enqueued": result.added,
        "frontier/leased": len(result.leased),
        "frontier/duplicates": result.duplicates,
        "dupefilter/filtered": result.duplicates,
        "revisit/recorded": len(batch.revisits),
        "revisit/rediscovered": result.rediscovered,
        "revisit/due": result.handed_out,
        "revisit/not_due": len(result.still_linked),
        "revisit/capped": result.revisits_capped,
        "revisit/forgotten": result.revisits_forgotten,
    }
    if batch.maintain:
        counts["frontier/reaped"] = result.reaped
        counts["frontier/retries_due"] = result.promoted
    for key, n in counts.items():
        if n:
            stats.inc_value(key, n)
