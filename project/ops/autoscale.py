"""``fleetcrawl autoscale``: a scrapyd fleet that follows the crawl's useful nodes.

Every ``--interval`` seconds it reads how many nodes the work ready now can keep busy
(project/monitoring/scale.py, what ``/api/v1/scale`` serves) and the spider's jobs on every
scrapyd node, and moves the job count toward it, within ``--min`` and ``--max``: more jobs
start at once (on the nodes with the fewest), fewer only when ``--cooldown`` seconds passed
since the last change (pending jobs are cancelled first, then the newest running ones, with
SIGTERM: a node hands its leases back and exits within FLEET_STOP_GRACE). One line per
decision; a node that cannot answer costs only its own jobs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.ops.common import (
    CommandError,
    frontier_keys,
    positive_int,
    positive_seconds,
    project_settings,
    redis_client,
    redis_errors,
    redis_target,
)
from project.ops.scrapyd import FleetError, NodeError, ScrapydNode, load_nodes

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence

__all__ = ["Jobs", "decide", "register"]


@dataclass
class Jobs:
    """The spider's jobs on one scrapyd node: ids, the newest last."""

    node: ScrapydNode
    running: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    reachable: bool = True

    @property
    def count(self) -> int:
        return len(self.running) + len(self.pending)


def decide(
    useful: int, current: int, *, least: int, most: int, since_change: float, cooldown: float
) -> int:
    """Jobs to start (above 0) or stop (below 0): toward *useful* within [*least*, *most*];
    down only *cooldown* seconds after the last change."""
    target = min(max(useful, least), most)
    if target > current:
        return target - current
    if target < current and since_change >= cooldown:
        return target - current
    return 0


def counted(fleet: list[Jobs], alive: int) -> int:
    """The spider's jobs running now: those the nodes listed; when a node could not be asked,
    at least the nodes the frontier sees alive (that node's jobs may run on, and counted as
    none, they would be started again elsewhere)."""
    listed = sum(jobs.count for jobs in fleet)
    return max(listed, alive) if any(not jobs.reachable for jobs in fleet) else listed


def _jobs(node: ScrapydNode, project: str, spider: str) -> Jobs:
    try:
        listed = node.get("listjobs.json", project=project)
        found = Jobs(node)
        for kind in ("running", "pending"):
            rows = [job for job in listed.get(kind, []) if job.get("spider") == spider]
            rows.sort(key=lambda job: str(job.get("start_time") or ""))
            getattr(found, kind).extend(str(job["id"]) for job in rows)
    except (NodeError, KeyError, TypeError, AttributeError) as exc:
        print(f"node {node}: cannot list its jobs ({exc})", file=sys.stderr, flush=True)
        return Jobs(node, reachable=False)
    return found


def _start(
    fleet: list[Jobs], count: int, fields: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    started = []
    for _ in range(count):
        candidates = [jobs for jobs in fleet if jobs.reachable]
        if not candidates:
            break
        jobs = min(candidates, key=lambda j: j.count)
        try:
            job = str(jobs.node.post("schedule.json", fields)["jobid"])
        except NodeError as exc:
            print(f"node {jobs.node}: cannot start a job ({exc})", file=sys.stderr, flush=True)
            jobs.reachable = False
            continue
        jobs.pending.append(job)
        started.append((str(jobs.node), job))
    return started


def _stop(fleet: list[Jobs], count: int, project: str) -> list[tuple[str, str]]:
    stopped = []
    for _ in range(count):
        # a job not started yet first, then the newest running job of the busiest node
        waiting = [jobs for jobs in fleet if jobs.reachable and jobs.pending]
        busy = [jobs for jobs in fleet if jobs.reachable and jobs.running]
        if waiting:
            jobs, job = waiting[0], waiting[0].pending.pop()
        elif busy:
            jobs = max(busy, key=lambda j: j.count)
            job = jobs.running.pop()
        else:
            break
        try:
            jobs.node.post("cancel.json", [("project", project), ("job", job), ("signal", "TERM")])
        except NodeError as exc:
            print(f"node {jobs.node}: cannot stop job {job} ({exc})", file=sys.stderr, flush=True)
            jobs.reachable = False
            continue
        stopped.append((str(jobs.node), job))
    return stopped


def _useful(args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    from project.monitoring.status import fleet_status

    settings = project_settings(args)
    target = redis_target(settings)
    client = redis_client(target)
    keys = frontier_keys(settings, args.spider)

    def read() -> dict[str, Any]:
        with redis_errors(target):
            scale: dict[str, Any] = fleet_status(client, keys)["scale"]
        return scale

    return read


def _autoscale(args: argparse.Namespace) -> int:
    if not 0 <= args.min <= args.max:
        raise CommandError(f"--min {args.min} must be within 0 and --max {args.max}", 2)
    try:
        nodes = load_nodes(args.nodes_file, timeout=args.timeout)
    except FleetError as exc:
        raise CommandError(str(exc), 2) from exc
    read = _useful(args)
    fields = [("project", args.project), ("spider", args.spider)]
    fields += [("setting", setting) for setting in args.set or []]
    changed_at = -float("inf")
    rounds = 0
    while args.rounds is None or rounds < args.rounds:
        started_at = time.monotonic()
        try:
            scale = read()
        except CommandError as exc:  # Redis away: this look is skipped, the next may do
            print(f"{datetime.now(UTC):%H:%M:%S}Z cannot read the frontier: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
            rounds += 1
            time.sleep(args.interval)
            continue
        fleet = [_jobs(node, args.project, args.spider) for node in nodes]
        current = counted(fleet, int(scale.get("nodes_alive") or 0))
        delta = decide(
            scale["useful_nodes"],
            current,
            least=args.min,
            most=args.max,
            since_change=started_at - changed_at,
            cooldown=args.cooldown,
        )
        moved = _start(fleet, delta, fields) if delta > 0 else _stop(fleet, -delta, args.project)
        what = "started" if delta > 0 else "stopped"
        done = f"{what} {len(moved)}: " + ", ".join(f"{n} {j}" for n, j in moved) if moved else "-"
        print(
            f"{datetime.now(UTC):%H:%M:%S}Z useful {scale['useful_nodes']}"
            f" ({scale['usable_slots']} downloads at once), jobs {current}: {done}",
            flush=True,
        )
        if moved:
            changed_at = time.monotonic()
        rounds += 1
        if args.rounds is not None and rounds >= args.rounds:
            break
        time.sleep(max(0.0, args.interval - (time.monotonic() - started_at)))
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    setting_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``autoscale`` to the ``fleetcrawl`` command line."""
    command = sub.add_parser(
        "autoscale",
        help="start and stop a spider's scrapyd jobs to follow the fleet's useful nodes",
        epilog="Nodes: env FLEETCRAWL_NODES or --nodes-file; credentials: env"
        " SCRAPYD_USERNAME and SCRAPYD_PASSWORD. The -s settings go to the jobs and to the"
        " reading of the frontier alike.",
    )
    command.add_argument("spider", help="the spider whose jobs follow its frontier")
    command.add_argument("--min", type=int, default=0, help="jobs at least (default 0)")
    command.add_argument("--max", type=positive_int, default=8, help="jobs at most (default 8)")
    command.add_argument(
        "--cooldown",
        type=positive_seconds,
        default=120.0,
        help="seconds after a change before jobs are stopped (default 120)",
    )
    command.add_argument(
        "--interval", type=positive_seconds, default=10.0, help="seconds between two looks"
    )
    command.add_argument("--rounds", type=positive_int, help="stop after N looks (default never)")
    command.add_argument("--project", default="fleetcrawl", help="scrapyd project name")
    command.add_argument("--nodes-file", type=Path, help="scrapyd nodes, one URL a line")
    command.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="per scrapyd request"
    )
    setting_option(command)
    command.set_defaults(func=_autoscale)
