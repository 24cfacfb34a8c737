"""fleetcrawl proxies: the fleet's proxies and what each site made of them, and their reset."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from project.ops.common import (
    CommandError,
    frontier_keys,
    project_settings,
    redis_client,
    redis_errors,
    redis_target,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable


__all__ = ["register"]


def _now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _proxies(args: argparse.Namespace) -> int:
    from project.blocking.config import proxy_tiers
    from project.blocking.readers import (
        proxy_table,
        read_records,
        reset_proxies,
        session_sites,
    )
    from project.monitoring.console import printable

    settings = project_settings(args)
    target = redis_target(settings)
    client, keys = redis_client(target), frontier_keys(settings, args.spider)
    with redis_errors(target):
        if args.action == "reset":
            proxy = None if args.proxy in (None, "all") else args.proxy
            if proxy == "direct":
                proxy = ""
            gone = reset_proxies(client, keys, proxy, args.site)
            if not gone and proxy is not None:
                raise CommandError(f"no record of proxy {printable(args.proxy, 200)} to reset")
            print(f"reset {gone} (proxy, site) records: their bans and cool-downs are over")
            return 0
        now = _now_ms(client)
        tiers = proxy_tiers(settings)
        records = read_records(client, keys)
        table = proxy_table(records, now)
        sites = session_sites(records, now, tiers)
    if args.json:
        print(json.dumps({"proxies": table, "sites": sites}, indent=2, sort_keys=True))
        return 0
    known = {row["proxy"] for row in table}
    for proxy in tiers:
        if proxy not in known:
            table.append({"proxy": proxy, "requests": 0, "blocked": 0, "bans": 0,
                          "health": None, "cooling": {}})  # fmt: skip
    print(f"{'proxy':48} {'tier':>4} {'requests':>9} {'blocked':>8} {'health':>7} {'bans':>5}"
          "  cooling down for")  # fmt: skip
    for row in sorted(table, key=lambda r: (tiers.get(r["proxy"], 99), r["proxy"])):
        health = "-" if row["health"] is None else f"{row['health']:.0%}"
        cooling = ", ".join(f"{site} ({s}s)" for site, s in sorted(row["cooling"].items()))
        tier = tiers.get(row["proxy"])
        print(
            f"{printable(row['proxy'], 48):48} {'-' if tier is None else tier:>4}"
            f" {row['requests']:>9} {row['blocked']:>8} {health:>7} {row['bans']:>5}"
            f"  {printable(cooling, 80) or '-'}"
        )
    for site in sites:
        print(
            f"site {printable(site['site'], 60)}: {site['sessions']} sessions alive, blocked"
            f" {site['block_rate']:.0%} of {site['ok'] + site['blocked']} answers, tier"
            f" {'-' if site['tier'] is None else site['tier']}"
        )
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], setting: Callable[[Any], None]
) -> None:
    """Add ``proxies`` to the ``fleetcrawl`` command."""
    proxies = sub.add_parser(
        "proxies", help="the fleet's proxies: requests, blocks, bans, cool-downs; reset them"
    )
    proxies.add_argument("action", nargs="?", choices=["list", "reset"], default="list")
    proxies.add_argument(
        "proxy", nargs="?", help="reset: the proxy (its id as listed; direct; all, the default)"
    )
    proxies.add_argument("--site", help="reset: only its record for this site")
    proxies.add_argument("--spider", default="products")
    proxies.add_argument("--json", action="store_true")
    proxies.set_defaults(func=_proxies)
    setting(proxies)
