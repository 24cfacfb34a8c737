"""The ``fleetcrawl`` command: services, status, dashboard, failures, scrapyd nodes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from project.ops import scrapyd
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def _settings(args: argparse.Namespace) -> Any:
    """The project's settings, with ``-s NAME=VALUE`` on top (as ``scrapy crawl`` takes them)."""
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    for pair in getattr(args, "set", None) or []:
        name, _, value = pair.partition("=")
        settings.set(name, value, priority="cmdline")
    return settings


def _keys(settings: Any, spider: str) -> Any:
    from project.frontier.keys import FrontierKeys

    return FrontierKeys.from_settings(settings, spider)


def _redis(settings: Any) -> Any:
    import redis

    from project.frontier.config import FrontierConfig

    return redis.Redis.from_url(
        FrontierConfig.from_settings(settings).redis_url, socket_connect_timeout=5
    )


def _status(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError
    from rich.console import Console

    from project.monitoring.console import render, watch
    from project.monitoring.status import StatusReader

    reader = StatusReader.from_settings(_settings(args), args.spider)
    if args.watch:
        return watch(reader, args.interval)
    try:
        # Two reads a second apart give each site's achieved rate.
        reader.read()
        time.sleep(1.0)
        snapshot = reader.read()
    except RedisError as exc:
        print(f"error: Redis at {mask_url(reader.redis_url)} unreachable: {exc}", file=sys.stderr)
        return 1
    finally:
        reader.close()
    if args.json:
        print(json.dumps(snapshot, indent=2, sort_keys=True))
        return 0
    Console(width=max(100, Console().width)).print(render(snapshot))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from project.monitoring.dashboard import serve

    return serve(_settings(args), args.spider, args.host, args.port)


def _failures(args: argparse.Namespace) -> int:
    from project.frontier.admin import dead_letters, purge_dead_letters, retry_dead_letters

    settings = _settings(args)
    client, keys = _redis(settings), _keys(settings, args.spider)
    if args.action == "list":
        records = dead_letters(client, keys, args.limit)
        if args.json:
            print(json.dumps(records, indent=2))
            return 0
        for record in records:
            print(f"{record['kind']:8} {record['attempts']:>2}x  {record['url'][:90]}")
            print(f"         {record['error'][:120]}  (node {record['node']})")
        print(f"{len(records)} dead letters shown")
    elif args.action == "retry":
        requeued, skipped = retry_dead_letters(client, keys)
        print(f"requeued {requeued} requests; {skipped} invalid seeds stay dead-lettered")
    else:
        print(f"purged {purge_dead_letters(client, keys)} dead letters")
    return 0


def _services(args: argparse.Namespace) -> int:
    from project.ops import services

    return services.main(args.rest)


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
    for command in (status, dashboard, failures):
        command.add_argument(
            "-s", "--set", action="append", metavar="NAME=VALUE", help="override a setting"
        )
    for name, func, text in (
        ("services", _services, "start|stop|status the local Redis and FerretDB"),
    ):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=func)
    scrapyd.register(sub)
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
