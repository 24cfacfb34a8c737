"""The ``fleetcrawl`` command: services, status, dashboard, failures, changes, runs, seen-set,
scrapyd nodes."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from project.ops import recurring, scrapyd

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from project.frontier.connection import RedisTarget

__all__ = ["CommandError", "main"]

logger = logging.getLogger(__name__)


class CommandError(Exception):
    """A command could not do its job: one line for the user, and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


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

    return FrontierKeys.for_project_spider(settings, spider)


def _redis_target(settings: Any) -> RedisTarget:
    """The fleet's Redis as the settings name it: one server, a cluster or Sentinel's master."""
    from project.frontier.config import FrontierConfig

    return FrontierConfig.from_settings(settings).target


def _redis(target: RedisTarget) -> Any:
    """A blocking client of *target* (no I/O yet); a malformed REDIS_URL is a CommandError."""
    try:
        return target.sync_client(socket_connect_timeout=5, socket_timeout=30)
    except ValueError as exc:
        raise CommandError(f"REDIS_URL {target.describe()} is not a Redis URL: {exc}", 2) from exc


@contextlib.contextmanager
def _redis_errors(target: RedisTarget) -> Iterator[None]:
    """Redis failures as one line that says what failed and what to do."""
    from redis.exceptions import AuthenticationError, RedisError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    where = f"Redis at {target.describe()}"
    try:
        yield
    except AuthenticationError as exc:
        raise CommandError(
            f"{where} refused the credentials ({exc}): put the right password in REDIS_URL"
            " (redis://:PASSWORD@host:6379/0)"
        ) from exc
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise CommandError(
            f"{where} is unreachable ({exc}): start it (fleetcrawl services start)"
            " or point REDIS_URL at it"
        ) from exc
    except ResponseError as exc:
        hint = "put the password in REDIS_URL" if "NOAUTH" in str(exc) else "check REDIS_URL"
        raise CommandError(f"{where} answered with an error ({exc}): {hint}") from exc
    except RedisError as exc:
        raise CommandError(f"{where} failed: {exc}") from exc


def _json(data: Any) -> str:
    """JSON for a terminal: every control character escaped (``ensure_ascii`` leaves DEL)."""
    return json.dumps(data, indent=2, sort_keys=True, default=str).replace("\x7f", "\\u007f")


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from project.monitoring.console import render, watch
    from project.monitoring.status import StatusReader

    settings = _settings(args)
    target = _redis_target(settings)
    _redis(target).close()  # a malformed REDIS_URL is named before anything else
    reader = StatusReader.from_settings(settings, args.spider, sites=args.sites)
    with _redis_errors(target):
        if args.watch:
            if watch(reader, args.interval):
                raise CommandError(f"Redis at {target.describe()} was unreachable at the last read")
            return 0
        try:
            # Two reads a second apart give each site's achieved rate.
            reader.read()
            time.sleep(1.0)
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

    settings = _settings(args)
    target = _redis_target(settings)
    _redis(target).close()
    with _redis_errors(target):
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

    settings = _settings(args)
    target = _redis_target(settings)
    client, keys = _redis(target), _keys(settings, args.spider)
    with _redis_errors(target):
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


def _services(args: argparse.Namespace) -> int:
    from project.ops import services

    return services.main(args.rest)


def _port(text: str) -> int:
    value = scrapyd.positive_int(text) if text.isdigit() else -1
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value


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
        "--interval", type=scrapyd.positive_seconds, default=2.0, help="seconds between redraws"
    )
    status.add_argument(
        "--sites", type=scrapyd.positive_int, default=20, help="sites listed, the busiest first"
    )
    status.set_defaults(func=_status)
    dashboard = sub.add_parser("dashboard", help="web dashboard with charts and /metrics")
    dashboard.add_argument("--port", type=_port, default=8050)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (loopback)")
    dashboard.add_argument("--spider", default="products")
    dashboard.set_defaults(func=_dashboard)
    failures = sub.add_parser("failures", help="list, retry or purge dead letters")
    failures.add_argument("action", choices=["list", "retry", "purge"])
    failures.add_argument("--spider", default="products")
    failures.add_argument("--limit", type=scrapyd.positive_int, default=100)
    failures.add_argument("--json", action="store_true")
    failures.set_defaults(func=_failures)
    for command in (status, dashboard, failures):
        _setting_option(command)
    recurring.register(sub, _setting_option)
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
