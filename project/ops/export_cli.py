"""``fleetcrawl export``: a collection streamed out of MongoDB in JSON Lines, JSON or CSV."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

from project.ops.common import CommandError, project_settings, redis_client, redis_target

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import BinaryIO

__all__ = ["register"]


def _export(args: argparse.Namespace) -> int:
    from pymongo.errors import PyMongoError

    from project.dataout.config import DataOutConfig
    from project.dataout.query import BadParameterError, read_token, split_fields

    settings = project_settings(args)
    if args.format == "parquet":
        raise CommandError(
            "parquet is not offered (a scraped collection has no schema to give it): export"
            ' jsonl and convert it, e.g. python -c "import pyarrow.json as j, pyarrow.parquet'
            " as p; p.write_table(j.read_json('items.jsonl'), 'items.parquet')\"",
            2,
        )
    try:
        fields, omit = split_fields(args.fields), split_fields(args.omit, "omit")
        since = read_token(args.since) if args.since else None
    except BadParameterError as exc:
        raise CommandError(str(exc), 2) from exc
    config = DataOutConfig.from_settings(settings)
    try:
        out = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc}") from exc
    try:
        token = asyncio.run(_run(args, settings, config, out, (fields, omit, since)))
    except PyMongoError as exc:
        raise CommandError(f"MongoDB: {exc}") from exc
    finally:
        if args.output:
            out.close()
        else:
            out.flush()
    if args.token_file:
        with open(args.token_file, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
    return 0


async def _run(
    args: argparse.Namespace, settings: Any, config: Any, out: BinaryIO,
    given: tuple[tuple[str, ...], tuple[str, ...], int | None],
) -> str:  # fmt: skip
    """Export as *args* say to *out*; the token that resumes after it."""
    from pymongo import AsyncMongoClient

    from project.dataout.clock import fleet_ms
    from project.dataout.export import export_items
    from project.dataout.query import BadParameterError, ItemQuery, watermark_ms, window_of
    from project.storage.config import MongoConfig
    from project.storage.counts import count_of_async

    fields, omit, since = given
    mongo = MongoConfig.from_settings(settings, spider_name=args.spider)
    try:
        redis = redis_client(redis_target(settings))
    except CommandError:
        redis = None
    until = watermark_ms(fleet_ms(redis), config.settle_seconds)
    if since is not None and since >= until:
        raise CommandError(f"since {args.since} is not before this export's watermark w{until}")
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo.uri, serverSelectionTimeoutMS=int(mongo.server_selection_timeout * 1000),
        tz_aware=True, appname="fleetcrawl-export",
    )  # fmt: skip
    try:
        database = client[mongo.database]
        window = None
        if args.run:
            report = await database[mongo.runs_collection].find_one({"_id": args.run})
            if report is None:
                raise CommandError(f"no report of run {args.run!r} (fleetcrawl runs lists them)")
            try:
                window = window_of(report)
            except BadParameterError as exc:
                raise CommandError(str(exc)) from exc
        query = ItemQuery(until, since, window, fields, omit)
        collection = database[args.collection]
        progress = None
        if sys.stderr.isatty():
            progress = _progress(await count_of_async(collection))
        done = await export_items(collection, query, args.format, out.write, progress=progress)
    finally:
        await client.close()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if done.left_out:
        print(
            f"note: {len(done.left_out)} columns of later items are not in the CSV header"
            f" ({', '.join(done.left_out[:10])}...): name them with --fields",
            file=sys.stderr,
        )
    print(f"exported {done.count} items of {args.collection}", file=sys.stderr)
    print(f"token: {done.token}  (--since {done.token}: what is written after them)",
          file=sys.stderr)  # fmt: skip
    return done.token


def _progress(total: int) -> Callable[[int], None]:
    """A progress line on a terminal (stderr), redrawn at most 4 times a second."""
    started, shown = time.monotonic(), [0.0]

    def show(count: int) -> None:
        now = time.monotonic()
        if now - shown[0] < 0.25:
            return
        shown[0] = now
        rate = count / max(now - started, 1e-6)
        share = f" of ~{total} ({min(count / total, 1):.0%})" if total else ""
        sys.stderr.write(f"\r{count} items{share}, {rate:.0f}/s   ")
        sys.stderr.flush()

    return show


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], setting: Callable[[Any], None]
) -> None:
    """Add ``export`` to the ``fleetcrawl`` command."""
    export = sub.add_parser(
        "export",
        help="stream a collection out of MongoDB (jsonl, json, csv), all or what changed since",
    )
    export.add_argument("collection", help="products, books, changes, ...")
    export.add_argument("--format", choices=["jsonl", "json", "csv", "parquet"], default="jsonl")
    export.add_argument(
        "--fields", help="only these fields, comma-separated (dotted: offers.price)"
    )
    export.add_argument("--omit", help="without these fields, comma-separated")
    export.add_argument("--run", help="only items last seen in this crawl run (fleetcrawl runs)")
    export.add_argument("--since", help="a token an export printed: only what was written after")
    export.add_argument("-o", "--output", help="the file to write (default: standard output)")
    export.add_argument("--token-file", help="also write the token that resumes after this export")
    export.add_argument("--spider", default="products")
    export.set_defaults(func=_export)
    setting(export)
