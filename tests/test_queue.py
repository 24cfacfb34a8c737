"""The leased queue's Lua steps against a real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

import pytest
import redis.asyncio

from project.queue import FrontierKeys, LeasedQueue, StepBatch

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import redis as sync_redis

KEYS = FrontierKeys.for_spider("products")


def run(redis_url: str, scenario: Callable[..., Awaitable[None]]) -> None:
    async def main() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            queues = [
                LeasedQueue(client, None, KEYS, node, lease_ms=300)  # type: ignore[arg-type]
                for node in ("node-a", "node-b")
            ]
            await scenario(*queues)
        finally:
            await client.aclose()

    asyncio.run(main())


def entry(
    n: int, priority: int = 0, mode: bytes = b"f", tag: int = 0, site: str = "s"
) -> tuple[bytes, str, int, bytes]:
    """A queue entry; real payloads carry a unique id, *tag* stands for it."""
    payload = b'{"url":"http://%s/%d","priority":%d,"id":%d}' % (site.encode(), n, priority, tag)
    return (mode + b"fp%d" % n, site, priority, payload)


def test_priority_first_then_first_in_first_out(redis_url: str) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        entries = [entry(n, priority=10 if n % 3 == 0 else 0) for n in range(30)]
        await a.step(StepBatch(enqueue=entries[:15]))
        await a.step(StepBatch(enqueue=entries[15:]))
        result = await a.step(StepBatch(want=30))
        urls = [json.loads(p)["url"] for p, _ in result.leased]
        high = [n for n in range(30) if n % 3 == 0]
        assert urls == [f"http://s/{n}" for n in high + [n for n in range(30) if n % 3]]

    run(redis_url, scenario)


def test_duplicates_are_filtered_in_and_across_batches(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        first = await a.step(StepBatch(enqueue=[entry(1), entry(2), entry(1)]))
        assert (first.added, first.duplicates) == (2, 1)
        second = await a.step(StepBatch(enqueue=[entry(2), entry(3)]))
        assert (second.added, second.duplicates) == (1, 1)
        # dont_filter requests pass, but still mark their URL as seen
        third = await a.step(StepBatch(enqueue=[entry(3, mode=b"m", tag=1), entry(4, mode=b"m")]))
        assert (third.added, third.duplicates) == (2, 0)
        fourth = await a.step(StepBatch(enqueue=[entry(4)]))
        assert (fourth.added, fourth.duplicates) == (0, 1)

    run(redis_url, scenario)
    assert redis_client.scard(KEYS.dupefilter) == 4
    assert redis_client.zcard(KEYS.site_queue("s")) == 5
    assert int(redis_client.get(KEYS.queued)) == 5


def test_expired_lease_goes_back_and_heartbeat_keeps_it(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1), entry(2)]))
        leased = await a.step(StepBatch(want=2))
        kept, dropped = (a.request_member(p) for p, _ in leased.leased)
        assert redis_client.zcard(KEYS.inflight) == 2
        for _ in range(4):  # node a heartbeats only the first lease
            await asyncio.sleep(0.15)
            await a.step(StepBatch(heartbeat=[kept]))
        reaped = await b.step(StepBatch(maintain=True, want=5))
        assert reaped.reaped == 1
        assert [p for p, _ in reaped.leased] == [dropped[len(a.member_prefix) + 1 :]]
        assert redis_client.zscore(KEYS.inflight, kept) is not None
        # acking a lease that was reaped and re-leased elsewhere is harmless
        await a.step(StepBatch(acks=[dropped, kept]))
        assert redis_client.zcard(KEYS.inflight) == 1

    run(redis_url, scenario)


def test_leased_seeds_of_a_dead_node_return_to_start_urls(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    redis_client.lpush(KEYS.start_urls, b"http://s/1", b"http://s/2")

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        taken = await a.step(StepBatch(seed_want=1))
        assert taken.seeds == [b"http://s/1"]
        await asyncio.sleep(0.4)
        result = await b.step(StepBatch(maintain=True))
        assert result.reaped == 1
        assert result.counts == (0, 0, 0, 2)

    run(redis_url, scenario)
    assert sorted(redis_client.lrange(KEYS.start_urls, 0, -1)) == [b"http://s/1", b"http://s/2"]


def test_retry_waits_for_its_time_then_any_node_takes_it(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, priority=3)]))
        ((payload, _),) = (await a.step(StepBatch(want=1))).leased
        not_before = int(time.time() * 1000) + 250
        retry = b'{"url":"http://s/1","priority":3,"meta":{"retry_times":1}}'
        await a.step(StepBatch(retries=[(a.request_member(payload), not_before, retry)]))
        early = await b.step(StepBatch(maintain=True, want=1))
        assert (early.promoted, early.leased, early.counts) == (0, [], (0, 1, 0, 0))
        await asyncio.sleep(0.3)
        late = await b.step(StepBatch(maintain=True, want=1))
        assert late.promoted == 1
        assert [p for p, _ in late.leased] == [retry]

    run(redis_url, scenario)


def test_dead_letters_leave_the_inflight_set(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1)]))
        ((payload, _),) = (await a.step(StepBatch(want=1))).leased
        await a.step(StepBatch(dead=[(a.request_member(payload), b'{"url":"http://s/1"}')]))

    run(redis_url, scenario)
    assert redis_client.zcard(KEYS.inflight) == 0
    assert redis_client.lrange(KEYS.dead, 0, -1) == [b'{"url":"http://s/1"}']


@pytest.mark.parametrize("members", [0, 3])
def test_release_puts_unstarted_leases_back(
    redis_url: str, redis_client: sync_redis.Redis, members: int
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(3)]))
        leased = (await a.step(StepBatch(want=members))).leased
        assert await a.release([a.request_member(p) for p, _ in leased]) == members

    run(redis_url, scenario)
    assert redis_client.zcard(KEYS.site_queue("s")) == 3
    assert int(redis_client.get(KEYS.queued)) == 3
    assert redis_client.zcard(KEYS.inflight) == 0


def test_clear_frontier_deletes_site_queues_too(
    redis_url: str, redis_client: sync_redis.Redis
) -> None:
    from project.status import clear_frontier

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, site="s"), entry(2, site="t")], want=1))

    run(redis_url, scenario)
    redis_client.lpush(KEYS.start_urls, b"http://s/")
    assert redis_client.exists(KEYS.site_queue("t"), KEYS.inflight, KEYS.dupefilter) == 3
    clear_frontier(redis_client, "products")
    assert redis_client.keys("products:*") == []
