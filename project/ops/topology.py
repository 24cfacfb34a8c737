"""A local Redis Cluster, or a master, its replicas and three sentinels, on loopback.

Backs ``fleetcrawl services start --cluster`` / ``--sentinel`` and the suite's fixtures.
Every server is Debian's ``redis-server`` started by :func:`project.ops.services.start_redis`
in a folder of its own under the state folder (``redis-cluster/<port>/``,
``redis-sentinel/<port>/``), found again through its pidfile.

- :func:`start_cluster`: ``masters`` masters with ``replicas`` replicas each, formed with
  ``redis-cli --cluster create`` the first time (later starts find the cluster in each
  server's ``nodes.conf``). ``cluster-node-timeout`` is short (2 s) so a dead master's
  replica takes over within a few seconds, as a fleet's leases expect.
- :func:`start_sentinel_group`: one master, ``replicas`` replicas, and three sentinels that
  agree (quorum 2) a master is down after ``down_after_ms`` and promote a replica.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from project.ops.processes import ServiceError, free_port, netloc
from project.ops.services import ServicesConfig, running_pid, start_redis, stop_service

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ClusterInfo", "SentinelInfo", "start_cluster", "start_sentinel_group", "stop_group"]

logger = logging.getLogger(__name__)

CLUSTER_DIR = "redis-cluster"
SENTINEL_DIR = "redis-sentinel"
MASTER_NAME = "mymaster"
_MAX_PORT = 65535


@dataclass(frozen=True)
class ClusterInfo:
    """A running cluster: its servers' ports and pids, masters first as formed."""

    host: str
    ports: tuple[int, ...]
    pids: dict[int, int]

    @property
    def nodes(self) -> list[str]:
        """``host:port`` of every server: the ``REDIS_CLUSTER_NODES`` setting."""
        return [netloc(self.host, port) for port in self.ports]

    @property
    def url(self) -> str:
        """A ``REDIS_URL`` naming one server of the cluster (with ``REDIS_CLUSTER = True``)."""
        return f"redis://{self.nodes[0]}/0"


@dataclass(frozen=True)
class SentinelInfo:
    """A running Sentinel group: the master's and replicas' ports, the sentinels' ports."""

    host: str
    redis_ports: tuple[int, ...]
    sentinel_ports: tuple[int, ...]
    pids: dict[int, int]
    master_name: str = MASTER_NAME

    @property
    def sentinels(self) -> list[str]:
        """``host:port`` of every sentinel: the ``REDIS_SENTINELS`` setting."""
        return [netloc(self.host, port) for port in self.sentinel_ports]


def _member(cfg: ServicesConfig, port: int) -> ServicesConfig:
    return dataclasses.replace(cfg, redis_port=port)


def _client(cfg: ServicesConfig, port: int) -> redis.Redis:
    return redis.Redis(
        cfg.host, port, password=cfg.redis_password, socket_timeout=5, socket_connect_timeout=5
    )


def _wait(condition: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()  # type: ignore[operator]
        except redis.RedisError as exc:
            last = exc
        if last is True:
            return
        time.sleep(0.1)
    raise ServiceError(f"{condition} within {timeout:g}s (last: {last})")


def _synced(cfg: ServicesConfig, ports: Sequence[int]) -> bool:
    """Every replica among *ports* has its master's data (a replica still in its first sync
    would lose everything if its master died now)."""
    for port in ports:
        with _client(cfg, port) as client:
            info = client.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
    return True


def start_cluster(
    cfg: ServicesConfig, ports: Sequence[int], *, replicas: int = 1, node_timeout_ms: int = 2000
) -> ClusterInfo:
    """Start a cluster on *ports* (masters first) unless it runs; form it the first time."""
    if len(ports) < 3 * (1 + replicas):
        raise ServiceError(f"a cluster needs at least {3 * (1 + replicas)} ports, got {len(ports)}")
    extra = [
        "cluster-enabled yes",
        "cluster-config-file nodes.conf",
        f"cluster-node-timeout {node_timeout_ms}",
        # a replica promotes itself however long it was cut off from its master
        "cluster-replica-validity-factor 0",
    ]
    pids: dict[int, int] = {}
    group = ClusterInfo(cfg.host, tuple(ports), pids)
    try:
        for port in ports:
            # the bus port is the port + 10000 unless named: a free one, any port works
            bus = [f"cluster-port {free_port()}"] if port + 10000 > _MAX_PORT else []
            directory = f"{CLUSTER_DIR}/{port}"
            pids[port] = start_redis(_member(cfg, port), directory=directory, extra=extra + bus).pid
        _form_cluster(cfg, ports, replicas)
    except BaseException:
        stop_group(cfg, group)
        raise
    logger.info("redis cluster of %d servers on %s", len(ports), ",".join(map(str, ports)))
    return group


def _form_cluster(cfg: ServicesConfig, ports: Sequence[int], replicas: int) -> None:
    first = _client(cfg, ports[0])
    try:
        info = first.execute_command("CLUSTER", "INFO").decode()  # type: ignore[no-untyped-call]
        known = int(info.split("cluster_known_nodes:")[1].split()[0])
        if known < len(ports):
            argv = ["redis-cli", "--cluster", "create"]
            argv += [netloc(cfg.host, port) for port in ports]
            argv += ["--cluster-replicas", str(replicas), "--cluster-yes"]
            env = dict(os.environ)
            if cfg.redis_password:  # through the environment, never onto a command line
                env["REDISCLI_AUTH"] = cfg.redis_password
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=60, check=False, env=env
            )
            if done.returncode != 0:
                raise ServiceError(f"redis-cli --cluster create failed: {done.stdout[-500:]}")

        def formed() -> bool:
            for port in ports:
                with _client(cfg, port) as client:
                    info = client.execute_command("CLUSTER", "INFO").decode()
                    if "cluster_state:ok" not in info or "cluster_slots_assigned:16384" not in info:
                        return False
            return True

        _wait("the cluster did not reach cluster_state:ok", formed, 30)
        _wait("the replicas did not finish their first sync", lambda: _synced(cfg, ports), 30)
    finally:
        first.close()


def start_sentinel_group(
    cfg: ServicesConfig,
    redis_ports: Sequence[int],
    sentinel_ports: Sequence[int],
    *,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
) -> SentinelInfo:
    """A master on ``redis_ports[0]``, replicas on the rest, sentinels on *sentinel_ports*."""
    pids: dict[int, int] = {}
    group = SentinelInfo(cfg.host, tuple(redis_ports), tuple(sentinel_ports), pids)
    try:
        _start_sentinel_group(cfg, group, down_after_ms, failover_timeout_ms)
    except BaseException:
        stop_group(cfg, group)
        raise
    return group


def _start_sentinel_group(
    cfg: ServicesConfig, group: SentinelInfo, down_after_ms: int, failover_timeout_ms: int
) -> None:
    master, *rest = group.redis_ports
    sentinel_ports, pids = group.sentinel_ports, group.pids
    pids[master] = start_redis(_member(cfg, master), directory=f"{SENTINEL_DIR}/{master}").pid
    for port in rest:
        extra = [f"replicaof {cfg.host} {master}"]
        info = start_redis(_member(cfg, port), directory=f"{SENTINEL_DIR}/{port}", extra=extra)
        pids[port] = info.pid
    quorum = len(sentinel_ports) // 2 + 1
    for port in sentinel_ports:
        extra = [
            f"sentinel monitor {MASTER_NAME} {cfg.host} {master} {quorum}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]
        if cfg.redis_password:
            extra.append(f"sentinel auth-pass {MASTER_NAME} {cfg.redis_password}")
        member = dataclasses.replace(_member(cfg, port), redis_password=None)
        info = start_redis(member, directory=f"{SENTINEL_DIR}/{port}", extra=extra, sentinel=True)
        pids[port] = info.pid

    def watched() -> bool:
        for port in sentinel_ports:
            with redis.Redis(cfg.host, port, socket_timeout=5) as sentinel:
                state = sentinel.sentinel_master(MASTER_NAME)
                if int(state.get("num-slaves", 0)) < len(rest):
                    return False
                if int(state.get("num-other-sentinels", 0)) < len(sentinel_ports) - 1:
                    return False
        return True

    _wait("the sentinels did not see every replica and each other", watched, 30)
    _wait("the replicas did not finish their first sync", lambda: _synced(cfg, rest), 30)


def stop_group(cfg: ServicesConfig, group: ClusterInfo | SentinelInfo) -> list[tuple[int, int]]:
    """Stop every server of *group* that still runs (by pidfile); ``(port, pid)`` of those."""
    if isinstance(group, ClusterInfo):
        members = [(port, f"{CLUSTER_DIR}/{port}") for port in group.ports]
    else:
        members = [(port, f"{SENTINEL_DIR}/{port}") for port in group.sentinel_ports]
        members += [(port, f"{SENTINEL_DIR}/{port}") for port in group.redis_ports]
    stopped = []
    for port, directory in members:
        pid = running_pid(_member(cfg, port), directory)
        if stop_service(_member(cfg, port), "redis", directory) and pid is not None:
            stopped.append((port, pid))
    return stopped
