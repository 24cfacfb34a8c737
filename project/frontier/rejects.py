"""What cannot go on becomes a dead letter with its reason: records and their log lines."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from project.frontier.seeds import InvalidSeed, preview

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

__all__ = ["dead_record", "log_duplicates", "log_poisoned", "refusal"]

logger = logging.getLogger(__name__)


def dead_record(
    url: str, site: str | None, outcome: dict[str, Any], payload: bytes | None, node: str
) -> bytes:
    """The dead-letter record of one request or seed (``fleetcrawl failures`` reads it)."""
    return json.dumps(
        {
            "url": url,
            "site": site,
            "attempts": outcome.get("attempts", 0),
            "error": outcome.get("error", ""),
            "kind": outcome.get("kind", "request"),
            "time": time.time(),
            "node": node,
            "request": payload.decode("utf-8", "replace") if payload else None,
        },
        separators=(",", ":"),
    ).encode()


def refusal(
    stats: StatsCollector,
    spider: Spider,
    node: str,
    kind: str,
    url: str,
    site: str | None,
    payload: bytes | None,
    exc: Exception,
) -> bytes:
    """The dead-letter record of a seed or queue entry that cannot become a request,
    counted and logged with its reason."""
    code = exc.code if isinstance(exc, InvalidSeed) else type(exc).__name__
    reason = str(exc)[:300] or type(exc).__name__
    if kind == "seed":
        stats.inc_value("frontier/seeds/rejected")
        stats.inc_value(f"frontier/seeds/rejected/{code}")
        logger.warning("Rejected seed %r: %s", url, reason, extra={"spider": spider})
    else:
        stats.inc_value("frontier/undecodable")
        logger.error(
            "Dead-lettering an undecodable queue entry (%s): %s",
            reason,
            preview(payload or b""),
            extra={"spider": spider},
        )
        reason = f"undecodable: {reason}"
    return dead_record(url, site, {"error": reason, "kind": kind}, payload, node)


def log_poisoned(records: list[bytes], max_deliveries: int, spider: Spider) -> None:
    """Entries whose leases expired FRONTIER_MAX_DELIVERIES times, now dead letters."""
    for raw in records:
        logger.error(
            "Dead-lettered a request whose lease expired %d times (it may kill nodes): %s",
            max_deliveries,
            preview(raw),
            extra={"spider": spider},
        )


def log_duplicates(payloads: list[bytes], debug: bool, spider: Spider) -> None:
    """Scrapy's dupefilter lines: the first duplicate, or every one with DUPEFILTER_DEBUG."""
    for payload in payloads if debug else payloads[:1]:
        try:
            url = str(json.loads(payload)["url"])
        except (ValueError, KeyError, TypeError):
            url = preview(payload)
        if debug:
            logger.debug(
                "Filtered duplicate request: <%s> (seen by the fleet)",
                url,
                extra={"spider": spider},
            )
        else:
            logger.debug(
                "Filtered duplicate request: <%s> - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                url,
                extra={"spider": spider},
            )
