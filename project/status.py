"""A snapshot of one spider's crawl: frontier in Redis, results in MongoDB."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from project.queue import FrontierKeys

if TYPE_CHECKING:
    import redis

__all__ = ["PRIORITY_BAND", "frontier_snapshot", "priority_bands"]

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


def frontier_snapshot(client: redis.Redis, spider: str) -> dict[str, Any]:
    """Sizes of every frontier structure of *spider*."""
    keys = FrontierKeys.for_spider(spider)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.queue)
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
        "spider": spider,
        "queued": int(queued),
        "queued_by_priority": priority_bands(client, keys.queue),
        "delayed_retries": int(delayed),
        "in_flight": len(inflight),
        "in_flight_by_node": by_node,
        "seen": int(seen),
        "seen_bytes": int(seen_bytes or 0),
        "seeds_waiting": int(seeds),
        "dead_letters": int(dead),
    }


def dead_letters(client: redis.Redis, spider: str, limit: int = 100) -> list[dict[str, Any]]:
    """The newest dead letters of *spider*, decoded."""
    raw = client.lrange(FrontierKeys.for_spider(spider).dead, 0, limit - 1)
    return [json.loads(item) for item in raw]


def retry_dead_letters(client: redis.Redis, spider: str) -> tuple[int, int]:
    """Put dead-lettered requests back in the queue with fresh attempts.

    Returns (requeued, skipped): seeds that failed validation have no
    request to retry and stay dead-lettered. Atomic: a concurrent change to
    the dead letters aborts it (WatchError) without losing anything.
    """
    keys = FrontierKeys.for_spider(spider)
    with client.pipeline() as pipe:
        pipe.watch(keys.dead)  # type: ignore[no-untyped-call]
        records = pipe.lrange(keys.dead, 0, -1)
        keep, requeue = [], []
        for raw in records:
            record = json.loads(raw)
            if record.get("request"):
                payload = json.loads(record["request"])
                payload.get("meta", {}).pop("retry_times", None)
                requeue.append(payload)
            else:
                keep.append(raw)
        # Sequence numbers are reserved outside the transaction; an unused
        # reservation only leaves a gap.
        last = int(client.incrby(keys.seq, max(1, len(requeue))))
        scored = {
            json.dumps(payload, separators=(",", ":")): -int(payload.get("priority", 0))
            * PRIORITY_BAND
            + last
            - len(requeue)
            + offset
            + 1
            for offset, payload in enumerate(requeue)
        }
        pipe.multi()
        pipe.delete(keys.dead)
        if keep:
            pipe.rpush(keys.dead, *keep)
        if scored:
            pipe.zadd(keys.queue, scored)
        pipe.execute()
    return len(requeue), len(keep)


def purge_dead_letters(client: redis.Redis, spider: str) -> int:
    """Delete every dead letter of *spider*; returns how many there were."""
    keys = FrontierKeys.for_spider(spider)
    with client.pipeline() as pipe:
        pipe.llen(keys.dead)
        pipe.delete(keys.dead)
        count, _ = pipe.execute()
    return int(count)
