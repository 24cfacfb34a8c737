"""The ``fleetcrawl`` command: services, status, dashboard, failures, clear, changes, runs,
seen-set, the store's outbox, scrapyd nodes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from project.ops import (
    autoscale,
    export_cli,
    node_cli,
    proxies,
    recurring,
    scrapyd,
    services_cli,
    store,
)
from project.ops.common import (
    CommandError,
    frontier_keys,
    positive_int,
    positive_seconds,
    project_settings,
    redis_client,
    redis_errors,
    redis_target,
    tcp_port,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _json(data: Any) -> str:
    """JSON for a terminal: every control character escaped (``ensure_ascii`` leaves DEL)."""
    return json.dumps(data, indent=2, sort_keys=True, default=str).replace("\x7f", "\\u007f")


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from project.monitoring.console import render, watch
    from project.monitoring.status import StatusReader

    settings = project_settings(args)
    target = redis_target(settings)
    redis_client(target).close()  # a malformed REDIS_URL is named before anything else
    reader = StatusReader.from_settings(settings, args.spider, sites=args.sites)
    with redis_errors(target):
        if args.watch:
            if watch(reader, args.interval):
                raise CommandError(f"Redis at {target.describe()} was unreachable at the last read")
            return 0
        try:
            # One read: a site's achieved rate needs two (--watch and the dashboard show it).
            snapshot = reader.read()
        finally:
            reader.close()
    if args.json:
        print(_json(snapshot))
        return 0
    Console(width=max(100, Console().width)).print(render(snapshot))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from project.monitoring.dashboard import serve

    settings = project_settings(args)
    target = redis_target(settings)
    redis_client(target).close()
    with redis_errors(target):
        try:
            return serve(settings, args.spider, args.host, args.port)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CommandError(
                f"cannot listen on {args.host}:{args.port} ({reason}): choose another --port"
                " or --host, or stop what holds it"
            ) from exc


def _failures(args: argparse.Namespace) -> int:
    from project.frontier.admin import purge_dead_letters, retry_dead_letters
    from project.monitoring.console import printable
    from project.monitoring.status import read_dead_letters

    settings = project_settings(args)
    target = redis_target(settings)
    client, keys = redis_client(target), frontier_keys(settings, args.spider)
    with redis_errors(target):
        if args.action == "list":
            records = read_dead_letters(client, keys, args.limit)
            if args.json:
                print(_json(records))
                return 0
            for record in records:
                kind, attempts = record.get("kind", "?"), record.get("attempts", "?")
                print(
                    f"{printable(kind, 8):8} {printable(attempts, 4):>2}x"
                    f"  {printable(record.get('url', ''), 90)}"
                )
                print(
                    f"         {printable(record.get('error', ''), 120)}"
                    f"  (node {printable(record.get('node'), 60)})"
                )
            print(f"{len(records)} dead letters shown")
        elif args.action == "retry":
            try:
                requeued, skipped = retry_dead_letters(client, keys)
            except (ValueError, RecursionError, AttributeError, TypeError, KeyError) as exc:
                raise CommandError(
                    f"a dead letter cannot be read ({type(exc).__name__}: {printable(exc, 200)}),"
                    " so nothing was requeued: find it with `fleetcrawl failures list --json`"
                ) from exc
            print(f"requeued {requeued} requests; {skipped} invalid seeds stay dead-lettered")
        else:
            print(f"purged {purge_dead_letters(client, keys)} dead letters")
    return 0


def _clear(args: argparse.Namespace) -> int:
    """Delete a spider's frontier (project/frontier/admin.py), unless nodes hold its crawl."""
    from project.frontier.admin import clear_frontier

    settings = project_settings(args)
    target = redis_target(settings)
    client, keys = redis_client(target), frontier_keys(settings, args.spider)
    with redis_errors(target):
        seconds, micros = client.time()  # type: ignore[misc]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        holding = {
            member
            for key in (keys.alive, keys.holders)
            for member in client.zrangebyscore(key, f"({now_ms}", "+inf")  # type: ignore[union-attr]
        }
        if holding:
            raise CommandError(
                f"{len(holding)} nodes still crawl {args.spider}: stop them first (their"
                " presence expires a lease time after they stop)"
            )
        print(f"deleted {clear_frontier(client, keys)} keys of {args.spider}'s frontier")
    return 0


def _services(args: argparse.Namespace) -> int:
    return services_cli.main(args.rest)


def _setting_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-s", "--set", action="append", metavar="NAME=VALUE", help="override a setting"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetcrawl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="queue, seen-set and MongoDB figures of one spider")
    status.add_argument("--spider", default="products")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C")
    status.add_argument(
        "--interval", type=positive_seconds, default=2.0, help="seconds between redraws"
    )
    status.add_argument(
        "--sites", type=positive_int, default=20, help="sites listed, the busiest first"
    )
    status.set_defaults(func=_status)
    dashboard = sub.add_parser("dashboard", help="web dashboard with charts and /metrics")
    dashboard.add_argument("--port", type=tcp_port, default=8050)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (loopback)")
    dashboard.add_argument("--spider", default="products")
    dashboard.set_defaults(func=_dashboard)
    failures = sub.add_parser("failures", help="list, retry or purge dead letters")
    failures.add_argument("action", choices=["list", "retry", "purge"])
    failures.add_argument("--spider", default="products")
    failures.add_argument("--limit", type=positive_int, default=100)
    failures.add_argument("--json", action="store_true")
    failures.set_defaults(func=_failures)
    clear = sub.add_parser(
        "clear", help="delete a spider's frontier (queues, seen-set, revisits) to start afresh"
    )
    clear.add_argument("spider")
    clear.set_defaults(func=_clear)
    for command in (status, dashboard, failures, clear):
        _setting_option(command)
    recurring.register(sub, _setting_option)
    store.register(sub, _setting_option)
    proxies.register(sub, _setting_option)
    export_cli.register(sub, _setting_option)
    node_cli.register(sub, _setting_option)
    autoscale.register(sub, _setting_option)
    for name, func, text in (
        ("services", _services, "start|stop|status the local Redis and FerretDB"),
    ):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=func)
    scrapyd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fleetcrawl`` console script.

    A command that fails exits non-zero with one line on stderr that says what
    failed and what to do (2: bad configuration), never with a traceback for an
    expected fault.
    """
    from scrapy.exceptions import NotConfigured

    from project.storage.config import StorageConfigError

    level = os.environ.get("LOG_LEVEL", "INFO")
    try:
        logging.basicConfig(level=level, format="%(levelname)s: %(message)s")
    except ValueError:
        logging.basicConfig(level="INFO", format="%(levelname)s: %(message)s", force=True)
        logger.warning("LOG_LEVEL %r is not a logging level; using INFO", level)
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except (NotConfigured, StorageConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
