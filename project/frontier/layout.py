"""The frontier's data layout in Redis, and the upgrade of one an older fleetcrawl wrote.

Layout 2 carries a request's site in its in-flight member (``<node>\\nR<site>\\n<payload>``)
and in its delayed member (``<site>\\n<payload>``); layout 1 left it out and parsed it
from the payload. Layout 3 records when each site was last leased (``<prefix>:recent``),
so the counters of idle sites can be forgotten. Layout 4 counts download permits in
``<prefix>:active`` (lib/permits.lua), where layout 3 counted leases: the old counts go.
Layout 5 counts the requests each site has had queued (``<queue>|n``) where layout 4 counted
those still queued: a site's queue is that count less its leases (``<prefix>:leases``), so a
pop counts nothing more; the upgrade adds each site's leases to its count, and a site of the
sorted-set layout with leases joins its priority index then (a push no longer tells that it
is the site's first). Layout 6 counts each site's revisit records (``<prefix>:revisit:sites``,
for FRONTIER_REVISIT_MAX_SITE_URLS). The first node of a newer fleetcrawl rewrites the old members once,
under a lock, and records the version in ``<prefix>:layout``; later starts cost one GET.
Stop every node of the older version before starting the new one.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from project.frontier import lua
from project.frontier.sites import site_of

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from project.frontier.keys import FrontierKeys

__all__ = ["LAYOUT_VERSION", "ensure_layout"]

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 6
_LOCK_SECONDS = 120.0  # long enough to rewrite a large delayed set
_SCAN_COUNT = 1000


def _site(payload: bytes) -> bytes:
    """The site a layout-1 payload was queued under (its "site" field in FRONTIER_SITE_KEY=ip mode)."""
    try:
        doc = json.loads(payload)
        site = doc.get("site") or site_of(str(doc.get("url", "")))
    except (ValueError, AttributeError):
        site = "_"
    return str(site).encode("utf-8", "surrogateescape")


def _upgraded_inflight(member: bytes) -> bytes | None:
    node, sep, body = member.partition(b"\n")
    if not sep or not body.startswith(b"R{"):
        return None  # a seed, or already layout 2
    payload = body[1:]
    return node + b"\nR" + _site(payload) + b"\n" + payload


def _upgraded_delayed(member: bytes) -> bytes | None:
    if not member.startswith(b"{"):
        return None
    return _site(member) + b"\n" + member


async def _rewrite(server: Redis, key: str, upgrade: Any) -> int:
    rewritten = 0
    async for member, score in server.zscan_iter(key, count=_SCAN_COUNT):
        new = upgrade(member)
        if new is None:
            continue
        async with server.pipeline(transaction=True) as pipe:
            pipe.zrem(key, member)
            pipe.zadd(key, {new: score})
            await pipe.execute()
        rewritten += 1
    return rewritten


async def _date_sites(server: Redis, keys: FrontierKeys) -> None:
    """Layout 3: every site with counters gets a last-leased time (now, by Redis' clock)."""
    # the clock of the server holding the keys (a keyless TIME goes anywhere on a cluster)
    seconds, micros = await server.eval("return redis.call('TIME')", 1, keys.recent)
    now = int(seconds) * 1000 + int(micros) // 1000
    batch: dict[Any, int] = {}
    async for site, _ in server.hscan_iter(keys.leases, count=_SCAN_COUNT):
        batch[site] = now
        if len(batch) >= _SCAN_COUNT:
            await server.zadd(keys.recent, batch, nx=True)
            batch = {}
    if batch:
        await server.zadd(keys.recent, batch, nx=True)


_ADOPT_OLDER = lua.load("adopt_older")


async def _count_pushed(server: Redis, keys: FrontierKeys) -> None:
    """Layout 5: each site's count of queued requests becomes its count of requests pushed."""
    batch: list[tuple[bytes, int]] = []

    async def flush() -> None:
        async with server.pipeline(transaction=False) as pipe:
            for site, leased in batch:
                pipe.hincrby(keys.site_counts, site, leased)  # type: ignore[arg-type]
            counted = await pipe.execute()
        fresh = [site for (site, leased), n in zip(batch, counted, strict=True) if n == leased]
        for site in fresh:  # a count made just now: maybe a site of the sorted-set layout
            await server.eval(
                _ADOPT_OLDER.source, len(_ADOPT_OLDER.keys), *_ADOPT_OLDER.keys_from(keys), site
            )
        batch.clear()

    async for site, leased in server.hscan_iter(keys.leases, count=_SCAN_COUNT):
        if int(leased) > 0:
            batch.append((site, int(leased)))
        if len(batch) >= _SCAN_COUNT:
            await flush()
    if batch:
        await flush()


async def _count_revisits(server: Redis, keys: FrontierKeys) -> None:
    """Layout 6: the revisit records of each site are counted (FRONTIER_REVISIT_MAX_SITE_URLS)."""
    counts: dict[bytes, int] = {}
    async for _, stored in server.hscan_iter(keys.revisit, count=_SCAN_COUNT):
        parts = stored.split(b"\n", 3)  # interval, run, site, the rest
        if len(parts) == 4:
            counts[parts[2]] = counts.get(parts[2], 0) + 1
    await server.delete(keys.revisit_sites)
    if counts:
        await server.hset(keys.revisit_sites, mapping=counts)  # type: ignore[arg-type]


async def ensure_layout(server: Redis, keys: FrontierKeys) -> int:
    """Bring the spider's frontier to :data:`LAYOUT_VERSION`; returns the members rewritten."""
    current = str(LAYOUT_VERSION).encode()
    if await server.get(keys.layout) == current:
        return 0
    async with server.lock(
        f"{keys.layout}:lock", timeout=_LOCK_SECONDS, blocking_timeout=_LOCK_SECONDS
    ):
        found = await server.get(keys.layout)
        if found == current:
            return 0
        inflight = delayed = 0
        if found is None or int(found) < 2:
            inflight = await _rewrite(server, keys.inflight, _upgraded_inflight)
            delayed = await _rewrite(server, keys.delayed, _upgraded_delayed)
        if found is None or int(found) < 3:
            await _date_sites(server, keys)
        if found is not None and int(found) < 4:
            await server.delete(keys.active)  # leases of the stopped older nodes
        if found is None or int(found) < 5:
            await _count_pushed(server, keys)
        if found is None or int(found) < 6:
            await _count_revisits(server, keys)
        await server.set(keys.layout, current)
    if inflight or delayed:
        logger.warning(
            "Upgraded the frontier of %s to layout %d: %d leases and %d delayed retries"
            " now carry their site",
            keys.spider,
            LAYOUT_VERSION,
            inflight,
            delayed,
        )
    return inflight + delayed
