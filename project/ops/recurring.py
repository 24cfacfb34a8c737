"""``fleetcrawl changes|runs|seen``: what changed between crawls, their reports, the seen-set."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
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
    from collections.abc import Callable

    from project.storage.config import MongoConfig

__all__ = ["every", "register"]


def _since(text: str) -> timedelta:
    from scrapy.exceptions import NotConfigured

    from project.frontier.revisit import parse_duration

    try:
        return timedelta(seconds=parse_duration(text, "--since"))
    except NotConfigured as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _read(
    args: argparse.Namespace,
    collection: Callable[[MongoConfig], str],
    query: dict[str, Any],
    *,
    projection: dict[str, int] | None = None,
    sort: tuple[str, int],
    limit: int,
) -> tuple[list[dict[str, Any]], MongoConfig]:
    """One query of a spider's MongoDB collection, through pymongo's asynchronous client: the
    blocking client's monitor threads sleep in half-second steps, and the interpreter joined
    them at exit (about 0.5 s of every ``changes`` and ``runs``)."""
    from pymongo import AsyncMongoClient
    from pymongo.errors import PyMongoError

    from project.storage.config import MongoConfig

    config = MongoConfig.from_settings(project_settings(args), spider_name=args.spider)

    async def read() -> list[dict[str, Any]]:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            config.uri, serverSelectionTimeoutMS=int(config.server_selection_timeout * 1000),
            tz_aware=True, appname="fleetcrawl",
        )  # fmt: skip
        try:
            cursor = client[config.database][collection(config)].find(query, projection)
            return await cursor.sort(*sort).limit(limit).to_list(None)
        finally:
            await client.close()

    try:
        return asyncio.run(read()), config
    except PyMongoError as exc:
        raise CommandError(f"MongoDB: {exc}") from exc


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _changes(args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"at": {"$gte": datetime.now(UTC) - args.since}}
    if args.spider_only:
        query["spider"] = args.spider
    if args.field:
        query["field"] = args.field
    if args.item:
        query["item_id"] = args.item
    found, _ = _read(
        args, lambda config: config.changes_collection, query,
        projection={"_id": 0}, sort=("at", 1), limit=args.limit,
    )  # fmt: skip
    for change in found:
        if args.json:
            print(json.dumps({k: _plain(v) for k, v in change.items()}, default=str))
        else:
            print(
                f"{_plain(change.get('at'))}  {change.get('collection')}  {change.get('item_id')}"
                f"  {change.get('field')}: {change.get('old')!r} -> {change.get('new')!r}"
            )
    if not args.json:
        print(f"{len(found)} change(s) since {_plain(datetime.now(UTC) - args.since)}")
    return 0


def _runs(args: argparse.Namespace) -> int:
    from project.runs.report import render_report

    runs, config = _read(
        args, lambda config: config.runs_collection, {"spider": args.spider},
        sort=("ended", -1), limit=args.limit + 1,
    )  # fmt: skip
    if not runs:
        print(
            f"no finished crawl run of {args.spider} in {config.database}.{config.runs_collection}"
        )
        return 1
    for index, report in enumerate(runs[: args.limit]):
        previous = runs[index + 1] if index + 1 < len(runs) else None
        if args.json:
            print(json.dumps(report, default=str))
        else:
            print(render_report(report, previous))
    return 0


def _seen(args: argparse.Namespace) -> int:
    from project.frontier.seen import SeenConfig, migrate, stored_form

    settings = project_settings(args)
    keys = frontier_keys(settings, args.spider)
    target = redis_target(settings)

    async def work() -> int:

        from project.frontier.config import FrontierConfig

        server = FrontierConfig.from_settings(settings).client(socket_timeout=60)
        try:
            if args.action == "info":
                form = await stored_form(server, keys) or {"mode": "set"}
                if form["mode"] == "set":
                    count = await server.scard(keys.dupefilter)
                else:
                    count = int(await server.get(keys.dupefilter + ":n") or 0)
                print(f"{keys.dupefilter}: {json.dumps(form)}, {count} URLs")
                return 0
            config = SeenConfig(args.to, args.expected, args.error_rate)
            config.check()
            moved = await migrate(server, keys, config)
            print(
                f"moved {moved} fingerprints of {keys.dupefilter} into {json.dumps(config.form())}"
            )
            return 0
        finally:
            await server.aclose()  # a cluster's client is no redis.asyncio.Redis

    with redis_errors(target):
        return asyncio.run(work())


def _push_seeds(args: argparse.Namespace) -> None:
    """``redis-cli lpush <spider>:start_urls`` of each ``--seed``, with the project's keys."""
    from project.frontier.keys import FrontierKeys

    settings = project_settings(argparse.Namespace(set=args.settings))
    keys = FrontierKeys.for_project_spider(settings, args.spider)
    target = redis_target(settings)
    with redis_errors(target):
        client = redis_client(target)
        try:
            client.lpush(keys.start_urls, *args.seed)
        finally:
            client.close()


def every(
    args: argparse.Namespace, one_round: Callable[[], int], running: Callable[[], int]
) -> int:
    """``fleetcrawl schedule --every``: a crawl each interval, seeded, never two at once."""
    rounds = 0
    next_start = time.monotonic()
    status = 0
    while args.rounds is None or rounds < args.rounds:
        left = running() if rounds else 0
        if left:
            print(
                f"round {rounds + 1} skipped: {left} job(s) of the last crawl still running",
                flush=True,
            )
        else:
            if args.seed:
                _push_seeds(args)
            print(f"round {rounds + 1} at {datetime.now(UTC):%Y-%m-%d %H:%M:%S}Z", flush=True)
            status = one_round() or status
        rounds += 1
        if args.rounds is not None and rounds >= args.rounds:
            break
        next_start += args.every
        time.sleep(max(0.0, next_start - time.monotonic()))
    while running():  # the last crawl's jobs: the command ends with them
        time.sleep(1.0)
    return status


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], setting: Callable[[Any], None]
) -> None:
    """Add ``changes``, ``runs`` and ``seen`` to the ``fleetcrawl`` command."""
    changes = sub.add_parser("changes", help="changed fields and gone items of recent crawls")
    changes.add_argument("--since", type=_since, default=timedelta(days=1), help="90, 30m, 1d")
    changes.add_argument("--spider", default="products")
    changes.add_argument("--spider-only", action="store_true", help="only this spider's items")
    changes.add_argument("--field", help="only this field (dotted: offers.price; gone_at)")
    changes.add_argument("--item", help="only this item _id")
    changes.add_argument("--limit", type=int, default=1000)
    changes.add_argument("--json", action="store_true")
    changes.set_defaults(func=_changes)
    runs = sub.add_parser("runs", help="reports of the last crawl runs of a spider")
    runs.add_argument("--spider", default="products")
    runs.add_argument("--limit", type=int, default=1)
    runs.add_argument("--json", action="store_true")
    runs.set_defaults(func=_runs)
    seen = sub.add_parser("seen", help="the seen-set's form, or move it into another")
    seen.add_argument("action", choices=["info", "migrate"])
    seen.add_argument("--spider", default="products")
    seen.add_argument("--to", choices=["exact", "bloom"], default="exact")
    seen.add_argument("--expected", type=int, default=10_000_000, help="URLs to size it for")
    seen.add_argument("--error-rate", type=float, default=1e-6, help="Bloom only")
    seen.set_defaults(func=_seen)
    for command in (changes, runs, seen):
        setting(command)
