"""A snapshot of one spider's crawl: frontier in Redis, results in MongoDB."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from project.blocking.config import proxy_tiers
from project.blocking.readers import BlockingRecords, proxy_table, queue_reads, session_sites
from project.frontier import lua
from project.frontier.admin import dead_letters, decode_dead_letter
from project.frontier.config import FrontierConfig
from project.frontier.connection import RedisTarget
from project.frontier.keys import FrontierKeys
from project.frontier.seen import bloom_expected
from project.frontier.site_queues import OLDER, PRIORITY_BAND, read_site_queues, site_queue_sizes
from project.monitoring.scale import SiteSlots, scale_view
from project.storage.config import MongoConfig
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Coroutine, Mapping, Sequence

    import redis
    from pymongo import AsyncMongoClient
    from scrapy.settings import BaseSettings

__all__ = [
    "PRIORITY_BAND",
    "REDACTED",
    "StatusReader",
    "decode_dead_letter",
    "drain_eta",
    "failure_summary",
    "fleet_status",
    "frontier_snapshot",
    "history",
    "mongo_counts",
    "node_view",
    "outbox_status",
    "priority_bands",
    "read_dead_letters",
    "redact_dead_letter",
    "render_patterns",
    "site_table",
]

#: Sites a status lists, most queued and in flight first; the others are only counted.
SITES_LISTED = 20
#: Item collections besides products counted in a status (each is one round trip).
_ITEM_COLLECTIONS = 20
#: Sites read from each index (ready, throttled, lease counts) per status at most.
SITES_SCANNED = 10_000
#: Priorities counted in each listed site's queue (a queue rarely holds more).
BANDS_PER_SITE = 10
#: A site with nothing queued or in flight is listed this long after its last lease.
IDLE_LISTED_SECONDS = 60.0


def _text(value: bytes | str) -> str:
    # surrogateescape: a site name that is not UTF-8 goes back to Redis unchanged
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    """A count from a record anyone with Redis access may have written (0 if it is none)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return int(number) if math.isfinite(number) else 0


def _float(value: Any, default: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if math.isfinite(number) else default


def priority_bands(
    client: redis.Redis, queues: Sequence[bytes | str], limit: int = BANDS_PER_SITE
) -> list[dict[int, int]]:
    """Queued requests per priority of each queue, highest first, at most *limit* each.

    The queues advance together, one band each per pipelined round trip: at most
    ``limit + 1`` round trips, however many queues.
    """
    bands: list[dict[int, int]] = [{} for _ in queues]
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zrange(queue, 0, 0, withscores=True)
    heads = {i: float(head[0][1]) for i, head in enumerate(pipe.execute()) if head}
    while heads:
        pipe = client.pipeline(transaction=False)
        counted: list[tuple[int, int, bool]] = []
        for i, head in heads.items():
            priority = -math.floor(head / PRIORITY_BAND)
            start = -priority * PRIORITY_BAND
            pipe.zcount(queues[i], start, f"({start + PRIORITY_BAND}")
            more = len(bands[i]) + 1 < limit
            if more:
                pipe.zrangebyscore(
                    queues[i], start + PRIORITY_BAND, "+inf", start=0, num=1, withscores=True
                )
            counted.append((i, priority, more))
        replies = iter(pipe.execute())
        heads = {}
        for i, priority, more in counted:
            bands[i][priority] = int(next(replies))
            following = next(replies) if more else None
            if following:
                heads[i] = float(following[0][1])
    return bands


def _bytes_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _site_bands(
    client: redis.Redis, keys: FrontierKeys, rows: list[dict[str, Any]]
) -> list[dict[int, int]]:
    """Queued requests per priority of each row's site, highest first (BANDS_PER_SITE)."""
    sites = [row["site"].encode("utf-8", "surrogateescape") for row in rows]
    queues = read_site_queues(client, keys, sites, most=BANDS_PER_SITE - 1)
    older = [_bytes_key(keys.older_site_queue("")) + q.site for q in queues if OLDER in q.sizes]
    older_bands = iter(priority_bands(client, older) if older else [])
    found: list[dict[int, int]] = []
    for queue in queues:
        bands: dict[int, int] = {}
        for member, head in queue.heads:
            if member == OLDER:
                for priority, n in next(older_bands).items():
                    bands[priority] = bands.get(priority, 0) + n
            else:
                priority = -math.floor(head / PRIORITY_BAND)
                bands[priority] = bands.get(priority, 0) + queue.sizes[member]
        found.append(dict(sorted(bands.items(), reverse=True)[:BANDS_PER_SITE]))
    return found


def _in_flight(members: Sequence[bytes]) -> tuple[dict[str, int], dict[bytes, int]]:
    """Leases by node and by site, from in-flight members ``<node>\\nR<site>\\n<payload>``."""
    by_node: dict[str, int] = {}
    by_site: dict[bytes, int] = {}
    for member in members:
        node, _, rest = member.partition(b"\n")
        name = node.decode("utf-8", "replace")
        by_node[name] = by_node.get(name, 0) + 1
        if rest.startswith(b"R"):
            site = rest[1:].partition(b"\n")[0]
            by_site[site] = by_site.get(site, 0) + 1
    return by_node, by_site


def _site_limits(
    limit: bytes | None, adaptive: bytes | None, default: tuple[float, int]
) -> tuple[float, int]:
    """(rate, concurrency) of a site: its fleet-wide cap, lowered by its adaptive rate."""
    rate, concurrency = default
    fields = limit.split() if limit else []
    if len(fields) == 2:
        given_rate, given_concurrency = _float(fields[0], -1.0), _float(fields[1], -1.0)
        if given_rate >= 0 and given_concurrency >= 0:  # else not "rate concurrency": ignored
            rate, concurrency = given_rate, int(given_concurrency)
    if adaptive is not None:
        learned = _float(adaptive, -1.0)
        if learned >= 0 and (rate <= 0 or learned < rate):
            rate = learned
    return rate, concurrency


#: TIME of the server that holds the spider's keys: on a Redis Cluster a keyless TIME would
#: go to any node (and redis-py refuses it in a cluster's pipeline).
_TIME = "return redis.call('TIME')"


def _server_time(pipe: Any, keys: FrontierKeys) -> None:
    pipe.execute_command("EVAL", _TIME, 1, keys.queue)


def _seen_fill(conf: bytes | None, seen: int) -> float | None:
    """The share of its expected count a Bloom seen-set holds (None for the other forms)."""
    try:
        form = json.loads(conf) if conf else None
        if isinstance(form, dict) and form.get("mode") == "bloom":
            return round(seen / bloom_expected(form), 4)
    except (ValueError, KeyError, TypeError):
        pass
    return None


def frontier_snapshot(
    client: redis.Redis,
    keys: FrontierKeys,
    *,
    sites: int = SITES_LISTED,
    previous_leases: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Sizes of every frontier structure of one spider, and its busiest *sites*.

    A site is listed while it has requests queued or in flight, or was leased in
    the last ``IDLE_LISTED_SECONDS`` (``<prefix>:recent``, or *previous_leases*,
    the lease counts a reader saw last time); the rest are
    counted in ``site_count``. The number of round trips does not grow with the
    number of sites: two pipelines, two for the listed sites' priorities (and one more
    for the sizes of sites still in the older layout, one per priority band of theirs).
    """
    pipe = client.pipeline(transaction=False)
    _server_time(pipe, keys)
    pipe.get(keys.queued)
    pipe.zcard(keys.delayed)
    pipe.zrange(keys.inflight, 0, -1)
    pipe.scard(keys.dupefilter)
    pipe.memory_usage(keys.dupefilter)
    seeds = lua.load("seed_count")
    # EVAL as a plain command: a cluster's pipeline has no eval() (redis-py 8)
    pipe.execute_command("EVAL", seeds.source, 1, *seeds.keys_from(keys))  # type: ignore[no-untyped-call]
    pipe.llen(keys.dead)
    pipe.zrange(keys.queue, 0, SITES_SCANNED - 1)
    pipe.zcard(keys.queue)
    pipe.zrange(keys.throttled, 0, SITES_SCANNED - 1, withscores=True)
    pipe.zcard(keys.throttled)
    pipe.hlen(keys.leases)
    pipe.zrevrange(keys.recent, 0, SITES_SCANNED - 1, withscores=True)
    pipe.hget(keys.limits, "*")
    # the compact forms of the seen-set count what they hold (lua/lib/seen.lua)
    pipe.get(keys.dupefilter + ":n")
    pipe.get(keys.dupefilter + ":conf")
    # revisit records (lua/step/revisit.lua): how many, of how many sites, due by now
    pipe.hlen(keys.revisit)
    pipe.hlen(keys.revisit_sites)
    due = lua.load("revisits_due")
    pipe.execute_command("EVAL", due.source, 1, *due.keys_from(keys))  # type: ignore[no-untyped-call]
    replies: list[Any] = pipe.execute()
    (seconds, micros), queued, delayed, inflight, seen, seen_bytes, seeds, dead = replies[:8]
    ready, n_ready, throttled, n_throttled, n_known, recent, fleet_default = replies[8:15]
    seen = int(seen) or int(replies[15] or 0)
    now_ms = int(seconds) * 1000 + int(micros) / 1000
    by_node, in_flight = _in_flight(inflight)
    rows, with_work, slots = _site_rows(
        client,
        keys,
        now_ms=now_ms,
        ready=ready,
        throttled=dict(throttled),
        in_flight=in_flight,
        last_leased=dict(recent),
        default=_site_limits(fleet_default, None, (0.0, 0)),
        limit=sites,
        previous=previous_leases or {},
    )
    with_work += max(0, int(n_ready) - len(ready)) + max(0, int(n_throttled) - len(throttled))
    # what the fleet can run at once at the sites with work (project/monitoring/scale.py)
    slots.beyond = max(0, int(n_ready) - len(ready))
    bands: dict[int, int] = {}
    for row, site_bands in zip(rows, _site_bands(client, keys, rows), strict=True):
        row["queued_by_priority"] = site_bands
        for priority, count in site_bands.items():
            bands[priority] = bands.get(priority, 0) + count
    return {
        "spider": keys.spider,
        "queued": int(queued or 0),
        "queued_by_priority": dict(sorted(bands.items(), reverse=True)),
        "sites": rows,
        "site_count": {"with_work": with_work, "listed": len(rows), "known": int(n_known)},
        "delayed_retries": int(delayed),
        "in_flight": len(inflight),
        "in_flight_by_node": by_node,
        "seen": int(seen),
        "seen_bytes": int(seen_bytes or 0),
        "seen_fill": _seen_fill(replies[16], int(seen)),
        "revisits": {
            "records": int(replies[17]),
            "sites": int(replies[18]),
            "due": int(replies[19]),
        },
        "seeds_waiting": int(seeds),
        "dead_letters": int(dead),
        "scale": slots,
    }


def _site_rows(
    client: redis.Redis,
    keys: FrontierKeys,
    *,
    now_ms: float,
    ready: list[bytes],
    throttled: dict[bytes, float],
    in_flight: dict[bytes, int],
    last_leased: dict[bytes, float],
    default: tuple[float, int],
    limit: int,
    previous: Mapping[str, int],
) -> tuple[list[dict[str, Any]], int, SiteSlots]:
    """The *limit* busiest sites as rows, how many sites have work, and what the fleet can
    run at once at them (one round trip)."""
    busy = list(dict.fromkeys([*ready, *throttled, *in_flight]))
    was_listed = [site.encode("utf-8", "surrogateescape") for site in previous]
    busy_set = set(busy)
    idle = [s for s in dict.fromkeys([*last_leased, *was_listed]) if s not in busy_set]
    every = busy + idle
    slots = SiteSlots()
    if not every:
        return [], 0, slots
    pipe = client.pipeline(transaction=False)
    for hash_key in (keys.leases, keys.limits, keys.rates):
        pipe.hmget(hash_key, every)
    if busy:
        for hash_key in (keys.site_counts, keys.lat_sum, keys.lat_n):
            pipe.hmget(hash_key, busy)
    replies: list[Any] = pipe.execute()
    leases, limits, rates = (dict(zip(every, reply, strict=True)) for reply in replies[:3])
    counts, lat_sum, lat_n = replies[3:6] if busy else ([], [], [])
    busy_leases = [leases[site] for site in busy]
    sizes = dict(zip(busy, site_queue_sizes(client, keys, busy, counts, busy_leases), strict=True))
    for site, total, samples in zip(busy, lat_sum, lat_n, strict=True):
        rate, concurrency = _site_limits(limits.get(site), rates.get(site), default)
        wake = throttled.get(site)
        n = _float(samples)
        slots.add(
            work=sizes[site] + in_flight.get(site, 0),
            concurrency=concurrency,
            rate=rate,
            latency=_float(total) / n if n > 0 else None,
            # a site waiting for its rate's next token is not paused (a block, a Retry-After)
            paused=wake is not None and wake > now_ms + 1000 + (1000 / rate if rate > 0 else 0),
        )
    since_ms = now_ms - IDLE_LISTED_SECONDS * 1000

    def recent(site: bytes) -> bool:
        before = previous.get(_text(site))
        changed = before is not None and before != _int(leases.get(site))
        return last_leased.get(site, 0.0) >= since_ms or changed

    shown = sorted(busy, key=lambda s: (-(sizes[s] + in_flight.get(s, 0)), s))
    shown += sorted((s for s in idle if recent(s)), key=lambda s: s)
    rows = []
    for site in shown[:limit]:
        rate, concurrency = _site_limits(limits.get(site), rates.get(site), default)
        wake = throttled.get(site)
        queued, leased = sizes.get(site, 0), in_flight.get(site, 0)
        state = "ready" if queued else "draining" if leased else "idle"
        if wake is not None:
            state = "paused" if wake > now_ms + 1000 else "throttled"
        rows.append(
            {
                "site": _text(site),
                "state": state,
                "queued": queued,
                "in_flight": leased,
                "leases": _int(leases.get(site)),
                "allowed_rate": rate,
                "concurrency": concurrency,
            }
        )
    return rows, len(busy), slots


def site_table(
    client: redis.Redis, keys: FrontierKeys, *, limit: int = SITES_LISTED
) -> list[dict[str, Any]]:
    """The busiest sites: queued, in flight, leases granted, fleet-wide rate cap and state."""
    rows: list[dict[str, Any]] = frontier_snapshot(client, keys, sites=limit)["sites"]
    return rows


def outbox_status(client: redis.Redis, key: str) -> dict[str, Any]:
    """What waits for MongoDB in the fleet's outbox (project/storage/outbox.py)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.llen(key)
        pipe.get(f"{key}:bytes")
        pipe.llen(f"{key}:malformed")
        records, size, malformed = pipe.execute()
    return {"key": key, "records": int(records), "bytes": _int(size), "malformed": int(malformed)}


async def mongo_counts(
    client: AsyncMongoClient[dict[str, Any]], config: MongoConfig, where: str = "MongoDB"
) -> dict[str, Any]:
    """Documents in the products, rejects and failures collections, and in the collections of
    other item types (MONGO_COLLECTIONS; at most ``_ITEM_COLLECTIONS``), from the server's
    metadata: no scan (project/storage/counts.py)."""
    from pymongo.errors import PyMongoError

    from project.storage.counts import count_of_async

    db = client[config.database]
    collections = {
        "products": config.products_collection,
        "rejects": config.rejects_collection,
        "failures": config.failures_collection,
    }
    try:
        others = sorted(
            name
            for name in await db.list_collection_names()
            if name not in collections.values() and not name.startswith("system.")
        )
        collections |= {name: name for name in others[:_ITEM_COLLECTIONS]}
        return {shown: await count_of_async(db[name]) for shown, name in collections.items()}
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
    reasons = record.get("retry_reasons")
    backlog = record.get("journal_backlog")
    reason = record.get("finish_reason")
    return {
        "id": str(record.get("id", "")),
        "host": str(record.get("host", "")),
        "pid": _int(record.get("pid")) or None,
        "state": state,
        "finish_reason": None if reason is None else str(reason),
        "started": _float(record.get("started")) or None,
        "last_seen": _float(record.get("last_seen")) or None,
        "age_seconds": max(0.0, now - _float(record.get("last_seen"), now)),
        "pages": _int(record.get("pages")),
        "items": _int(record.get("items")),
        "pages_per_min": _float(record.get("pages_per_min")) if alive else 0.0,
        "items_per_min": _float(record.get("items_per_min")) if alive else 0.0,
        "errors": _int(record.get("errors")),
        "download_errors": _int(record.get("download_errors")),
        "retries": _int(record.get("retries")),
        "dead_letters": _int(record.get("dead_letters")),
        "seeds_rejected": _int(record.get("seeds_rejected")),
        "retry_reasons": (
            {str(k): _int(v) for k, v in reasons.items()} if isinstance(reasons, dict) else {}
        ),
        "blocks": _blocks_of(record.get("blocks")),
        "in_flight": in_flight,
        "held_leases": _int(record.get("in_flight")),
        "rss_bytes": _int(record.get("rss_bytes")),
        "children_rss_bytes": _int(record.get("children_rss_bytes")),
        "journal_backlog": None if backlog is None else _int(backlog),
        "mongo_errors": _int(record.get("mongo_errors")),
        "mongo_last_error": _text(record["mongo_last_error"])
        if record.get("mongo_last_error")
        else None,
        "journal_errors": _int(record.get("journal_errors")),
        "store_waiting": _int(record.get("store_waiting")),
        "store_behind": bool(record.get("store_behind")) and alive,
        "concurrency": _int(record.get("concurrency")),
    }


def _blocks_of(value: Any) -> dict[str, tuple[int, int]]:
    """A heartbeat's ``blocks``: site -> (answers looked at, blocks); anything else: none."""
    if not isinstance(value, dict):
        return {}
    found = {}
    for site, pair in list(value.items())[:100]:
        if isinstance(pair, list) and len(pair) == 2:
            found[_text(str(site))[:300]] = (_int(pair[0]), _int(pair[1]))
    return found


def blocking_view(
    nodes: Sequence[dict[str, Any]], sites: list[dict[str, Any]], proxies: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per site: answers looked at and blocked (the nodes' heartbeats), the block rate, the
    sessions alive and the tier in use (Redis); per proxy, its health and requests."""
    rows: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for site, (checked, blocked) in node.get("blocks", {}).items():
            row = rows.setdefault(site, {"site": site, "responses": 0, "blocks": 0})
            row["responses"] += checked
            row["blocks"] += blocked
    for fleet_row in sites:
        row = rows.setdefault(
            fleet_row["site"], {"site": fleet_row["site"], "responses": 0, "blocks": 0}
        )
        row.update(sessions=fleet_row["sessions"], tier=fleet_row["tier"],
                   cooling=fleet_row["cooling"])  # fmt: skip
    for row in rows.values():
        row["block_rate"] = row["blocks"] / row["responses"] if row["responses"] else 0.0
        row.setdefault("sessions", 0)
        row.setdefault("tier", None)
        row.setdefault("cooling", [])
    shown = sorted(rows.values(), key=lambda r: (-r["blocks"], r["site"]))
    return {"sites": [r for r in shown if r["blocks"] or r["sessions"]], "proxies": proxies}


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
        when = _float(record.get("time"))
        if when >= group["last_time"]:
            group["last_time"] = when
            group["last_url"] = str(record.get("url", ""))[:300]
            group["node"] = None if record.get("node") is None else str(record.get("node"))
    return sorted(groups.values(), key=lambda g: (-g["count"], g["error"]))


#: What a dead letter shows instead of a credential it carried.
REDACTED = "[redacted]"
_SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
# The same headers inside text that is not (or no longer, once cut) valid JSON.
_SECRET_IN_TEXT = re.compile(
    r'(?i)("(?:' + "|".join(sorted(_SECRET_HEADERS)) + r')"\s*:\s*)'
    r'(\[(?:[^\]"\\]|"(?:[^"\\]|\\.)*"?)*\]?|"(?:[^"\\]|\\.)*"?)'
)


def _redact_headers(headers: Any) -> Any:
    if isinstance(headers, dict):
        return {
            name: (
                ([REDACTED] if isinstance(value, list) else REDACTED)
                if str(name).lower() in _SECRET_HEADERS
                else value
            )
            for name, value in headers.items()
        }
    return headers


def _redact_request(doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(doc)
    if "headers" in doc:
        doc["headers"] = _redact_headers(doc["headers"])
    if isinstance(doc.get("url"), str):
        doc["url"] = mask_url(doc["url"])
    meta = doc.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("proxy"), str):
        doc["meta"] = {**meta, "proxy": mask_url(meta["proxy"])}
    return doc


def _redact_text(text: str) -> str:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        redacted = _redact_request(doc)
        if redacted != doc:
            return json.dumps(redacted, separators=(",", ":"), ensure_ascii=False)
        return text
    return mask_url(_SECRET_IN_TEXT.sub(rf'\1"{REDACTED}"', text))


def redact_dead_letter(record: dict[str, Any]) -> dict[str, Any]:
    """*record* as shown to people: no ``Cookie``, ``Authorization`` or
    ``Proxy-Authorization`` header values, no passwords in URLs."""
    shown = dict(record)
    for field in ("request", "url"):
        value = shown.get(field)
        if isinstance(value, str):
            shown[field] = _redact_text(value)
        elif isinstance(value, dict):
            shown[field] = _redact_request(value)
    return shown


def read_dead_letters(
    client: redis.Redis, keys: FrontierKeys, limit: int = 100
) -> list[dict[str, Any]]:
    """The newest dead letters, decoded and redacted."""
    return [redact_dead_letter(record) for record in dead_letters(client, keys, limit)]


def _pending(sample: dict[str, Any]) -> int:
    return sum(int(sample.get(k, 0)) for k in ("queued", "delayed", "in_flight", "seeds"))


def history(
    client: redis.Redis, keys: FrontierKeys, since: str | None = None, count: int = 5000
) -> list[dict[str, Any]]:
    """Fleet samples after stream id *since*, oldest first, each with ``id`` and ``t``."""
    start = f"({since}" if since else "-"
    entries: list[tuple[bytes, dict[bytes, bytes]]]
    entries = client.xrange(keys.history, start, "+", count=count)  # type: ignore[assignment]
    return [s for s in (_sample(entry_id, fields) for entry_id, fields in entries) if s]


def _sample(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any] | None:
    try:
        sample = json.loads(fields[b"s"])
    except (KeyError, ValueError, RecursionError):
        return None  # not written by a node: skipped, not fatal to every reader
    if not isinstance(sample, dict):
        return None
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
    sites: int = SITES_LISTED,
    previous_leases: Mapping[str, int] | None = None,
    tiers: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Everything status, watch, the dashboard and /metrics show, in one dict (*tiers*: proxy
    id -> tier of PROXY_POOL, for the tier each site is in).

    The frontier snapshot (see :func:`frontier_snapshot` for *sites* and
    *previous_leases*), the nodes (alive, dead or finished), fleet totals and
    rates, progress with an ETA from the drain rate of the last *eta_window*
    seconds of history, and dead letters by error (redacted).
    """
    status = frontier_snapshot(client, keys, sites=sites, previous_leases=previous_leases)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.nodes)
    pipe.zrange(keys.alive, 0, -1, withscores=True)
    _server_time(pipe, keys)
    pipe.lrange(keys.dead, 0, 199)
    queue_reads(pipe, keys)
    pipe.hgetall(keys.render)
    raw_nodes, expiries, (seconds, micros), dead, raw_pairs, raw_alive, raw_render = pipe.execute()
    server_ms = int(seconds) * 1000 + int(micros) // 1000
    alive = {node.decode("utf-8", "replace") for node, until in expiries if until > server_ms}
    records: dict[str, dict[str, Any]] = {}
    for node_id, raw in raw_nodes.items():
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # not a node's heartbeat: shown by no reader, fatal to none
        if isinstance(record, dict):
            records[node_id.decode("utf-8", "replace")] = record
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
    status["scale"] = scale_view(status["scale"], nodes, status["seeds_waiting"])
    status["time"] = now
    samples = [s for s in (_sample(entry_id, fields) for entry_id, fields in recent) if s]
    drain, eta = drain_eta([(s["t"] / 1000, _pending(s)) for s in samples])
    pending = status["queued"] + status["delayed_retries"] + status["in_flight"]
    pending += status["seeds_waiting"]
    if pending == 0:
        eta = 0.0  # nothing left now, whatever the last samples said (the end is seen at once)
    elif not samples:
        eta = None
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
    status["failures"] = failure_summary(
        [redact_dead_letter(decode_dead_letter(raw)) for raw in dead]
    )
    blocking = BlockingRecords.decode(raw_pairs, raw_alive)
    status["blocking"] = blocking_view(
        nodes,
        session_sites(blocking, server_ms, dict(tiers or {})),
        proxy_table(blocking, server_ms),
    )
    status["rendering"] = render_patterns(raw_render)
    reported = [n["journal_backlog"] for n in nodes if n["journal_backlog"] is not None]
    status["journal_backlog"] = sum(reported) if reported else None
    # Storage faults a node cannot fix by retrying: loud in status, not only in its log.
    status["storage_errors"] = [
        {"node": n["id"], "mongo_errors": n["mongo_errors"], "last_error": n["mongo_last_error"],
         "journal_errors": n["journal_errors"]}
        for n in nodes
        if n["mongo_errors"] or n["journal_errors"]
    ]  # fmt: skip
    return status


#: Render patterns status lists, those with the most outcomes first.
_PATTERNS_SHOWN = 50


def render_patterns(raw: dict[Any, Any]) -> dict[str, Any]:
    """Adaptive rendering's patterns (lua/step/render.lua): how many the fleet keeps, and
    the ones with the most outcomes, each with its mode and its outcomes."""
    patterns = []
    for field, value in raw.items():
        site, _, rest = field.decode("utf-8", "replace").partition("\t")
        template, _, callback = rest.partition("\t")
        try:
            record = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        mode = record.get("mode")
        patterns.append(
            {
                "site": site,
                "template": template,
                "callback": callback,
                "mode": mode if mode in ("learn", "http", "browser") else "learn",
                "agreed": _int(record.get("a")),
                "missed": _int(record.get("m")),
            }
        )
    patterns.sort(key=lambda p: (-(p["agreed"] + p["missed"]), p["site"], p["template"]))
    modes = {
        mode: sum(1 for p in patterns if p["mode"] == mode) for mode in ("learn", "http", "browser")
    }
    return {"count": len(patterns), "modes": modes, "patterns": patterns[:_PATTERNS_SHOWN]}


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
    MongoDB's client is pymongo's asynchronous one, run on the reader's own event loop: the
    blocking client's monitor threads sleep in steps of half a second, and the interpreter
    joins them at exit (0.5 s of a one-shot ``fleetcrawl status``'s 1.3 s).
    """

    def __init__(
        self,
        redis_at: str | RedisTarget,
        keys: FrontierKeys,
        mongo: MongoConfig | None = None,
        *,
        sites: int = SITES_LISTED,
        tiers: Mapping[str, int] | None = None,
    ) -> None:
        """*redis_at*: a Redis URL, or the fleet's :class:`RedisTarget` (a cluster, Sentinel);
        *tiers*: proxy id -> tier of PROXY_POOL."""
        target = RedisTarget(redis_at) if isinstance(redis_at, str) else redis_at
        self.keys = keys
        self.sites = sites
        self.spider = keys.spider
        self.redis_name = target.describe()
        self.redis: redis.Redis = target.sync_client(socket_connect_timeout=5, socket_timeout=10)
        self.mongo = mongo
        self._mongo: AsyncMongoClient[dict[str, Any]] | None = None
        self._runner: asyncio.Runner | None = None
        self._runner_lock = threading.Lock()  # the dashboard reads from worker threads
        self._last_leases: tuple[float, dict[str, int]] | None = None
        self.tiers = dict(tiers or {})

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, spider: str, *, sites: int = SITES_LISTED
    ) -> StatusReader:
        """The reader of *spider*'s keys and collections under these settings."""
        frontier = FrontierConfig.from_settings(settings)
        return cls(
            frontier.target,
            FrontierKeys.for_project_spider(settings, spider),
            MongoConfig.from_settings(settings, spider_name=spider),
            sites=sites,
            tiers=proxy_tiers(settings),
        )

    def read(self) -> dict[str, Any]:
        """:func:`fleet_status` plus MongoDB counts (raises ``RedisError`` if Redis is away)."""
        before = self._last_leases[1] if self._last_leases else None
        status = fleet_status(
            self.redis, self.keys, sites=self.sites, previous_leases=before, tiers=self.tiers
        )
        self._achieved_rates(status.get("sites", []))
        if self.mongo is not None:
            status["outbox"] = outbox_status(
                self.redis, f"{self.keys.outbox}:{self.mongo.database}"
            )
            with self._runner_lock:
                status["mongo"] = self._run(self._mongo_counts(self.mongo))
        return status

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coroutine)

    async def _mongo_counts(self, mongo: MongoConfig) -> dict[str, Any]:
        where = f"MongoDB at {mask_url(mongo.uri)}"
        if self._mongo is None:
            # imported late: the failures command needs no MongoDB client
            from pymongo import AsyncMongoClient
            from pymongo.errors import PyMongoError

            try:
                # a server that accepts and never answers must not hold the reader's lock
                self._mongo = AsyncMongoClient(
                    mongo.uri, serverSelectionTimeoutMS=3000, timeoutMS=10_000
                )
            except PyMongoError as exc:  # a malformed MONGO_URI: the status still shows
                reason = str(exc).replace(mongo.uri, mask_url(mongo.uri))
                return {"error": f"{where}: MONGO_URI is not usable: {reason}"}
        return await mongo_counts(self._mongo, mongo, where)

    def _achieved_rates(self, sites: list[dict[str, Any]]) -> None:
        """Leases per second of each site since the previous read (None on the first)."""
        now = time.monotonic()
        leases = {site["site"]: int(site["leases"]) for site in sites}
        for site in sites:
            site["achieved_rate"] = None
            if self._last_leases is not None:
                then, before = self._last_leases
                count = leases[site["site"]]
                last = before.get(site["site"], count)
                # A count below the last one was forgotten by the frontier and began again at 0.
                granted = count - last if count >= last else count
                site["achieved_rate"] = granted / max(now - then, 1e-6)
        self._last_leases = (now, leases)

    def history(self, since: str | None = None) -> list[dict[str, Any]]:
        """Fleet samples after stream id *since* (all of the last hour without it)."""
        return history(self.redis, self.keys, since)

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest dead letters, redacted."""
        return read_dead_letters(self.redis, self.keys, limit)

    def close(self) -> None:
        """Close both clients."""
        self.redis.close()
        with self._runner_lock:
            try:
                if self._mongo is not None:
                    self._run(self._mongo.close())
            finally:
                self._mongo = None
                if self._runner is not None:
                    self._runner.close()
                    self._runner = None
