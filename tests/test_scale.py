"""How many nodes are useful now: read from a real Redis laid out as the frontier writes it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from project.monitoring.metrics import render_metrics
from project.monitoring.scale import DEFAULT_NODE_SLOTS, SiteSlots, scale_view
from project.monitoring.status import fleet_status
from tests.fleet import queue_requests

if TYPE_CHECKING:
    import redis

    from project.frontier.keys import FrontierKeys


def _queue(client: redis.Redis, keys: FrontierKeys, sites: dict[str, int]) -> None:
    """Requests queued per site, by the frontier's own script (lua/requeue_dead.lua)."""
    queue_requests(
        client,
        keys,
        ((site, {"url": f"http://{site}/{i}"}) for site, n in sites.items() for i in range(n)),
    )


def _node(client: redis.Redis, keys: FrontierKeys, name: str, concurrency: int) -> None:
    now_ms = int(client.time()[0]) * 1000
    client.hset(keys.nodes, name, json.dumps({"id": name, "concurrency": concurrency}))
    client.zadd(keys.alive, {name: now_ms + 60_000})


def test_site_slots_take_the_least_of_work_cap_and_rate() -> None:
    slots = SiteSlots()
    slots.add(work=10, concurrency=0, rate=0.0, latency=None, paused=False)  # its work: 10
    slots.add(work=10, concurrency=3, rate=0.0, latency=None, paused=False)  # its cap: 3
    slots.add(work=10, concurrency=8, rate=0.5, latency=4.0, paused=False)  # 0.5/s x 4 s: 2
    slots.add(work=10, concurrency=8, rate=0.1, latency=1.0, paused=False)  # at least 1
    slots.add(work=10, concurrency=8, rate=0.0, latency=None, paused=True)  # waits: none
    slots.add(work=0, concurrency=8, rate=0.0, latency=None, paused=False)  # nothing to do
    assert (slots.slots, slots.sites, slots.capped, slots.paused) == (16, 4, 3, 1)
    assert scale_view(slots, [], 0)["useful_nodes"] == 16 // DEFAULT_NODE_SLOTS
    assert scale_view(SiteSlots(), [], seeds_waiting=1)["useful_nodes"] == 1
    assert scale_view(SiteSlots(), [], seeds_waiting=0)["useful_nodes"] == 0


def test_many_sites_need_many_nodes_one_capped_site_one(redis_client, keyspace) -> None:
    keys = keyspace.keys("products")
    redis_client.hset(keys.limits, "*", "0 2")  # every site: 2 downloads at once, fleet-wide
    _queue(redis_client, keys, {f"shop{i}.test": 10 for i in range(50)})
    _node(redis_client, keys, "a:1", 8)
    _node(redis_client, keys, "b:2", 8)

    scale = fleet_status(redis_client, keys)["scale"]
    assert scale == {
        "useful_nodes": 13,  # 50 sites x 2 = 100 downloads at once, 8 a node
        "usable_slots": 100,
        "node_slots": 8,
        "sites_with_work": 50,
        "sites_capped": 50,
        "sites_paused": 0,
        "sites_not_read": 0,
        "nodes_alive": 2,
    }
    metrics = render_metrics(fleet_status(redis_client, keys))
    assert 'fleetcrawl_useful_nodes{spider="products"} 13.0' in metrics

    # what is left is one site capped at 1: one node is worth running, however much it has
    other = keyspace.keys("other")
    redis_client.hset(other.limits, "*", "0 1")
    _queue(redis_client, other, {"big.test": 500})
    _node(redis_client, other, "a:1", 8)
    assert fleet_status(redis_client, other)["scale"]["useful_nodes"] == 1


def test_a_paused_or_rate_limited_site_asks_for_few_nodes(redis_client, keyspace) -> None:
    keys = keyspace.keys("products")
    _queue(redis_client, keys, {"paused.test": 100, "slow.test": 100})
    now_ms = int(redis_client.time()[0]) * 1000
    redis_client.zadd(keys.throttled, {"paused.test": now_ms + 600_000})  # a block's pause
    redis_client.hset(keys.limits, "slow.test", "0.5 8")  # half a request a second
    redis_client.hset(keys.lat_sum, "slow.test", 6.0)
    redis_client.hset(keys.lat_n, "slow.test", 3)  # 2 s a download: 1 at once
    scale = fleet_status(redis_client, keys)["scale"]
    assert (scale["useful_nodes"], scale["usable_slots"], scale["sites_paused"]) == (1, 1, 1)
