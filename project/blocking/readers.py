"""What ``fleetcrawl status``, the dashboard and ``fleetcrawl proxies`` read of the fleet's
sessions and proxies in Redis (lua/step/sessions.lua writes them), and the reset of a
proxy's record.

The reads are two commands queued on the caller's pipeline (:func:`queue_reads`), so status
pays no round trip of its own for them, however many sites and proxies the fleet knows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

    from project.frontier.keys import FrontierKeys

__all__ = [
    "BlockingRecords",
    "proxy_table",
    "queue_reads",
    "read_records",
    "reset_proxies",
    "session_sites",
]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class BlockingRecords:
    """The fleet's (proxy, site, record) triples and its sessions alive per site."""

    pairs: list[tuple[str, str, dict[str, Any]]]
    alive: dict[str, int]

    @classmethod
    def decode(cls, raw_pairs: dict[Any, Any], raw_alive: dict[Any, Any]) -> BlockingRecords:
        """From the replies of :func:`queue_reads`; a record that is not one is skipped."""
        pairs = []
        for field, record in raw_pairs.items():
            proxy, sep, site = _text(field).rpartition("\n")
            try:
                value = json.loads(record)
            except (ValueError, RecursionError):
                continue
            if sep and isinstance(value, dict):
                pairs.append((proxy, site, value))
        alive = {}
        for site, count in raw_alive.items():
            try:
                alive[_text(site)] = int(count)
            except ValueError:
                continue
        return cls(pairs, alive)


def queue_reads(pipe: Pipeline, keys: FrontierKeys) -> None:
    """Queue the two reads :meth:`BlockingRecords.decode` takes the replies of."""
    pipe.hgetall(keys.proxies)
    pipe.hgetall(f"{keys.sessions}:n")


def read_records(client: redis.Redis, keys: FrontierKeys) -> BlockingRecords:
    """The fleet's records, in one round trip."""
    pipe = client.pipeline(transaction=False)
    queue_reads(pipe, keys)
    raw_pairs, raw_alive = pipe.execute()
    return BlockingRecords.decode(raw_pairs, raw_alive)


def session_sites(
    records: BlockingRecords, now_ms: float, tiers: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """Per site with sessions or proxy records: sessions alive, answers through proxies and
    the share blocked, the proxies cooling down, and the tier in use (the lowest with a proxy
    not cooling down; *tiers*: proxy id -> tier, from PROXY_POOL)."""
    by_site: dict[str, dict[str, Any]] = {}
    for proxy, site, pair in records.pairs:
        row = by_site.setdefault(site, {"site": site, "ok": 0, "blocked": 0, "cooling": []})
        row["ok"] += int(pair.get("ok") or 0)
        row["blocked"] += int(pair.get("bl") or 0)
        if float(pair.get("untl") or 0) > now_ms:
            row["cooling"].append(proxy)
    for site in records.alive:
        by_site.setdefault(site, {"site": site, "ok": 0, "blocked": 0, "cooling": []})
    for site, row in by_site.items():
        row["sessions"] = records.alive.get(site, 0)
        answers = row["ok"] + row["blocked"]
        row["block_rate"] = row["blocked"] / answers if answers else 0.0
        row["cooling"].sort()
        row["tier"] = None
        if tiers:
            ready = [t for p, t in tiers.items() if p not in row["cooling"]]
            row["tier"] = min(ready) if ready else None
    return [by_site[site] for site in sorted(by_site)]


def proxy_table(records: BlockingRecords, now_ms: float) -> list[dict[str, Any]]:
    """Per proxy: answers and blocks through it, its bans, and the sites it cools down for
    (with the seconds left)."""
    by_proxy: dict[str, dict[str, Any]] = {}
    for proxy, site, pair in records.pairs:
        row = by_proxy.setdefault(
            proxy or "direct",
            {"proxy": proxy or "direct", "ok": 0, "blocked": 0, "bans": 0, "cooling": {}},
        )
        row["ok"] += int(pair.get("ok") or 0)
        row["blocked"] += int(pair.get("bl") or 0)
        row["bans"] += int(pair.get("n") or 0)
        until = float(pair.get("untl") or 0)
        if until > now_ms:
            row["cooling"][site] = round((until - now_ms) / 1000)
    for row in by_proxy.values():
        answers = row["ok"] + row["blocked"]
        row["requests"] = answers
        row["health"] = row["ok"] / answers if answers else None
    return sorted(by_proxy.values(), key=lambda r: r["proxy"])


def reset_proxies(
    client: redis.Redis, keys: FrontierKeys, proxy: str | None = None, site: str | None = None
) -> int:
    """Forget the fleet's records of *proxy* (all: None) for *site* (all: None): their bans
    and cool-downs end at once. Returns how many (proxy, site) records went."""
    gone = 0
    for name, where, _ in read_records(client, keys).pairs:
        if (proxy is None or name == proxy) and (site is None or where == site):
            gone += int(client.hdel(keys.proxies, f"{name}\n{where}"))
            client.srem(f"{keys.proxies}|{where}", name)
            client.hincrby(f"{keys.sessions}:v", where, 1)  # the nodes hear of it
    return gone
