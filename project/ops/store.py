"""``fleetcrawl store drain``: what waits for MongoDB (the fleet's outbox in Redis, journals of
this host's dead nodes) written there, for a crawl whose nodes gave up (exit status 3)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from project.ops.common import (
    CommandError,
    frontier_keys,
    positive_seconds,
    project_settings,
    redis_errors,
    redis_target,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

__all__ = ["register"]


def _drain(args: argparse.Namespace) -> int:
    from project.storage.store import EXIT_NOT_STORED, drain

    settings = project_settings(args)
    target = redis_target(settings)
    keys = frontier_keys(settings, args.spider)
    with redis_errors(target):
        counts = asyncio.run(drain(settings, args.spider, keys, args.timeout))
    print(
        f"{counts['drained']} records of the outbox {counts['outbox']} and {counts['replayed']}"
        f" journaled records written to MongoDB; {counts['malformed']} malformed entries set"
        " aside"
    )
    if counts["not_stored"]:
        raise CommandError(
            f"{counts['not_stored']} records still wait after {args.timeout:.0f} s: is MongoDB"
            " up? run this again",
            EXIT_NOT_STORED,
        )
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], setting: Callable[[Any], None]
) -> None:
    """Add ``store`` to the ``fleetcrawl`` command."""
    store = sub.add_parser("store", help="write what waits for MongoDB (the outbox) there")
    store.add_argument("action", choices=["drain"])
    store.add_argument("--spider", default="products")
    store.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds to wait for MongoDB"
    )
    store.set_defaults(func=_drain)
    setting(store)
