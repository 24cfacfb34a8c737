"""The ``fleetcrawl`` command: services, status, failures, demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from project import fleet

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def _settings() -> Any:
    from scrapy.utils.project import get_project_settings

    return get_project_settings()


def _redis(settings: Any) -> Any:
    import redis

    return redis.Redis.from_url(settings.get("REDIS_URL"), socket_connect_timeout=5)


def _status(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError

    from project.services import mask_url
    from project.status import StatusReader
    from project.watch import NODE_COLUMNS, human_duration, node_rows, watch

    settings = _settings()
    reader = StatusReader.from_settings(settings, args.spider)
    if args.watch:
        return watch(reader, args.interval)
    try:
        # Two reads a second apart give each site's achieved rate.
        reader.read()
        time.sleep(1.0)
        snapshot = reader.read()
    except RedisError as exc:
        print(
            f"error: Redis at {mask_url(settings.get('REDIS_URL'))} unreachable: {exc}",
            file=sys.stderr,
        )
        return 1
    finally:
        reader.close()
    if args.json:
        print(json.dumps(snapshot, indent=2, sort_keys=True))
        return 0
    bands = ", ".join(f"{p}: {n}" for p, n in snapshot["queued_by_priority"].items()) or "-"
    nodes = ", ".join(f"{n}: {c}" for n, c in snapshot["in_flight_by_node"].items()) or "-"
    mongo, totals, progress = snapshot["mongo"], snapshot["fleet"], snapshot["progress"]
    backlog = snapshot["journal_backlog"]
    print(f"spider          {snapshot['spider']}")
    print(f"queued          {snapshot['queued']} (by priority {bands})")
    print(f"delayed retries {snapshot['delayed_retries']}")
    print(f"in flight       {snapshot['in_flight']} ({nodes})")
    print(f"seeds waiting   {snapshot['seeds_waiting']}")
    print(f"seen            {snapshot['seen']} URLs ({snapshot['seen_bytes']} bytes)")
    print(f"dead letters    {snapshot['dead_letters']}")
    for site in snapshot["sites"]:
        allowed = f"{site['allowed_rate']:g}/s" if site["allowed_rate"] > 0 else "unlimited"
        print(
            f"site            {site['site']}: {site['state']}, allowed {allowed},"
            f" achieved {site['achieved_rate']:.1f}/s, {site['queued']} queued,"
            f" {site['in_flight']} in flight"
        )
    if "error" in mongo:
        print(f"mongodb         {mongo['error']}")
    else:
        print(
            f"mongodb         {mongo['products']} products, {mongo['rejects']} rejects,"
            f" {mongo['failures']} failures"
        )
    print(f"journal backlog {'n/a' if backlog is None else backlog}")
    print(
        f"rates           {totals['pages_per_min']:.0f} pages/min,"
        f" {totals['items_per_min']:.0f} items/min"
    )
    print(
        f"progress        {progress['done']}/{progress['total']} ({progress['fraction']:.0%}),"
        f" ETA {human_duration(progress['eta_seconds'])}"
    )
    print(
        f"nodes           {totals['nodes_alive']} alive, {totals['nodes_dead']} dead,"
        f" {totals['nodes_finished']} finished"
    )
    rows = [NODE_COLUMNS, *node_rows(snapshot)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(NODE_COLUMNS))]
    for row in rows if len(rows) > 1 else []:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from project.dashboard import serve

    return serve(_settings(), args.spider, args.host, args.port)


def _failures(args: argparse.Namespace) -> int:
    from project.status import dead_letters, purge_dead_letters, retry_dead_letters

    client = _redis(_settings())
    if args.action == "list":
        records = dead_letters(client, args.spider, args.limit)
        if args.json:
            print(json.dumps(records, indent=2))
            return 0
        for record in records:
            print(f"{record['kind']:8} {record['attempts']:>2}x  {record['url'][:90]}")
            print(f"         {record['error'][:120]}  (node {record['node']})")
        print(f"{len(records)} dead letters shown")
    elif args.action == "retry":
        requeued, skipped = retry_dead_letters(client, args.spider)
        print(f"requeued {requeued} requests; {skipped} invalid seeds stay dead-lettered")
    else:
        print(f"purged {purge_dead_letters(client, args.spider)} dead letters")
    return 0


def _services(args: argparse.Namespace) -> int:
    from project import services

    return services.main(args.rest)


def _demo(args: argparse.Namespace) -> int:
    from project import demo

    return demo.main(args.rest)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetcrawl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="queue, seen-set and MongoDB figures of one spider")
    status.add_argument("--spider", default="products")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    status.set_defaults(func=_status)
    dashboard = sub.add_parser("dashboard", help="web dashboard with charts and /metrics")
    dashboard.add_argument("--port", type=int, default=8050)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (loopback)")
    dashboard.add_argument("--spider", default="products")
    dashboard.set_defaults(func=_dashboard)
    failures = sub.add_parser("failures", help="list, retry or purge dead letters")
    failures.add_argument("action", choices=["list", "retry", "purge"])
    failures.add_argument("--spider", default="products")
    failures.add_argument("--limit", type=int, default=100)
    failures.add_argument("--json", action="store_true")
    failures.set_defaults(func=_failures)
    for name, func, text in (
        ("services", _services, "start|stop|status the local Redis and FerretDB"),
        ("demo", _demo, "run the demo crawl end to end"),
    ):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=func)
    fleet.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fleetcrawl`` console script."""
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"), format="%(levelname)s: %(message)s"
    )
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
