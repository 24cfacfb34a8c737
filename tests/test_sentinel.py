"""The frontier behind Redis Sentinel: a master, two replicas, three sentinels; the master
killed with -9 mid-crawl, a replica promoted, the nodes finding it by themselves."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import TYPE_CHECKING

import pytest
import redis

from project.frontier.connection import RedisTarget
from project.ops.services import ServicesConfig, free_port
from project.ops.topology import SentinelInfo, start_sentinel_group, stop_group
from tests.failover import NODE, PRODUCTS, SHOP, LossProbe, crawl_outcome
from tests.fleet import WAIT_FOR_SEED, Fleet, KeySpace, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.crawl


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[tuple[ServicesConfig, SentinelInfo]]:
    cfg = ServicesConfig(state_dir=tmp_path / "state")
    group = start_sentinel_group(
        cfg, [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    )
    try:
        yield cfg, group
    finally:
        stop_group(cfg, group)


def _master_port(group: SentinelInfo) -> int:
    """The master's port as a majority of the sentinels name it."""
    named = []
    for port in group.sentinel_ports:
        try:
            with redis.Redis(group.host, port, socket_timeout=2) as sentinel:
                _host, master = sentinel.sentinel_get_master_addr_by_name(group.master_name)
                named.append(int(master))
        except (redis.RedisError, TypeError):
            continue
    return max(set(named), key=named.count) if named else 0


@pytest.mark.slow("sentinels notice a dead master after a second and promote a replica mid-crawl")
def test_a_killed_master_is_replaced_by_sentinels_and_the_nodes_follow(
    sentinel_group, services, mongo_db: str, tmp_path: Path, make_shop, mongo
) -> None:
    _, group = sentinel_group
    target = RedisTarget(
        f"redis://{group.host}:{group.redis_ports[0]}/0",
        sentinels=tuple((group.host, port) for port in group.sentinel_ports),
        sentinel_master=group.master_name,
    )
    fleet = Fleet(
        redis_url=target.url,
        mongo_url=services.mongo_url,
        mongo_db=mongo_db,
        log_dir=tmp_path,
        space=KeySpace(),
        settings={
            "REDIS_SENTINELS": group.sentinels,
            "REDIS_SENTINEL_MASTER": group.master_name,
            **NODE,
            **WAIT_FOR_SEED,
        },
        target=target,
    )
    try:
        shop = make_shop(products=PRODUCTS, **SHOP)
        master = _master_port(group)
        assert master == group.redis_ports[0]
        fleet.start_node()
        fleet.start_node()
        fleet.wait_ready()
        fleet.seed(shop.url("/"))
        probe = LossProbe(
            lambda: redis.Redis(group.host, master, socket_timeout=5),
            f"{fleet.space.prefix}:probe:plain",
            f"{fleet.space.prefix}:probe:waited",
            replicas=2,  # either replica may be promoted
        ).start()
        wait_for(
            lambda: mongo.products.count_documents({}) >= PRODUCTS // 4, 120, "a quarter stored"
        )
        killed_at = time.monotonic()
        os.kill(group.pids[master], signal.SIGKILL)
        wait_for(lambda: _master_port(group) not in (0, master), 30, "a replica promoted", 0.1)
        promoted_after = time.monotonic() - killed_at
        with fleet.client() as client:
            losses = probe.losses(client)
        assert fleet.wait(240) == [0, 0], fleet.log(0)[-3000:]
    finally:
        fleet.stop()

    outcome = crawl_outcome(shop, mongo)
    figures = {**outcome, **losses, "promoted_after_s": round(promoted_after, 2)}
    print("sentinel failover:", json.dumps(figures))
    assert outcome["lost"] == 0
    assert outcome["documents"] == PRODUCTS
    assert losses["lost_waited"] == 0  # WAIT 2: on whichever replica took over
    for index in (0, 1):
        log = fleet.log(index)
        assert "Traceback" not in log, log[-3000:]
    assert any(fleet.stat(i, "frontier/redis_errors") for i in (0, 1)), "nobody saw the kill"
