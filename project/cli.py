"""The ``fleetcrawl`` command: services, status, failures, demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def _settings() -> Any:
    from scrapy.utils.project import get_project_settings

    return get_project_settings()


def _redis(settings: Any) -> Any:
    import redis

    return redis.Redis.from_url(settings.get("REDIS_URL"), socket_connect_timeout=5)


def _mongo_counts(settings: Any) -> dict[str, Any]:
    import pymongo
    from pymongo.errors import PyMongoError

    from project.services import mask_url

    uri = settings.get("MONGO_URI")
    client: pymongo.MongoClient[dict[str, Any]]
    try:
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=3000) as client:
            db: pymongo.database.Database[dict[str, Any]] = client[settings.get("MONGO_DATABASE")]
            return {
                name: db[name].estimated_document_count()
                for name in ("products", "rejects", "failures")
            }
    except PyMongoError as exc:
        return {"error": f"MongoDB at {mask_url(uri)} unreachable: {type(exc).__name__}"}


def _status(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError

    from project.services import mask_url
    from project.status import frontier_snapshot

    settings = _settings()
    try:
        snapshot = frontier_snapshot(_redis(settings), args.spider)
    except RedisError as exc:
        print(
            f"error: Redis at {mask_url(settings.get('REDIS_URL'))} unreachable: {exc}",
            file=sys.stderr,
        )
        return 1
    snapshot["mongo"] = _mongo_counts(settings)
    if args.json:
        print(json.dumps(snapshot, indent=2, sort_keys=True))
        return 0
    bands = ", ".join(f"{p}: {n}" for p, n in snapshot["queued_by_priority"].items()) or "-"
    nodes = ", ".join(f"{n}: {c}" for n, c in snapshot["in_flight_by_node"].items()) or "-"
    mongo = snapshot["mongo"]
    print(f"spider          {snapshot['spider']}")
    print(f"queued          {snapshot['queued']} (by priority {bands})")
    print(f"delayed retries {snapshot['delayed_retries']}")
    print(f"in flight       {snapshot['in_flight']} ({nodes})")
    print(f"seeds waiting   {snapshot['seeds_waiting']}")
    print(f"seen            {snapshot['seen']} URLs ({snapshot['seen_bytes']} bytes)")
    print(f"dead letters    {snapshot['dead_letters']}")
    if "error" in mongo:
        print(f"mongodb         {mongo['error']}")
    else:
        print(
            f"mongodb         {mongo['products']} products, {mongo['rejects']} rejects,"
            f" {mongo['failures']} failures"
        )
    return 0


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
    status.set_defaults(func=_status)
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
