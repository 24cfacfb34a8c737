"""Status reads sites in a bounded number of round trips, and lists only the busy ones, against
a real Redis laid out as the frontier writes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from project.monitoring.status import (
    SITES_LISTED,
    StatusReader,
    fleet_status,
    frontier_snapshot,
)
from tests.fleet import lease_one_each, queue_requests

if TYPE_CHECKING:
    from project.frontier.keys import FrontierKeys


class CountingConnection(redis.Connection):
    """A connection that counts what it sends: one send is one round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def _fill(client: redis.Redis, keys: FrontierKeys, sites: int, idle: int) -> None:
    """*sites* busy sites (two priorities queued, one lease each) and *idle* done ones; the
    requests queued by the frontier's own script (lua/requeue_dead.lua puts them back)."""
    requests = []
    seq = 0
    for i in range(sites):
        site = f"shop{i}.test"
        for priority, count in ((10, 1), (0, i + 1)):
            for _ in range(count):
                seq += 1
                requests.append((site, {"url": f"http://{site}/{seq}", "priority": priority}))
    queue_requests(client, keys, requests)
    # the five leased had been queued (pushed)
    lease_one_each(client, keys, (f"shop{i}.test" for i in range(sites)), granted=5, pushed=5)
    for i in range(idle):
        client.hincrby(keys.leases, f"done{i}.test", 3)  # a lease counter the frontier kept


def _round_trips(redis_url: str, keys: FrontierKeys) -> tuple[int, dict[str, Any]]:
    client = redis.Redis.from_url(redis_url, connection_class=CountingConnection)
    try:
        client.ping()  # connecting sends HELLO and CLIENT SETINFO: not the status' doing
        CountingConnection.sent = 0
        status = fleet_status(client, keys)
        return CountingConnection.sent, status
    finally:
        client.close()


def test_status_round_trips_do_not_grow_with_sites(redis_url, redis_client, keyspace):
    """A fixed number of round trips, however many sites were ever seen (once 7+ per site)."""
    few, many = keyspace.keys("few"), keyspace.keys("many")
    _fill(redis_client, few, sites=3, idle=5)
    _fill(redis_client, many, sites=300, idle=2000)

    trips_few, status_few = _round_trips(redis_url, few)
    trips_many, status_many = _round_trips(redis_url, many)

    print(f"round trips: {trips_few} with 3 sites, {trips_many} with 300 (+2000 idle)")
    assert trips_many == trips_few
    # fleet: 2, sites: 2 pipelines, bands: the priorities, then their sizes
    assert trips_many <= 2 + 2 + 2
    assert len(status_few["sites"]) == 3
    assert len(status_many["sites"]) == SITES_LISTED
    assert status_many["site_count"] == {"with_work": 300, "listed": 20, "known": 2300}


def test_status_lists_the_busiest_sites_not_every_site_ever_seen(redis_client, keyspace) -> None:
    """Sites with nothing queued, in flight or leased lately are counted, not listed."""
    keys = keyspace.keys("products")
    _fill(redis_client, keys, sites=30, idle=50)
    now_ms = int(redis_client.time()[0]) * 1000
    # An idle site leased a moment ago (<prefix>:recent says when) is still listed.
    redis_client.hset(keys.leases, "recent.test", 7)
    redis_client.zadd(keys.recent, {"recent.test": now_ms, "done0.test": now_ms - 3_600_000})

    snapshot = frontier_snapshot(redis_client, keys, sites=40)
    listed = [row["site"] for row in snapshot["sites"]]
    assert listed[:3] == ["shop29.test", "shop28.test", "shop27.test"], "most queued first"
    assert listed[-1] == "recent.test"
    assert len(listed) == 31, "none of the 50 done sites"
    assert snapshot["site_count"] == {"with_work": 30, "listed": 31, "known": 81}
    top = snapshot["sites"][0]
    assert (top["queued"], top["in_flight"], top["leases"], top["state"]) == (31, 1, 5, "ready")
    assert top["queued_by_priority"] == {10: 1, 0: 30}
    assert snapshot["sites"][-1]["state"] == "idle"
    # The listed sites' bands add up to every queued request here (all sites are listed).
    assert snapshot["queued_by_priority"] == {10: 30, 0: sum(range(1, 31))}

    few = frontier_snapshot(redis_client, keys, sites=5)
    assert [row["site"] for row in few["sites"]] == listed[:5]
    assert few["queued_by_priority"] == {10: 5, 0: 30 + 29 + 28 + 27 + 26}

    # A site the reader listed last time stays one more read if it was leased since.
    seen = {"done1.test": 3, "done2.test": 2}
    again = frontier_snapshot(redis_client, keys, sites=40, previous_leases=seen)
    assert "done2.test" in [row["site"] for row in again["sites"]]
    assert "done1.test" not in [row["site"] for row in again["sites"]]


def test_status_survives_hostile_site_entries(redis_client, keyspace) -> None:
    """A site queue of the older layout (a sorted set of payloads) is counted too."""
    keys = keyspace.keys("products")
    site = b"caf\xe9.test:8080"  # not UTF-8: listed, and read back under its own bytes
    queue = keys.older_site_queue("").encode() + site
    redis_client.zadd(queue, {b'{"url":"x"}': 5})
    redis_client.zadd(keys.queue, {site: 5})
    redis_client.hset(keys.limits, site, "fast lots")  # not "rate concurrency"
    redis_client.hset(keys.limits, "*", "2.5 4")
    redis_client.hset(keys.rates, site, "nan")
    redis_client.zadd(keys.inflight, {b"node\nSraw seed": 1, b"no newline": 2})

    (row,) = frontier_snapshot(redis_client, keys)["sites"]
    assert row["site"].encode("utf-8", "surrogateescape") == site
    assert (row["queued"], row["queued_by_priority"]) == (1, {0: 1})
    assert (row["allowed_rate"], row["concurrency"]) == (2.5, 4), "the fleet's defaults"


def test_reader_computes_achieved_rates_across_a_forgotten_counter(
    redis_url, redis_client, keyspace
) -> None:
    keys = keyspace.keys("products")
    _fill(redis_client, keys, sites=1, idle=0)
    reader = StatusReader(redis_url, keys, sites=5)
    try:
        assert reader.read()["sites"][0]["achieved_rate"] is None
        # The frontier forgot the site's counter (it was done) and counted again from 0.
        redis_client.hset(keys.leases, "shop0.test", 2)
        (site,) = reader.read()["sites"]
        assert site["achieved_rate"] > 0
    finally:
        reader.close()
