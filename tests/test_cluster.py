"""The frontier on a real Redis Cluster: three masters and three replicas of Debian's
redis-server, a spider's keys in one slot, and a master killed mid-crawl."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
import redis.cluster

from project.frontier.connection import RedisTarget
from project.ops.services import ServicesConfig, free_port
from project.ops.topology import ClusterInfo, start_cluster, stop_group
from tests.failover import NODE, PRODUCTS, SHOP, LossProbe, crawl_outcome, slot_master
from tests.fleet import WAIT_FOR_SEED, Fleet, KeySpace, run_cli, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator


pytestmark = pytest.mark.crawl


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServicesConfig, ClusterInfo]]:
    cfg = ServicesConfig(state_dir=tmp_path / "state")
    group = start_cluster(cfg, [free_port() for _ in range(6)])
    try:
        yield cfg, group
    finally:
        stop_group(cfg, group)


@pytest.fixture
def cluster_fleet(
    cluster: tuple[ServicesConfig, ClusterInfo], services, mongo_db: str, tmp_path: Path
) -> Iterator[Fleet]:
    _, group = cluster
    space = KeySpace(tagged=True)
    crew = Fleet(
        redis_url=group.url,
        mongo_url=services.mongo_url,
        mongo_db=mongo_db,
        log_dir=tmp_path,
        space=space,
        settings={"REDIS_CLUSTER_NODES": group.nodes, **NODE, **WAIT_FOR_SEED},
        # every server, as the nodes get them: the one in group.url may be the one killed
        target=RedisTarget(
            group.url, cluster=True, cluster_nodes=tuple((group.host, p) for p in group.ports)
        ),
    )
    yield crew
    crew.stop()


def test_two_nodes_crawl_on_a_cluster_with_every_key_in_the_seeds_slot(
    cluster_fleet: Fleet, cluster, make_shop, mongo
) -> None:
    _, group = cluster
    shop = make_shop(products=PRODUCTS)
    cluster_fleet.start_node()
    cluster_fleet.start_node()
    cluster_fleet.wait_ready()
    cluster_fleet.seed(shop.url("/"))  # redis-cli -c lpush, as users seed
    assert cluster_fleet.wait(180) == [0, 0], cluster_fleet.log(0)[-3000:]

    outcome = crawl_outcome(shop, mongo)
    assert outcome["stored"] == outcome["documents"] == PRODUCTS
    assert outcome["pages_fetched_twice"] == 0
    keys = cluster_fleet.keys
    client = cluster_fleet.client()
    try:
        found = cluster_fleet.space.existing(client)
        assert len(found) > 5
        slots = {client.keyslot(key) for key in found}
        assert slots == {client.keyslot(keys.start_urls)}, found
        assert keys.start_urls.startswith(cluster_fleet.space.prefix)  # its name unchanged
    finally:
        client.close()
    done = run_cli(
        "status",
        "--json",
        "-s",
        f"REDIS_CLUSTER_NODES={json.dumps(group.nodes)}",
        *cluster_fleet.space.cli_args(),
        env={"MONGO_URI": cluster_fleet.mongo_url, "MONGO_DATABASE": cluster_fleet.mongo_db},
    )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["queued"] == status["in_flight"] == 0, status
    assert status["seen"] >= PRODUCTS, status
    seen = run_cli(
        "seen",
        "info",
        "-s",
        f"REDIS_CLUSTER_NODES={','.join(group.nodes)}",
        *cluster_fleet.space.cli_args(),
        env={},
    )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.startswith(f"{keys.dupefilter}: "), seen.stdout
    assert '"mode": "set"' in seen.stdout, seen.stdout


def test_a_killed_master_mid_crawl_is_replaced_by_its_replica_and_the_crawl_completes(
    cluster_fleet: Fleet, cluster, make_shop, mongo
) -> None:
    _, group = cluster
    shop = make_shop(products=PRODUCTS, **SHOP)
    keys = cluster_fleet.keys
    serving = slot_master(group, keys.start_urls)
    assert serving is not None
    port, pid = serving
    tag = keys.queue[: keys.queue.index("}") + 1]

    def master() -> redis.Redis:
        return redis.Redis(group.host, port, socket_timeout=5)

    cluster_fleet.start_node()
    cluster_fleet.start_node()
    cluster_fleet.wait_ready()
    cluster_fleet.seed(shop.url("/"))
    probe = LossProbe(master, f"{tag}:probe:plain", f"{tag}:probe:waited", replicas=1).start()
    wait_for(lambda: mongo.products.count_documents({}) >= PRODUCTS // 4, 120, "a quarter stored")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def promoted() -> bool:
        now = slot_master(group, keys.start_urls, dead=port)
        return now is not None and now[0] != port

    wait_for(promoted, 30, "a replica promoted", interval=0.1)
    promoted_after = time.monotonic() - killed_at
    stored_at_promotion = mongo.products.count_documents({})
    client = cluster_fleet.client()
    try:
        losses = probe.losses(client)
    finally:
        client.close()
    assert cluster_fleet.wait(240) == [0, 0], cluster_fleet.log(0)[-3000:]

    outcome = crawl_outcome(shop, mongo)
    figures = {
        **outcome,
        **losses,
        "promoted_after_s": round(promoted_after, 2),
        "stored_at_promotion": stored_at_promotion,
    }
    print("cluster failover:", json.dumps(figures))
    (Path(cluster_fleet.log_dir) / "failover.json").write_text(json.dumps(figures))
    # Nothing lost: the frontier's every change is one script, so a failover that drops the
    # last acknowledged writes rewinds it to an earlier whole state: pages whose acks were
    # lost are leased again (fetched twice), items are upserts (stored once).
    assert outcome["lost"] == 0
    assert outcome["documents"] == PRODUCTS
    assert losses["lost_waited"] == 0  # WAIT 1: on the replica that took over
    for index in (0, 1):
        log = cluster_fleet.log(index)
        assert "Traceback" not in log, log[-3000:]
    # the failover came mid-crawl. (A node need not see an error: redis-py's cluster client
    # retries a command with backoff while the slot has no master; one suite run saw the
    # whole 4 s failover absorbed so, frontier/redis_errors 0 on both nodes.)
    assert stored_at_promotion < PRODUCTS, figures
