"""What ``fleetcrawl status``, the dashboard and ``fleetcrawl proxies`` read of the fleet's
sessions and proxies in Redis (lua/step/sessions.lua writes them), and the reset of a
proxy's record."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

    from project.frontier.keys import FrontierKeys

__all__ = ["proxy_table", "reset_proxies", "session_sites"]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _pairs(client: redis.Redis, keys: FrontierKeys) -> list[tuple[str, str, dict[str, Any]]]:
    """Every (proxy, site, record) the fleet keeps."""
    sites = [_text(s) for s in client.smembers(f"{keys.proxies}:sites")]
    pipe = client.pipeline(transaction=False)
    for site in sites:
        pipe.smembers(f"{keys.proxies}|{site}")
    proxies_of = dict(zip(sites, pipe.execute(), strict=True))
    fields = [(_text(p), site) for site in sites for p in proxies_of[site]]
    if not fields:
        return []
    raw = client.hmget(keys.proxies, [f"{p}\n{site}" for p, site in fields])
    found = []
    for (proxy, site), record in zip(fields, raw, strict=True):
        try:
            value = json.loads(record) if record else None
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append((proxy, site, value))
    return found


def session_sites(
    client: redis.Redis, keys: FrontierKeys, now_ms: float, tiers: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """Per site with sessions or proxy records: sessions alive, answers through proxies and
    the share blocked, the proxies cooling down, and the tier in use (the lowest with a proxy
    not cooling down; *tiers*: proxy id -> tier, from PROXY_POOL)."""
    by_site: dict[str, dict[str, Any]] = {}
    for proxy, site, pair in _pairs(client, keys):
        row = by_site.setdefault(site, {"site": site, "ok": 0, "blocked": 0, "cooling": []})
        row["ok"] += int(pair.get("ok") or 0)
        row["blocked"] += int(pair.get("bl") or 0)
        if float(pair.get("untl") or 0) > now_ms:
            row["cooling"].append(proxy)
    versions = client.hkeys(f"{keys.sessions}:v")
    for site in (_text(s) for s in versions):
        by_site.setdefault(site, {"site": site, "ok": 0, "blocked": 0, "cooling": []})
    names = sorted(by_site)
    pipe = client.pipeline(transaction=False)
    for site in names:
        pipe.scard(f"{keys.sessions}|{site}")
    for site, alive in zip(names, pipe.execute(), strict=True):
        row = by_site[site]
        row["sessions"] = int(alive)
        answers = row["ok"] + row["blocked"]
        row["block_rate"] = row["blocked"] / answers if answers else 0.0
        row["cooling"].sort()
        row["tier"] = None
        if tiers:
            ready = [t for p, t in tiers.items() if p not in row["cooling"]]
            row["tier"] = min(ready) if ready else None
    return [by_site[site] for site in names]


def proxy_table(client: redis.Redis, keys: FrontierKeys, now_ms: float) -> list[dict[str, Any]]:
    """Per proxy: answers and blocks through it, its bans, and the sites it cools down for
    (with the seconds left)."""
    by_proxy: dict[str, dict[str, Any]] = {}
    for proxy, site, pair in _pairs(client, keys):
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
    for name, where, _ in _pairs(client, keys):
        if (proxy is None or name == proxy) and (site is None or where == site):
            gone += int(client.hdel(keys.proxies, f"{name}\n{where}"))
            client.srem(f"{keys.proxies}|{where}", name)
            client.hincrby(f"{keys.sessions}:v", where, 1)  # the nodes hear of it
    return gone
