"""Writes an operator makes to one spider's frontier: clear it, retry or purge dead letters."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from project.frontier import lua
from project.frontier.sites import site_of

if TYPE_CHECKING:
    import redis

    from project.frontier.keys import FrontierKeys

__all__ = ["clear_frontier", "dead_letters", "purge_dead_letters", "retry_dead_letters"]

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def clear_frontier(client: redis.Redis, keys: FrontierKeys) -> int:
    """Delete the spider's frontier: site queues, seen-set, seeds, leases, limits, dead letters.

    Node records, history and the robots.txt cache stay. Returns the keys deleted.
    """
    pattern = _GLOB_SPECIAL.sub(r"\\\1", keys.site_queue("")) + "*"
    site_queues = list(client.scan_iter(match=pattern, count=1000))
    doomed = [*site_queues, *keys.frontier()]
    deleted = 0
    for start in range(0, len(doomed), 1000):
        deleted += int(client.delete(*doomed[start : start + 1000]))
    return deleted


def dead_letters(client: redis.Redis, keys: FrontierKeys, limit: int = 100) -> list[dict[str, Any]]:
    """The newest dead letters, decoded."""
    raw: Any = client.lrange(keys.dead, 0, limit - 1)
    return [json.loads(item) for item in raw]


def retry_dead_letters(client: redis.Redis, keys: FrontierKeys) -> tuple[int, int]:
    """Put dead-lettered requests back in their sites' queues with fresh attempts.

    Returns (requeued, skipped): seeds that failed validation have no request
    to retry and stay dead-lettered. One atomic script (lua/requeue_dead.lua);
    a record another client retried meanwhile is not queued twice.
    """
    script = lua.load("requeue_dead")
    triples: list[Any] = []
    skipped = 0
    raw_records: Any = client.lrange(keys.dead, 0, -1)
    for raw in raw_records:
        record = json.loads(raw)
        if not record.get("request"):
            skipped += 1
            continue
        payload = json.loads(record["request"])
        payload.get("meta", {}).pop("retry_times", None)
        site = record.get("site") or site_of(str(payload.get("url", "")))
        encoded = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        triples += (raw, site, encoded)
    if not triples:
        return 0, skipped
    requeued = client.register_script(script.source)(keys=script.keys_from(keys), args=triples)
    return int(requeued), skipped


def purge_dead_letters(client: redis.Redis, keys: FrontierKeys) -> int:
    """Delete every dead letter; returns how many there were."""
    with client.pipeline() as pipe:
        pipe.llen(keys.dead)
        pipe.delete(keys.dead)
        count, _ = pipe.execute()
    return int(count)
