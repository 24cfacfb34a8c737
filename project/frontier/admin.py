"""Writes an operator makes to one spider's frontier: clear it, retry or purge dead letters."""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any

from redis import exceptions as redis_exceptions

from project.frontier import lua
from project.frontier.site_queues import site_queue_patterns
from project.frontier.sites import site_of

if TYPE_CHECKING:
    import redis

    from project.frontier.keys import FrontierKeys

__all__ = [
    "clear_frontier",
    "dead_letters",
    "decode_dead_letter",
    "purge_dead_letters",
    "retry_dead_letters",
]

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def clear_frontier(client: redis.Redis, keys: FrontierKeys) -> int:
    """Delete the spider's frontier: site queues, seen-set (in any form), revisits, the crawl
    run, seeds, leases, limits, dead letters.

    Node records, history and the robots.txt cache stay. Returns the keys deleted.
    """
    site_queues = [
        key
        for pattern in site_queue_patterns(keys)
        for key in client.scan_iter(match=pattern, count=1000)
    ]
    # the compact seen-set forms (lua/lib/seen.lua): buckets, Bloom parts, their count and form
    seen = list(
        client.scan_iter(match=_GLOB_SPECIAL.sub(r"\\\1", keys.dupefilter) + ":*", count=1000)
    )
    holders: Any = client.zrange(keys.holders, 0, -1)
    permits = [keys.permits_of(node.decode("utf-8", "surrogateescape")) for node in holders]
    runs = [keys.runs + ":members", keys.runs + ":stats", keys.runs + ":seeds"]
    revisits = [keys.revisit_sites, keys.revisit_missed]
    doomed = [*site_queues, *seen, *permits, *runs, *revisits, *keys.frontier()]
    deleted = 0
    for start in range(0, len(doomed), 1000):
        deleted += int(client.delete(*doomed[start : start + 1000]))
    return deleted


def decode_dead_letter(raw: bytes | str) -> dict[str, Any]:
    """One dead-letter record as a dict, whatever bytes the list holds.

    Anyone who can reach Redis can push to the list; a record that is not a
    JSON object becomes a stand-in that says so, instead of an exception in
    every reader (status, the dashboard, ``failures list``).
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        record = None
    if isinstance(record, dict):
        return record
    return {"kind": "unknown", "error": "not a dead-letter record", "url": text[:300]}


def dead_letters(client: redis.Redis, keys: FrontierKeys, limit: int = 100) -> list[dict[str, Any]]:
    """The newest dead letters, decoded."""
    raw: Any = client.lrange(keys.dead, 0, limit - 1)
    return [decode_dead_letter(item) for item in raw]


def retry_dead_letters(
    client: redis.Redis, keys: FrontierKeys, chunk: int = 1000
) -> tuple[int, int]:
    """Put dead-lettered requests back in their sites' queues with fresh attempts.

    Returns (requeued, skipped): seeds that failed validation have no request to
    retry and stay dead-lettered. The dead letters move whole to a work list
    first (RENAME), so two clients never retry one twice, then go back chunk by
    chunk (lua/requeue_dead.lua); a run that is interrupted leaves its work list,
    which the next run finishes first.
    """
    script = lua.load("requeue_dead")
    run = client.register_script(script.source)
    prefix = f"{keys.dead}:requeue:"
    work_lists = [
        key.decode() for key in client.scan_iter(match=_GLOB_SPECIAL.sub(r"\\\1", prefix) + "*")
    ]
    mine = prefix + uuid.uuid4().hex
    try:
        client.rename(keys.dead, mine)
        work_lists.append(mine)
    except redis_exceptions.ResponseError:
        pass  # no dead letters now; maybe an interrupted run's
    requeued = skipped = 0
    for work in work_lists:
        while records := client.lrange(work, 0, chunk - 1):
            pairs: list[Any] = []
            stay: list[Any] = []
            for raw in records:
                item = _requeueable(raw)
                if item is None:
                    stay.append(raw)
                else:
                    pairs += item
            requeued += int(
                run(
                    keys=script.keys_from(keys, work=work),
                    args=[len(records), len(pairs) // 2, *pairs, *stay],
                )
            )
            skipped += len(stay)
        client.delete(work)
    return requeued, skipped


def _requeueable(raw: bytes | str) -> tuple[str, bytes] | None:
    """(site, payload with fresh attempts) of a dead letter, or None when it has no request."""
    try:
        record = json.loads(raw)
        payload = json.loads(record["request"]) if record.get("request") else None
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    meta = payload.get("meta")
    if isinstance(meta, dict):
        meta.pop("retry_times", None)
    site = record.get("site") or site_of(str(payload.get("url", "")))
    return str(site), json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def purge_dead_letters(client: redis.Redis, keys: FrontierKeys) -> int:
    """Delete every dead letter; returns how many there were."""
    with client.pipeline() as pipe:
        pipe.llen(keys.dead)
        pipe.delete(keys.dead)
        count, _ = pipe.execute()
    return int(count)
