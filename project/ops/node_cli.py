"""``fleetcrawl probe ready|live`` and ``fleetcrawl stop``: a node's health file
(``FLEET_HEALTH_FILE``, written by project/frontier/stopping.py) read for a platform's
probes and stop hooks. Only the standard library: a probe runs every few seconds."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.ops.common import CommandError, positive_seconds

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

__all__ = ["register"]

#: Seconds a crawling node's last round trip may be old for `probe live` and `probe ready`.
DEFAULT_MAX_AGE = 60.0


def _health(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CommandError(
            f"no health file at {path}: the node has not started yet, has closed, or runs"
            " without FLEET_HEALTH_FILE",
            status=1,
        ) from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot read the health file {path}: {exc}", status=1) from exc
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        raise CommandError(f"{path} is not a node's health file", status=1)
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive all the same
    return True


def _probe(args: argparse.Namespace) -> int:
    health = _health(args.file)
    pid, state = health["pid"], health.get("state")
    if not _alive(pid):
        raise CommandError(f"the node's process {pid} is gone (state was {state})", status=1)
    step_at = health.get("step_at")
    age = time.time() - step_at if isinstance(step_at, int | float) else None
    fresh = age is not None and age <= args.max_age
    if args.kind == "live":
        ok = state in ("starting", "stopping") or fresh
    else:
        ok = state == "crawling" and fresh
    said = "no round trip yet" if age is None else f"last round trip {age:.1f} s ago"
    line = f"node {health.get('node') or pid}: {state}, {said}"
    if not ok:
        raise CommandError(f"not {args.kind}: {line}", status=1)
    print(f"{args.kind}: {line}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    try:
        health = _health(args.file)
    except CommandError as exc:
        print(f"nothing to stop: {exc}")
        return 0
    pid = health["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"nothing to stop: process {pid} is gone")
        return 0
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        if not _alive(pid):
            print(f"node {health.get('node') or pid} stopped")
            return 0
        time.sleep(0.1)
    raise CommandError(f"process {pid} still runs {args.wait:g} s after SIGTERM", status=1)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    setting_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``probe`` and ``stop`` to the ``fleetcrawl`` command line."""
    del setting_option  # neither reads the settings: the health file says it all
    probe = sub.add_parser(
        "probe", help="exit 0 when the node of a health file is ready or live (for probes)"
    )
    probe.add_argument("kind", choices=["ready", "live"])
    probe.add_argument("--file", required=True, help="the node's FLEET_HEALTH_FILE")
    probe.add_argument(
        "--max-age",
        type=positive_seconds,
        default=DEFAULT_MAX_AGE,
        help="seconds the node's last round trip to Redis may be old",
    )
    probe.set_defaults(func=_probe)
    stop = sub.add_parser(
        "stop", help="SIGTERM the node of a health file and wait for it to exit (preStop)"
    )
    stop.add_argument("--file", required=True, help="the node's FLEET_HEALTH_FILE")
    stop.add_argument(
        "--wait", type=positive_seconds, default=25.0, help="seconds to wait for the exit"
    )
    stop.set_defaults(func=_stop)
