"""``fleetcrawl services start|stop|status``: the local Redis (one server, a cluster or a
Sentinel group) and FerretDB, started by ``project.ops.services`` and ``project.ops.topology``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from project.ops import topology
from project.ops.services import (
    SERVICE_NAMES,
    ServiceError,
    ServicesConfig,
    running_pid,
    start_mongo,
    start_redis,
    status,
    stop_service,
)
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]

_MAX_PORT = 65535


# --- command line ----------------------------------------------------------


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port <= _MAX_PORT:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return port


def _add_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    env = os.environ

    def default(value: str) -> str:
        # After the subcommand, SUPPRESS keeps unset options from overwriting
        # values given before it.
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--state-dir",
        default=default(env.get("FLEETCRAWL_STATE_DIR", ".state")),
        help="folder for data, logs and pidfiles (env FLEETCRAWL_STATE_DIR; default ./.state)",
    )
    parser.add_argument(
        "--redis-port",
        type=_port,
        default=default(env.get("FLEETCRAWL_REDIS_PORT", "6379")),
        help="Redis port (env FLEETCRAWL_REDIS_PORT; default 6379)",
    )
    parser.add_argument(
        "--mongo-port",
        type=_port,
        default=default(env.get("FLEETCRAWL_MONGO_PORT", "27017")),
        help="FerretDB port (env FLEETCRAWL_MONGO_PORT; default 27017)",
    )
    parser.add_argument(
        "--host",
        default=default("127.0.0.1"),
        help="loopback address to listen on (default 127.0.0.1)",
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--cluster",
        action="store_true",
        default=default(False),  # type: ignore[arg-type]
        help="Redis as a cluster: 3 masters and 3 replicas on --redis-port .. +5",
    )
    shape.add_argument(
        "--sentinel",
        action="store_true",
        default=default(False),  # type: ignore[arg-type]
        help="Redis as a master and 2 replicas on --redis-port .. +2, with 3 sentinels on"
        " 26379 .. 26381",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetcrawl services",
        description="Start, stop or inspect the local Redis and FerretDB (MongoDB) servers. "
        "REDIS_PASSWORD sets Redis' password; with MONGO_URI set, FerretDB is not started.",
    )
    _add_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{start,stop,status}")
    for command, help_text in (
        ("start", "start the services that are not running"),
        ("stop", "stop the running services"),
        ("status", "show each service; exit 3 if one is not running"),
    ):
        _add_options(commands.add_parser(command, help=help_text), defaults=False)
    return parser


_SENTINEL_PORT = 26379


def _group(cfg: ServicesConfig, shape: str) -> tuple[list[int], list[int]]:
    """The Redis ports (and sentinel ports) of ``--cluster`` or ``--sentinel``."""
    if shape == "cluster":
        return [cfg.redis_port + i for i in range(6)], []
    return [cfg.redis_port + i for i in range(3)], [_SENTINEL_PORT + i for i in range(3)]


def _start_group(cfg: ServicesConfig, shape: str) -> int:
    ports, sentinels = _group(cfg, shape)
    try:
        if shape == "cluster":
            cluster = topology.start_cluster(cfg, ports)
            print(f"redis cluster: {len(ports)} servers, pids {sorted(cluster.pids.values())}")
            print(f"  nodes: -s REDIS_CLUSTER_NODES={','.join(cluster.nodes)}")
        else:
            group = topology.start_sentinel_group(cfg, ports, sentinels)
            print(f"redis sentinel group: pids {sorted(group.pids.values())}")
            print(
                f"  nodes: -s REDIS_SENTINELS={','.join(group.sentinels)}"
                f" -s REDIS_SENTINEL_MASTER={group.master_name}"
            )
    except ServiceError as exc:
        print(f"redis {shape}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _stop_group(cfg: ServicesConfig, shape: str) -> None:
    ports, sentinels = _group(cfg, shape)
    group: topology.ClusterInfo | topology.SentinelInfo = (
        topology.ClusterInfo(cfg.host, tuple(ports), {})
        if shape == "cluster"
        else topology.SentinelInfo(cfg.host, tuple(ports), tuple(sentinels), {})
    )
    for port, pid in topology.stop_group(cfg, group):
        print(f"redis {shape} {port}: stopped pid {pid}")


def _start_all(cfg: ServicesConfig, mongo_uri: str | None, shape: str | None = None) -> int:
    code = 0
    if shape is not None:
        code = _start_group(cfg, shape)
    for name, start in (("redis", start_redis), ("mongo", start_mongo)):
        if name == "redis" and shape is not None:
            continue
        if name == "mongo" and mongo_uri:
            print(f"mongo: using MONGO_URI (external) {mask_url(mongo_uri)}")
            continue
        try:
            print(start(cfg))
        except ServiceError as exc:
            print(f"{name}: error: {exc}", file=sys.stderr)
            code = 1
    return code


def _stop_all(cfg: ServicesConfig, mongo_uri: str | None, shape: str | None = None) -> int:
    code = 0
    if shape is not None:
        _stop_group(cfg, shape)
    for name in SERVICE_NAMES:
        pid = running_pid(cfg, name=name)
        try:
            stopped = stop_service(cfg, name)
        except ServiceError as exc:
            print(f"{name}: error: {exc}", file=sys.stderr)
            code = 1
            continue
        if stopped:
            print(f"{name}: stopped pid {pid}")
        elif name == "mongo" and mongo_uri:
            print(f"mongo: not running (using MONGO_URI (external) {mask_url(mongo_uri)})")
        else:
            print(f"{name}: not running")
    return code


def _status_all(cfg: ServicesConfig, mongo_uri: str | None) -> int:
    code = 0
    for name, found in status(cfg).items():
        if name == "mongo" and mongo_uri and not found.running:
            print(f"mongo: using MONGO_URI (external) {mask_url(mongo_uri)}")
            continue
        print(found)
        if not found.running:
            code = 3
    return code


def main(argv: Sequence[str]) -> int:
    """Run ``fleetcrawl services start|stop|status``; return the exit code."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    try:
        cfg = ServicesConfig(
            state_dir=Path(args.state_dir),
            host=args.host,
            redis_port=args.redis_port,
            mongo_port=args.mongo_port,
            redis_password=os.environ.get("REDIS_PASSWORD") or None,
        )
    except ValueError as exc:
        parser.error(str(exc))
    shape = "cluster" if args.cluster else "sentinel" if args.sentinel else None
    mongo_uri = os.environ.get("MONGO_URI") or None
    try:
        if args.command == "start":
            return _start_all(cfg, mongo_uri, shape)
        if args.command == "stop":
            return _stop_all(cfg, mongo_uri, shape)
        return _status_all(cfg, mongo_uri)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    raise SystemExit(main(sys.argv[1:]))
