"""The report of a finished crawl run: stored in MongoDB, printed, compared, alerted on.

The node that ends a run (project/runs/tracker.py) counts what is stored (and what its
nodes marked gone: only items whose page said so, project/frontier/revisit.py), writes the report into ``MONGO_RUNS_COLLECTION``
(``crawl_runs``) and compares it with the spider's previous run. A threshold it fails
(``RUNS_MAX_ITEM_DROP``, ``RUNS_MAX_COVERAGE_DROP``, ``RUNS_MAX_ERROR_RATE``) is an ERROR and,
with ``RUNS_WEBHOOK_URL``, a JSON POST there. Then it writes the run's FLEET_FEEDS
(project/dataout/feeds.py) and keeps what became of them in the report.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError, PyMongoError
from redis.exceptions import RedisError

from project.config import read_settings, setting
from project.dataout.config import DataOutConfig
from project.dataout.feeds import write_feeds
from project.frontier.stopping import download_errors
from project.runs.webhook import deliver
from project.storage.config import MongoConfig
from project.storage.records import report_record

if TYPE_CHECKING:
    from typing import Self

    from pymongo.asynchronous.database import AsyncDatabase
    from scrapy.settings import BaseSettings

    from project.storage.outbox import Outbox

__all__ = ["RunsConfig", "finish_run", "render_report"]

logger = logging.getLogger(__name__)

#: Ids per update: FerretDB 1.24 hangs on an update that modifies 100 or more documents.
_IDS_PER_UPDATE = 50
#: A feed takes what was written until this far past the moment it is written: every item
#: the run stored, none held back (no later read continues from a feed).
_FEEDS_AHEAD_MS = 3_600_000
_Document = dict[str, Any]


@dataclass(frozen=True)
class RunsConfig:
    """RUNS_*: crawl runs, their report and its alerts."""

    enabled: bool = setting("RUNS_ENABLED", True)
    max_item_drop: float = setting("RUNS_MAX_ITEM_DROP", 0.2)
    max_coverage_drop: float = setting("RUNS_MAX_COVERAGE_DROP", 0.2)
    max_error_rate: float = setting("RUNS_MAX_ERROR_RATE", 0.1)
    #: A site whose share of blocked answers is above this alerts (project/blocking), once it
    #: answered RUNS_BLOCK_MIN_RESPONSES times in the run.
    max_block_rate: float = setting("RUNS_MAX_BLOCK_RATE", 0.2)
    block_min_responses: int = setting("RUNS_BLOCK_MIN_RESPONSES", 20)
    webhook_url: str = setting("RUNS_WEBHOOK_URL", "")
    webhook_proxy: str = setting("RUNS_WEBHOOK_PROXY", "")
    webhook_timeout: float = setting("RUNS_WEBHOOK_TIMEOUT", 10.0)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(**read_settings(cls, settings))


def _total(counts: dict[str, float], *names: str) -> int:
    return int(sum(counts.get(name, 0) for name in names))


def _summed(nodes: dict[str, dict[str, Any]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for values in nodes.values():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total


def _coverage(counts: dict[str, float]) -> dict[str, dict[str, float]]:
    """Share of the items of each collection that had each field (``coverage/<c>/<field>``)."""
    found: dict[str, dict[str, float]] = {}
    for key, value in counts.items():
        parts = key.split("/", 2)
        if len(parts) != 3 or parts[0] != "coverage" or parts[2] == "items":
            continue
        items = counts.get(f"coverage/{parts[1]}/items", 0)
        if items:
            found.setdefault(parts[1], {})[parts[2]] = round(value / items, 4)
    return found


async def _item_collections(database: AsyncDatabase[_Document], config: MongoConfig) -> list[str]:
    """Collections holding items of this spider (a 304-only run wrote none of them)."""
    own = {config.rejects_collection, config.failures_collection, config.changes_collection,
           config.runs_collection}  # fmt: skip
    names = []
    for name in sorted(await database.list_collection_names()):
        if name in own or name.startswith("system."):
            continue
        if await database[name].find_one({"source_spider": config.spider}, {"_id": 1}):
            names.append(name)
    return names


def _blocks(counts: dict[str, float]) -> _Document:
    """Blocks of the run (project/blocking/middleware.py's counters): in all, by signal, and
    per site with the share of its answers they were."""
    by_signal = {
        key.removeprefix("blocks/signal/"): int(n)
        for key, n in counts.items()
        if key.startswith("blocks/signal/")
    }
    checked = {
        key.removeprefix("block_checks/"): int(n)
        for key, n in counts.items()
        if key.startswith("block_checks/")
    }
    sites: dict[str, _Document] = {}
    for key, n in counts.items():
        if (
            key.startswith("blocks/")
            and key.count("/") >= 2
            and not key.startswith(("blocks/signal/", "blocks/count"))
        ):
            site, signal = key.removeprefix("blocks/").rsplit("/", 1)
            entry = sites.setdefault(site, {"blocks": 0, "signals": {}})
            entry["blocks"] += int(n)
            entry["signals"][signal] = int(n)
    for site, entry in sites.items():
        entry["site"] = site
        entry["responses"] = checked.get(site, entry["blocks"])
        entry["rate"] = round(entry["blocks"] / max(1, entry["responses"]), 4)
    total = sum(checked.values())
    count = _total(counts, "blocks/count")
    return {
        "count": count,
        "rate": round(count / total, 4) if total else 0.0,
        "by_signal": dict(sorted(by_signal.items())),
        # a list: a site has dots, which a document's keys may not have (FerretDB)
        "sites": sorted(sites.values(), key=lambda e: (-e["rate"], e["site"])),
    }


def _compare(report: _Document, previous: _Document | None, config: RunsConfig) -> list[str]:
    """The thresholds this run fails."""
    alerts = []
    rate = report["error_rate"]
    if rate > config.max_error_rate:
        alerts.append(f"error rate {rate:.1%} above {config.max_error_rate:.1%}")
    for entry in report.get("blocks", {}).get("sites", []):
        site = entry["site"]
        if (
            entry["responses"] >= config.block_min_responses
            and entry["rate"] > config.max_block_rate
        ):
            signals = ", ".join(f"{s} {n}" for s, n in sorted(entry["signals"].items()))
            alerts.append(
                f"{site} blocked {entry['rate']:.1%} of {entry['responses']} answers"
                f" ({signals}), above {config.max_block_rate:.1%}"
            )
    if previous is None:
        return alerts
    before, now = previous.get("items", {}).get("stored", 0), report["items"]["stored"]
    if before and (before - now) / before > config.max_item_drop:
        alerts.append(
            f"items stored fell {(before - now) / before:.1%} ({before} -> {now}),"
            f" more than {config.max_item_drop:.0%}"
        )
    old_coverage = previous.get("coverage", {})
    for name, fields in report["coverage"].items():
        for field, share in fields.items():
            was = old_coverage.get(name, {}).get(field)
            if isinstance(was, int | float) and was - share > config.max_coverage_drop:
                alerts.append(
                    f"{name}.{field} coverage fell from {was:.0%} to {share:.0%},"
                    f" more than {config.max_coverage_drop:.0%}"
                )
    return alerts


async def finish_run(
    settings: BaseSettings, spider: str, run_id: str, started: float, ended: float,
    nodes: dict[str, dict[str, Any]], config: RunsConfig, *, outbox: Outbox | None = None,
) -> _Document | None:  # fmt: skip
    """Store and print the run's report, alert on failed thresholds.

    MongoDB away, the report of the nodes' counters waits in the fleet's *outbox* like the
    items (project/storage/outbox.py): stored once a node drains it.
    """
    counts = _summed(nodes)
    pages = _total(counts, "downloader/response_count")
    if not pages:
        logger.info("Crawl run %s fetched nothing: no report", run_id)
        return None
    mongo = MongoConfig.from_settings(settings, spider_name=spider)
    client: AsyncMongoClient[_Document] = AsyncMongoClient(
        mongo.uri, serverSelectionTimeoutMS=int(mongo.server_selection_timeout * 1000),
        tz_aware=True, appname="fleetcrawl-report",
    )  # fmt: skip
    try:
        database = client[mongo.database]
        start_at = datetime.fromtimestamp(started, UTC)
        end_at = datetime.fromtimestamp(ended, UTC)
        collections = await _item_collections(database, mongo)
        # marked by the nodes as their pages said so (project/frontier/revisit.py, gone_refs)
        gone = _total(counts, "mongo/gone")
        stored = 0
        for name in collections:
            stored += await database[name].count_documents(
                {"source_spider": spider, "gone_at": {"$exists": False}}
            )
        server_errors = sum(
            v for k, v in counts.items() if k.startswith("downloader/response_status_count/5")
        )
        errors = (
            download_errors(
                _total(counts, "downloader/exception_count"), _total(counts, "frontier/sent_back")
            )
            + _total(counts, "frontier/dead")
            + int(server_errors)
        )
        requests = max(1, _total(counts, "downloader/request_count"))
        report: _Document = {
            "_id": run_id, "spider": spider, "started": start_at, "ended": end_at,
            "duration_seconds": round(ended - started, 1), "nodes": len(nodes), "pages": pages,
            "bytes": _total(counts, "downloader/response_bytes"),
            "not_modified": _total(counts, "revisit/not_modified"),
            "revisits": {"changed": _total(counts, "revisit/changed"),
                         "unchanged": _total(counts, "revisit/unchanged")},
            "items": {"inserted": _total(counts, "mongo/inserted"),
                      "updated": _total(counts, "mongo/updated"),
                      "unchanged": _total(counts, "mongo/unchanged"),
                      "touched": _total(counts, "mongo/touched"),
                      "gone": gone, "stored": stored},
            "changes": _total(counts, "mongo/changes"),
            "rejects": _total(counts, "validation/dropped", "mongo/rejected"),
            "dead_letters": _total(counts, "frontier/dead"),
            "errors": errors, "error_rate": round(errors / requests, 4),
            "coverage": _coverage(counts), "gone_marked": mongo.mark_gone,
            "blocks": _blocks(counts),
        }  # fmt: skip
        previous = await database[mongo.runs_collection].find_one(
            {"spider": spider, "_id": {"$ne": run_id}}, sort=[("ended", -1)]
        )
        report["previous"] = previous["_id"] if previous else None
        report["alerts"] = _compare(report, previous, config)
        try:
            await database[mongo.runs_collection].insert_one(report)
        except DuplicateKeyError:
            await database[mongo.runs_collection].replace_one({"_id": run_id}, report)
        feeds = DataOutConfig.from_settings(settings).parsed_feeds()
        if feeds:
            report["feeds"] = await write_feeds(
                database, feeds, spider=spider, run=run_id,
                window=(int(started * 1000), int(ended * 1000)),
                until_ms=int(time.time() * 1000) + _FEEDS_AHEAD_MS, collections=collections,
                default_collection=mongo.products_collection,
            )  # fmt: skip
            await database[mongo.runs_collection].update_one(
                {"_id": run_id}, {"$set": {"feeds": report["feeds"]}}
            )
        for line in render_report(report, previous).splitlines():
            logger.info("%s", line)
        for alert in report["alerts"]:
            logger.error("Crawl run %s: %s", run_id, alert)
        if report["alerts"] and config.webhook_url:
            report["webhook"] = await _post_alerts(report, config)
            await database[mongo.runs_collection].update_one(
                {"_id": run_id}, {"$set": {"webhook": report["webhook"]}}
            )
    except PyMongoError as exc:
        failure: PyMongoError | None = exc
    else:
        failure = None
    finally:
        await client.close()
    if failure is not None:
        return await _report_later(mongo, spider, run_id, started, ended, nodes, outbox, failure)
    return report


async def _report_later(
    mongo: MongoConfig, spider: str, run_id: str, started: float, ended: float,
    nodes: dict[str, dict[str, Any]], outbox: Outbox | None, exc: PyMongoError,
) -> _Document | None:  # fmt: skip
    """MongoDB away as the run ends: the nodes' counters as its report, in the outbox.

    ``items.stored`` is None (what is stored cannot be read).
    """
    counts = _summed(nodes)
    report: _Document = {
        "_id": run_id, "spider": spider, "started": datetime.fromtimestamp(started, UTC),
        "ended": datetime.fromtimestamp(ended, UTC), "duration_seconds": round(ended - started, 1),
        "nodes": len(nodes), "pages": _total(counts, "downloader/response_count"),
        "bytes": _total(counts, "downloader/response_bytes"),
        "items": {"inserted": _total(counts, "mongo/inserted"),
                  "updated": _total(counts, "mongo/updated"),
                  "waited": _total(counts, "mongo/journaled", "mongo/outboxed"),
                  "not_stored": _total(counts, "mongo/not_stored"),
                  "gone": _total(counts, "mongo/gone"), "stored": None},
        "rejects": _total(counts, "validation/dropped", "mongo/rejected"),
        "dead_letters": _total(counts, "frontier/dead"), "coverage": _coverage(counts),
        "gone_marked": mongo.mark_gone, "written_later": True,
        "note": f"MongoDB was away when the run ended ({exc}): the nodes' counters only",
    }  # fmt: skip
    if outbox is None:
        logger.error("could not write the report of crawl run %s: %s", run_id, exc)
        return None
    record = report_record(report, database=mongo.database, collection=mongo.runs_collection)
    try:
        taken = await outbox.push([record])
    except RedisError as error:
        taken, exc = False, error  # type: ignore[assignment]
    if not taken:
        logger.error("could not write the report of crawl run %s anywhere: %s", run_id, exc)
        return None
    logger.warning(
        "MongoDB is away (%s): the report of crawl run %s waits in the outbox %s, and is"
        " stored once a node or `fleetcrawl store drain` writes it",
        exc, run_id, outbox.key,
    )  # fmt: skip
    return report


async def _post_alerts(report: _Document, config: RunsConfig) -> _Document:
    """The alerts to RUNS_WEBHOOK_URL (project/runs/webhook.py): what became of them."""
    body = json.dumps({"run": report["_id"], "spider": report["spider"],
                       "alerts": report["alerts"], "report": report}, default=str).encode()  # fmt: skip
    outcome = await deliver(
        config.webhook_url, body, proxy=config.webhook_proxy, timeout=config.webhook_timeout
    )
    if outcome.delivered:
        logger.info("Alerts of crawl run %s posted to %s", report["_id"], outcome.url)
    else:
        logger.error(
            "could not post the alerts of crawl run %s to %s after %d tries: %s",
            report["_id"], outcome.url, outcome.tries, outcome.error,
        )  # fmt: skip
    return outcome.as_document()


def _delta(now: float, before: Any) -> str:
    if not isinstance(before, int | float):
        return ""
    return f" ({now - before:+g})"


def render_report(report: _Document, previous: _Document | None = None) -> str:
    """The report as a few lines of text, with the previous run's figures beside."""
    prev = previous or {}
    items, old_items = report["items"], prev.get("items", {})
    lines = [
        f"Crawl run {report['_id']} of {report['spider']}: {report['duration_seconds']}s,"
        f" {report['nodes']} node(s)"
        + (f", compared with {report['previous']}" if report.get("previous") else ""),
        (f"  pages {report['pages']}{_delta(report['pages'], prev.get('pages'))},"
         f" bytes {report['bytes']}{_delta(report['bytes'], prev.get('bytes'))},"
         f" not modified (304) {report['not_modified']}"),
        "  items: " + ", ".join(
            f"{name} {items[name]}{_delta(items[name], old_items.get(name))}"
            for name in ("inserted", "updated", "unchanged", "touched", "gone", "stored")
        ),
        (f"  rejects {report['rejects']}, dead letters {report['dead_letters']},"
         f" errors {report['errors']} ({report['error_rate']:.1%})"),
    ]  # fmt: skip
    blocks = report.get("blocks") or {}
    if blocks.get("count"):
        signals = ", ".join(f"{s} {n}" for s, n in blocks["by_signal"].items())
        lines.append(f"  blocks {blocks['count']} ({blocks['rate']:.1%}): {signals}")
    for name, fields in sorted(report["coverage"].items()):
        shown = ", ".join(f"{field} {share:.0%}" for field, share in sorted(fields.items()))
        lines.append(f"  coverage of {name}: {shown}")
    lines += [f"  ALERT: {alert}" for alert in report.get("alerts", [])]
    return "\n".join(lines)
