"""Failover benchmark: what a kill -9 of the Redis master loses, and what WAIT buys.

    python -m tests.benchmarks.failover [--rounds 5] [--shape cluster|sentinel|both]

Each round starts a fresh cluster (3 masters, 3 replicas) or Sentinel group (a master,
2 replicas, 3 sentinels) on loopback, runs two writers against the master at full speed
(``tests/failover.py``: one counts plain ``INCR`` replies, one only those that ``WAIT``
saw on the replicas), kills the master with -9 and waits for the promotion. It prints,
per shape, the medians over the rounds: acknowledged writes lost, the loss window (lost
writes over the plain writer's rate, in ms), the writes/s with and without WAIT (WAIT's
cost, as a ratio), and the time until a replica served again.

The frontier's own loss is that window's steps rewound (see docs/scale.md): leases and
acks of those milliseconds are done again, nothing is lost; a seed pushed in the window
with a plain ``lpush`` is the one thing a failover can drop.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.cluster
import redis.sentinel

from project.ops.services import ServicesConfig, free_port
from project.ops.topology import start_cluster, start_sentinel_group, stop_group
from tests.failover import LossProbe, slot_master

_WRITE_SECONDS = 3.0


def _cluster_round(cfg: ServicesConfig) -> dict[str, float]:
    group = start_cluster(cfg, [free_port() for _ in range(6)])
    try:
        serving = slot_master(group, "{bench}")
        assert serving is not None
        port = serving[0]
        survivor = redis.cluster.RedisCluster(group.host, next(p for p in group.ports if p != port))
        return _round(group.host, port, group.pids[port], survivor, 1, "{bench}")
    finally:
        stop_group(cfg, group)


def _sentinel_round(cfg: ServicesConfig) -> dict[str, float]:
    group = start_sentinel_group(
        cfg, [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    )
    try:
        master = group.redis_ports[0]
        survivor = redis.sentinel.Sentinel(
            [(group.host, port) for port in group.sentinel_ports], socket_timeout=5
        ).master_for(group.master_name, socket_timeout=5)
        return _round(group.host, master, group.pids[master], survivor, 2, "bench")
    finally:
        stop_group(cfg, group)


def _round(
    host: str, port: int, pid: int, survivor: Any, replicas: int, tag: str
) -> dict[str, float]:
    probe = LossProbe(
        lambda: redis.Redis(host, port, socket_timeout=5),
        f"{tag}:plain",
        f"{tag}:waited",
        replicas=replicas,
        interval=0.0,
    ).start()
    time.sleep(_WRITE_SECONDS)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            survivor.set(f"{tag}:after", 1)
            break
        except redis.RedisError:
            if time.monotonic() - killed > 60:
                raise
            time.sleep(0.05)
    serving_after = time.monotonic() - killed
    losses = probe.losses(survivor)
    waited = probe.writers[1]
    losses["waited_writes_per_s"] = waited.acked / max(1e-9, waited.ended - waited.started)
    losses["serving_after_s"] = serving_after
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=["cluster", "sentinel", "both"], default="both")
    args = parser.parse_args()
    shapes = ["cluster", "sentinel"] if args.shape == "both" else [args.shape]
    rounds = {"cluster": _cluster_round, "sentinel": _sentinel_round}
    print(f"{args.rounds} rounds per shape, {_WRITE_SECONDS:g} s of writes, then kill -9")
    print(
        f"{'shape':>8} {'writes/s':>9} {'lost':>5} {'window ms':>9} {'WAIT writes/s':>13}"
        f" {'x plain':>7} {'lost w/ WAIT':>12} {'serving s':>9}"
    )
    for shape in shapes:
        results = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as state:
                results.append(rounds[shape](ServicesConfig(state_dir=Path(state))))

        def median(name: str, results: list[dict[str, float]] = results) -> float:
            return statistics.median(r[name] for r in results)

        plain, waited = median("plain_writes_per_s"), median("waited_writes_per_s")
        print(
            f"{shape:>8} {plain:9.0f} {median('lost_plain'):5.0f} {median('window_ms'):9.2f}"
            f" {waited:13.0f} {waited / plain:7.2f} {median('lost_waited'):12.0f}"
            f" {median('serving_after_s'):9.2f}"
        )
        print(
            f"{'':>8} lost per round: {[int(r['lost_plain']) for r in results]},"
            f" with WAIT: {[int(r['lost_waited']) for r in results]}"
        )


if __name__ == "__main__":
    main()
