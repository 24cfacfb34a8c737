"""A snapshot of one spider's crawl: frontier in Redis, results in MongoDB."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

import redis

from project.frontier.admin import dead_letters
from project.frontier.config import FrontierConfig
from project.frontier.keys import FrontierKeys
from project.storage.config import MongoConfig
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pymongo
    from scrapy.settings import BaseSettings

__all__ = [
    "PRIORITY_BAND",
    "StatusReader",
    "drain_eta",
    "failure_summary",
    "fleet_status",
    "frontier_snapshot",
    "history",
    "mongo_counts",
    "node_view",
    "priority_bands",
    "site_table",
]

#: Queue scores are -priority * PRIORITY_BAND + arrival sequence.
PRIORITY_BAND = 10_000_000_000


def priority_bands(client: redis.Redis, key: str, limit: int = 50) -> dict[int, int]:
    """Queued requests per priority, highest first (one ZCOUNT per band)."""
    bands: dict[int, int] = {}
    low = "-inf"
    while len(bands) < limit:
        first = client.zrangebyscore(key, low, "+inf", start=0, num=1, withscores=True)
        if not first:
            break
        priority = -math.floor(float(first[0][1]) / PRIORITY_BAND)
        start = -priority * PRIORITY_BAND
        bands[priority] = int(client.zcount(key, start, f"({start + PRIORITY_BAND}"))
        low = str(start + PRIORITY_BAND)
    return bands


def site_table(
    client: redis.Redis, keys: FrontierKeys, default_rate: float = 0.0
) -> list[dict[str, Any]]:
    """Per site: queued, in flight, leases granted, fleet-wide rate cap and state."""

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    ready_sites: Any = client.zrange(keys.queue, 0, -1, withscores=True)
    parked_sites: Any = client.zrange(keys.throttled, 0, -1, withscores=True)
    ready = {text(s): float(v) for s, v in ready_sites}
    parked = {text(s): float(v) for s, v in parked_sites}
    known = set(ready) | set(parked) | {text(s) for s in client.hkeys(keys.leases)}
    fleet_default = client.hget(keys.limits, "*")
    default = text(fleet_default).split() if fleet_default else [str(default_rate), "0"]
    rows = []
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) / 1000
    for site in sorted(known):
        limit = client.hget(keys.limits, site)
        rate, conc = text(limit).split() if limit else default
        adaptive = client.hget(keys.rates, site)
        if adaptive is not None and (float(rate) <= 0 or float(text(adaptive)) < float(rate)):
            rate = text(adaptive)
        rows.append(
            {
                "site": site,
                "queued": int(client.zcard(keys.site_queue(site))),
                "in_flight": int(client.hget(keys.active, site) or 0),
                "leases": int(client.hget(keys.leases, site) or 0),
                "allowed_rate": float(rate),
                "concurrency": int(float(conc)),
                "state": "paused"
                if parked.get(site, 0) > now_ms + 1000
                else "throttled"
                if site in parked
                else "ready"
                if site in ready
                else "idle",
            }
        )
    return rows


def frontier_snapshot(client: redis.Redis, keys: FrontierKeys) -> dict[str, Any]:
    """Sizes of every frontier structure of one spider."""
    sites = site_table(client, keys)
    bands: dict[int, int] = {}
    for site in sites:
        for priority, count in priority_bands(client, keys.site_queue(site["site"])).items():
            bands[priority] = bands.get(priority, 0) + count
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.queued)
    pipe.zcard(keys.delayed)
    pipe.zrange(keys.inflight, 0, -1)
    pipe.scard(keys.dupefilter)
    pipe.memory_usage(keys.dupefilter)
    pipe.llen(keys.start_urls)
    pipe.llen(keys.dead)
    queued, delayed, inflight, seen, seen_bytes, seeds, dead = pipe.execute()
    by_node: dict[str, int] = {}
    for member in inflight:
        node = member.split(b"\n", 1)[0].decode("utf-8", "replace")
        by_node[node] = by_node.get(node, 0) + 1
    return {
        "spider": keys.spider,
        "queued": int(queued or 0),
        "queued_by_priority": dict(sorted(bands.items(), reverse=True)),
        "sites": sites,
        "delayed_retries": int(delayed),
        "in_flight": len(inflight),
        "in_flight_by_node": by_node,
        "seen": int(seen),
        "seen_bytes": int(seen_bytes or 0),
        "seeds_waiting": int(seeds),
        "dead_letters": int(dead),
    }


def mongo_counts(
    client: pymongo.MongoClient[dict[str, Any]], config: MongoConfig, where: str = "MongoDB"
) -> dict[str, Any]:
    """Documents in the products, rejects and failures collections (estimated: no scan)."""
    from pymongo.errors import PyMongoError

    db = client[config.database]
    collections = {
        "products": config.products_collection,
        "rejects": config.rejects_collection,
        "failures": config.failures_collection,
    }
    try:
        return {shown: db[name].estimated_document_count() for shown, name in collections.items()}
    except PyMongoError as exc:
        return {"error": f"{where} unreachable: {type(exc).__name__}"}


def node_view(record: dict[str, Any], present: bool, in_flight: int, now: float) -> dict[str, Any]:
    """One node's heartbeat record, with its state judged: alive, dead or finished.

    *present* tells whether the node's presence key still exists (it expires
    ``MONITOR_NODE_TIMEOUT`` after the last heartbeat); *in_flight* is the
    number of leases Redis holds under its id.
    """
    state = "alive" if present else "dead"
    if record.get("state") == "finished":
        state = "finished"
    alive = state == "alive"
    return {
        "id": record.get("id", ""),
        "host": record.get("host", ""),
        "pid": record.get("pid"),
        "state": state,
        "finish_reason": record.get("finish_reason"),
        "started": record.get("started"),
        "last_seen": record.get("last_seen"),
        "age_seconds": max(0.0, now - float(record.get("last_seen") or now)),
        "pages": int(record.get("pages", 0)),
        "items": int(record.get("items", 0)),
        "pages_per_min": float(record.get("pages_per_min", 0.0)) if alive else 0.0,
        "items_per_min": float(record.get("items_per_min", 0.0)) if alive else 0.0,
        "errors": int(record.get("errors", 0)),
        "download_errors": int(record.get("download_errors", 0)),
        "retries": int(record.get("retries", 0)),
        "dead_letters": int(record.get("dead_letters", 0)),
        "seeds_rejected": int(record.get("seeds_rejected", 0)),
        "retry_reasons": dict(record.get("retry_reasons") or {}),
        "in_flight": in_flight,
        "held_leases": int(record.get("in_flight", 0)),
        "rss_bytes": int(record.get("rss_bytes", 0)),
        "children_rss_bytes": int(record.get("children_rss_bytes", 0)),
        "journal_backlog": record.get("journal_backlog"),
    }


def drain_eta(samples: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(drain rate per second, seconds until empty) from ``(time, pending)`` samples.

    The rate is the least-squares slope of the pending work since its last
    peak (a crawl first discovers, then drains), so one noisy sample does not
    swing it. The ETA is ``None`` while work grows or stays flat, and 0 when
    nothing is pending.
    """
    if not samples:
        return None, None
    pending = samples[-1][1]
    peak = max(range(len(samples)), key=lambda i: (samples[i][1], i))
    if peak < len(samples) - 1:
        samples = samples[peak:]
    if len(samples) < 2:
        return None, 0.0 if pending == 0 else None
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return None, 0.0 if pending == 0 else None
    drain = -sum((t - mean_t) * (v - mean_v) for t, v in samples) / var
    if pending == 0:
        return drain, 0.0
    return drain, pending / drain if drain > 0 else None


def failure_summary(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dead letters grouped by error, most frequent first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        error = str(record.get("error", ""))[:200]
        kind = str(record.get("kind", "request"))
        group = groups.setdefault(
            (kind, error),
            {"kind": kind, "error": error, "count": 0, "last_url": "", "last_time": 0.0},
        )
        group["count"] += 1
        if float(record.get("time") or 0) >= group["last_time"]:
            group["last_time"] = float(record.get("time") or 0)
            group["last_url"] = str(record.get("url", ""))[:300]
            group["node"] = record.get("node")
    return sorted(groups.values(), key=lambda g: (-g["count"], g["error"]))


def _pending(sample: dict[str, Any]) -> int:
    return sum(int(sample.get(k, 0)) for k in ("queued", "delayed", "in_flight", "seeds"))


def history(
    client: redis.Redis, keys: FrontierKeys, since: str | None = None, count: int = 5000
) -> list[dict[str, Any]]:
    """Fleet samples after stream id *since*, oldest first, each with ``id`` and ``t``."""
    start = f"({since}" if since else "-"
    entries: list[tuple[bytes, dict[bytes, bytes]]]
    entries = client.xrange(keys.history, start, "+", count=count)  # type: ignore[assignment]
    return [_sample(entry_id, fields) for entry_id, fields in entries]


def _sample(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    sample: dict[str, Any] = json.loads(fields[b"s"])
    if not isinstance(sample.get("nodes"), dict):
        sample["nodes"] = {}  # cjson writes an empty table as {} but be lenient
    sample["id"] = entry_id.decode()
    sample["t"] = int(sample["id"].split("-", 1)[0])
    return sample


def fleet_status(
    client: redis.Redis,
    keys: FrontierKeys,
    *,
    eta_window: float = 60.0,
) -> dict[str, Any]:
    """Everything status, watch, the dashboard and /metrics show, in one dict.

    The frontier snapshot, the nodes (alive, dead or finished), fleet totals
    and rates, progress with an ETA from the drain rate of the last
    *eta_window* seconds of history, and dead letters by error.
    """
    status = frontier_snapshot(client, keys)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.nodes)
    pipe.zrange(keys.alive, 0, -1, withscores=True)
    pipe.time()
    pipe.lrange(keys.dead, 0, 199)
    raw_nodes, expiries, (seconds, micros), dead = pipe.execute()
    server_ms = int(seconds) * 1000 + int(micros) // 1000
    alive = {node.decode("utf-8", "replace") for node, until in expiries if until > server_ms}
    records = {}
    for node_id, raw in raw_nodes.items():
        try:
            records[node_id.decode("utf-8", "replace")] = json.loads(raw)
        except ValueError:
            continue
    recent: Any = client.xrange(keys.history, str(server_ms - int(eta_window * 1000)), "+")
    present = [node_id in alive for node_id in records]
    now = time.time()
    nodes = [
        node_view(record, bool(alive), status["in_flight_by_node"].get(node_id, 0), now)
        for (node_id, record), alive in zip(records.items(), present, strict=True)
    ]
    order = {"alive": 0, "dead": 1, "finished": 2}
    nodes.sort(key=lambda n: (order[n["state"]], n["id"]))
    status["nodes"] = nodes
    status["fleet"] = _fleet(nodes)
    status["time"] = now
    samples = [_sample(entry_id, fields) for entry_id, fields in recent]
    drain, eta = drain_eta([(s["t"] / 1000, _pending(s)) for s in samples])
    pending = status["queued"] + status["delayed_retries"] + status["in_flight"]
    pending += status["seeds_waiting"]
    if not samples:
        eta = 0.0 if pending == 0 else None
    done = max(0, status["seen"] - status["queued"] - status["delayed_retries"])
    done = max(0, done - status["in_flight"])
    status["progress"] = {
        "done": done,
        "total": status["seen"],
        "fraction": done / status["seen"] if status["seen"] else 0.0,
        "pending": pending,
        "drain_per_s": drain,
        "eta_seconds": eta,
    }
    status["failures"] = failure_summary([json.loads(r) for r in dead])
    reported = [n["journal_backlog"] for n in nodes if n["journal_backlog"] is not None]
    status["journal_backlog"] = sum(reported) if reported else None
    return status


def _fleet(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    reasons: dict[str, int] = {}
    for node in nodes:
        for reason, count in node["retry_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + count
    fleet: dict[str, Any] = {
        f"nodes_{state}": sum(1 for n in nodes if n["state"] == state)
        for state in ("alive", "dead", "finished")
    }
    for key in ("pages", "items", "errors", "download_errors", "retries", "dead_letters"):
        fleet[key] = sum(n[key] for n in nodes)
    fleet["seeds_rejected"] = sum(n["seeds_rejected"] for n in nodes)
    fleet["pages_per_min"] = sum(n["pages_per_min"] for n in nodes)
    fleet["items_per_min"] = sum(n["items_per_min"] for n in nodes)
    fleet["retry_reasons"] = reasons
    return fleet


class StatusReader:
    """Long-lived Redis and MongoDB clients for repeated :func:`fleet_status` reads.

    Used by ``fleetcrawl status``, ``--watch`` and the dashboard; connects on first use.
    """

    def __init__(
        self, redis_url: str, keys: FrontierKeys, mongo: MongoConfig | None = None
    ) -> None:
        self.keys = keys
        self.spider = keys.spider
        self.redis_url = redis_url
        self.redis: redis.Redis = redis.Redis.from_url(
            redis_url, socket_connect_timeout=5, socket_timeout=10
        )
        self.mongo = mongo
        self._mongo: pymongo.MongoClient[dict[str, Any]] | None = None
        self._last_leases: tuple[float, dict[str, int]] | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider: str) -> StatusReader:
        """The reader of *spider*'s keys and collections under these settings."""
        return cls(
            FrontierConfig.from_settings(settings).redis_url,
            FrontierKeys.from_settings(settings, spider),
            MongoConfig.from_settings(settings, spider_name=spider),
        )

    def read(self) -> dict[str, Any]:
        """:func:`fleet_status` plus MongoDB counts (raises ``RedisError`` if Redis is away)."""
        status = fleet_status(self.redis, self.keys)
        self._achieved_rates(status.get("sites", []))
        if self.mongo is not None:
            if self._mongo is None:
                import pymongo  # imported late: the failures command needs no MongoDB client

                self._mongo = pymongo.MongoClient(self.mongo.uri, serverSelectionTimeoutMS=3000)
            where = f"MongoDB at {mask_url(self.mongo.uri)}"
            status["mongo"] = mongo_counts(self._mongo, self.mongo, where)
        return status

    def _achieved_rates(self, sites: list[dict[str, Any]]) -> None:
        """Leases per second of each site since the previous read (None on the first)."""
        now = time.monotonic()
        leases = {site["site"]: int(site["leases"]) for site in sites}
        for site in sites:
            site["achieved_rate"] = None
            if self._last_leases is not None:
                then, before = self._last_leases
                granted = leases[site["site"]] - before.get(site["site"], leases[site["site"]])
                site["achieved_rate"] = granted / max(now - then, 1e-6)
        self._last_leases = (now, leases)

    def history(self, since: str | None = None) -> list[dict[str, Any]]:
        """Fleet samples after stream id *since* (all of the last hour without it)."""
        return history(self.redis, self.keys, since)

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest dead letters."""
        return dead_letters(self.redis, self.keys, limit)

    def close(self) -> None:
        """Close both clients."""
        self.redis.close()
        if self._mongo is not None:
            self._mongo.close()
            self._mongo = None
