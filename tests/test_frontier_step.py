"""The frontier's Lua scripts against a real Redis, phase by phase (project/frontier/lua/)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis.asyncio

from project.frontier import lua
from project.frontier.admin import clear_frontier, retry_dead_letters
from project.frontier.config import SiteLimits
from project.frontier.keys import FrontierKeys, hash_tag
from project.frontier.queue import Counts, LeasedQueue, StepBatch
from project.frontier.site_queues import site_queue_size

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import redis as sync_redis

UNLIMITED = SiteLimits(concurrency=0)


def run(
    redis_url: str,
    keys: FrontierKeys,
    scenario: Callable[..., Awaitable[None]],
    limits: SiteLimits = UNLIMITED,
    lease_ms: int = 300,
) -> None:
    """Run *scenario* with two nodes' queues, ``node-a`` and ``node-b``."""

    async def main() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            queues = [
                LeasedQueue(client, None, keys, node, lease_ms, limits)  # type: ignore[arg-type]
                for node in ("node-a", "node-b")
            ]
            await scenario(*queues)
        finally:
            await client.aclose()

    asyncio.run(main())


def entry(
    n: int, priority: int = 0, mode: bytes = b"f", tag: int = 0, site: str = "s", scope: str = ""
) -> tuple[bytes, str, int, bytes, str]:
    """A queue entry; real payloads carry a unique id, *tag* stands for it."""
    payload = b'{"url":"http://%s/%d","priority":%d,"id":%d}' % (site.encode(), n, priority, tag)
    return (mode + b"fp%d" % n, site, priority, payload, scope)


def urls(result) -> list[str]:
    return [json.loads(leased.payload)["url"] for leased in result.leased]


# -- phase 1: enqueue ---------------------------------------------------------------------


def test_enqueue_filters_duplicates_in_and_across_batches(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
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

    run(redis_url, keys, scenario)
    assert redis_client.scard(keys.dupefilter) == 4
    assert site_queue_size(redis_client, keys, "s") == 5
    assert int(redis_client.get(keys.queued)) == 5


async def _join(queue: LeasedQueue, run: str) -> None:
    """The queue's node joins the crawl run *run* (lua/run_join.lua), as the run tracker does."""
    script = lua.load("run_join")
    keys = script.keys_from(queue.keys)
    await queue.server.eval(script.source, len(keys), *keys, queue.node_id, run, "0")


async def _end_run(queue: LeasedQueue, run: str) -> None:
    """The fleet fetches what is queued and its last node leaves the run (lua/run_leave.lua)."""
    leased = (await queue.step(StepBatch(want=100))).leased
    await queue.step(StepBatch(acks=[queue.request_member(e.site, e.payload) for e in leased]))
    script = lua.load("run_leave")
    keys = script.keys_from(queue.keys)
    reply = await queue.server.eval(script.source, len(keys), *keys, queue.node_id, run, "{}")
    assert reply[0] == b"final"


def test_a_seed_is_queued_once_in_a_run_whose_seen_set_began_empty(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """Seeds skip the filter so tomorrow's crawl fetches them again; within one run a seed
    whose URL is queued already (pushed twice, or linked by a page fetched before start()
    yielded it) is a duplicate."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        a.runs = b.runs = True
        # before any node joined: once in a batch, and the run that begins is fresh
        first = await a.step(StepBatch(enqueue=[entry(1, mode=b"s"), entry(1, mode=b"s")]))
        assert (first.added, first.duplicates) == (1, 1)
        await _join(a, "run-1")
        assert redis_client.hget(keys.runs, "fresh") == b"1"
        # a page of the crawl links a URL, and start() yields it later
        await b.step(StepBatch(enqueue=[entry(2)]))
        late = await a.step(StepBatch(enqueue=[entry(2, mode=b"s"), entry(1, mode=b"s")]))
        assert (late.added, late.duplicates) == (0, 2)
        # what the user marked dont_filter is queued again, as Scrapy says
        again = await b.step(StepBatch(enqueue=[entry(2, mode=b"m", tag=1)]))
        assert (again.added, again.duplicates) == (1, 0)

    run(redis_url, keys, scenario)
    assert site_queue_size(redis_client, keys, "s") == 3


def test_a_seed_is_queued_once_in_each_run_of_a_persisted_seen_set(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        a.runs = b.runs = True
        await a.step(StepBatch(enqueue=[entry(1, mode=b"s"), entry(2), entry(3)]))
        await _join(a, "run-1")
        await _end_run(a, "run-1")
        # the next run: the seen-set holds yesterday's URLs, the seed goes again, once
        await _join(a, "run-2")
        await _join(b, "run-2")
        assert redis_client.hget(keys.runs, "fresh") == b"0"
        second = await a.step(StepBatch(enqueue=[entry(1, mode=b"s")]))
        assert (second.added, second.duplicates) == (1, 0)
        twice = await b.step(StepBatch(enqueue=[entry(1, mode=b"s"), entry(2, mode=b"s")]))
        assert (twice.added, twice.duplicates) == (1, 1)
        again = await b.step(StepBatch(enqueue=[entry(2, mode=b"s"), entry(2)]))
        assert (again.added, again.duplicates) == (0, 2)
        # a link to a URL of yesterday's crawl is dropped; its seed in the same batch goes
        linked = await a.step(StepBatch(enqueue=[entry(3), entry(3, mode=b"s", tag=1)]))
        assert (linked.added, linked.duplicates) == (1, 1)

    run(redis_url, keys, scenario)
    assert site_queue_size(redis_client, keys, "s") == 3
    assert redis_client.smembers(keys.runs + ":seeds") == {b"fp1", b"fp2", b"fp3"}


def test_a_run_whose_nodes_all_died_after_its_work_ends_when_the_next_crawl_joins(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """Killed before they could leave, its nodes never end it; the next crawl's seeds are
    not that run's duplicates."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        a.runs = b.runs = True
        await _join(a, "run-1")
        await a.step(StepBatch(enqueue=[entry(1, mode=b"s")]))
        leased = (await a.step(StepBatch(want=10))).leased
        await a.step(StepBatch(acks=[a.request_member(e.site, e.payload) for e in leased]))
        # node-a is killed: its presence expired long ago; node-b alive, starting tomorrow
        redis_client.zadd(keys.alive, {"node-a": 1, "node-b": 2**40})
        await _join(b, "run-2")
        assert redis_client.hget(keys.runs, "id") == b"run-2"
        tomorrow = await b.step(StepBatch(enqueue=[entry(1, mode=b"s")]))
        assert (tomorrow.added, tomorrow.duplicates) == (1, 0)

    run(redis_url, keys, scenario)
    assert redis_client.smembers(keys.runs + ":members") == {b"node-b"}


def test_without_crawl_runs_a_seed_is_queued_each_time_it_is_pushed(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """RUNS_ENABLED off: no run says when a seed may go again, so it goes as pushed."""

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        for _ in range(2):
            result = await a.step(StepBatch(enqueue=[entry(1, mode=b"s")]))
            assert (result.added, result.duplicates) == (1, 0)

    run(redis_url, keys, scenario)
    assert not redis_client.exists(keys.runs, keys.runs + ":seeds")


def test_enqueue_puts_each_request_under_the_site_it_names(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """The site travels as its own field: the payload's URL does not decide it."""
    fp, _, priority, payload, scope = entry(1, site="shop.test")

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[(fp, "10.0.0.7:8080", priority, payload, scope)]))
        (leased,) = (await a.step(StepBatch(want=1))).leased
        assert (leased.site, leased.payload) == ("10.0.0.7:8080", payload)
        member = redis_client.zrange(keys.inflight, 0, -1)[0]
        assert member == b"node-a\nR10.0.0.7:8080\n" + payload

    run(redis_url, keys, scenario)
    assert redis_client.hget(keys.leases, "10.0.0.7:8080") == b"1"


def test_enqueue_takes_a_batch_larger_than_luas_stack(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        result = await a.step(StepBatch(enqueue=[entry(n) for n in range(5000)]))
        assert (result.added, result.duplicates) == (5000, 0)

    run(redis_url, keys, scenario)
    assert redis_client.scard(keys.dupefilter) == 5000


# -- phase 8: lease -------------------------------------------------------------------------


def test_lease_takes_priority_first_then_first_in_first_out(
    redis_url: str, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        entries = [entry(n, priority=10 if n % 3 == 0 else 0) for n in range(30)]
        await a.step(StepBatch(enqueue=entries[:15]))
        await a.step(StepBatch(enqueue=entries[15:]))
        result = await a.step(StepBatch(want=30))
        high = [n for n in range(30) if n % 3 == 0]
        assert urls(result) == [f"http://s/{n}" for n in high + [n for n in range(30) if n % 3]]
        assert {leased.site for leased in result.leased} == {"s"}

    run(redis_url, keys, scenario)


def test_lease_holds_a_site_to_its_fleet_wide_concurrency(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """The cap counts download permits: a site at its cap leaves the ready index until a
    permit comes back, and then any node may lease it at once."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(10)]))
        first = await a.step(StepBatch(want=10))
        assert len(first.leased) == 3
        assert first.permits == [("s", 3)]
        # the site waits in `capped`; node b gets nothing either
        taken = await b.step(StepBatch(want=10))
        assert taken.leased == []
        assert redis_client.sismember(keys.capped, "s")
        assert redis_client.zscore(keys.queue, "s") is None
        # a permit b asks for ahead is refused too: the cap is the fleet's
        assert (await b.step(StepBatch(want=10, ahead=[("s", 0, 2, 0, 0)]))).permits == []
        # node a gives one permit back: the site is ready again, for b
        await a.step(StepBatch(give_back=[("s", 1)]))
        assert not redis_client.sismember(keys.capped, "s")
        again = await b.step(StepBatch(want=10))
        assert len(again.leased) == 1
        assert again.permits == [("s", 1)]
        # a may hold more requests than permits (ahead), within its own leases
        ahead = await a.step(StepBatch(want=2, slots=0, ahead=[("s", 2, 0, 2, 0)]))
        assert len(ahead.leased) == 2
        assert ahead.permits == []
        # spare permits (no request to start) take requests first; the rest go back
        spare = await a.step(StepBatch(want=5, slots=0, ahead=[("s", 5, 0, 2, 2)]))
        assert len(spare.leased) == 4  # all that was left
        assert spare.spare_back == []
        empty = await a.step(StepBatch(want=5, slots=0, ahead=[("s", 5, 0, 2, 2)]))
        assert empty.leased == []
        assert empty.spare_back == [("s", 2)]
        assert empty.shares == {"s": 2}

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=3))
    assert redis_client.hget(keys.active, "s") == b"1"
    assert redis_client.hgetall(keys.permits_of("node-a")) == {}
    assert redis_client.hgetall(keys.permits_of("node-b")) == {b"s": b"1"}


def test_a_step_sent_again_with_its_seq_runs_once(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A reply lost and the same batch sent again (the loop does, after an error; redis-py's
    cluster client may on its own): nothing runs twice, not even an entry that skips the
    seen-set; the next seq runs."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        batch = StepBatch(enqueue=[entry(1, mode=b"m"), entry(2)], want=1, seq=41)
        first = await a.step(batch)
        assert (first.added, len(first.leased), first.replayed) == (2, 1, False)
        again = await a.step(batch)
        assert (again.added, again.leased, again.replayed) == (0, [], True)
        assert int(redis_client.get(keys.queued)) == 1, "queued once"
        # another node's steps have their own numbers
        assert not (await b.step(StepBatch(seq=41))).replayed
        assert not (await a.step(StepBatch(enqueue=[entry(1, mode=b"m")], seq=42))).replayed
        assert int(redis_client.get(keys.queued)) == 2

    run(redis_url, keys, scenario)


def test_a_heartbeats_permit_table_corrects_what_redis_counts_for_its_node(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A step whose reply the node never read granted a permit at cap 1: the site would
    never be leased again. The node's next heartbeat says it holds none, and the permit goes
    back to the fleet; where the node counts more than Redis, the reply says so."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(3)]))
        assert len((await a.step(StepBatch(want=3))).leased) == 1  # its reply "lost"
        assert (await b.step(StepBatch(want=3))).leased == []  # the site is at its cap
        fixed = await a.step(StepBatch(permit_table=[], permit_check=True))
        assert (fixed.permits_fixed, fixed.permits_held) == (1, [])
        assert redis_client.hget(keys.active, "s") is None
        assert not redis_client.sismember(keys.capped, "s")
        assert len((await b.step(StepBatch(want=3))).leased) == 1  # leased again
        # node b counts two permits of s, Redis one: it is told it holds one; a table
        # that matches changes nothing
        told = await b.step(StepBatch(permit_table=[("s", 2), ("t", 1)], permit_check=True))
        assert (told.permits_fixed, sorted(told.permits_held)) == (0, [("s", 1), ("t", 0)])
        same = await b.step(StepBatch(permit_table=[("s", 1)], permit_check=True))
        assert (same.permits_fixed, same.permits_held) == (0, [])
        assert redis_client.hget(keys.active, "s") == b"1"
        # no table sent (permit_check off): nothing is corrected
        assert (await b.step(StepBatch())).permits_fixed == 0
        assert redis_client.hget(keys.active, "s") == b"1"

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=1))


def test_permits_of_a_node_that_stopped_stepping_go_back(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A node that dies holding permits loses them at its deadline; the site is ready again."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(5)]))
        assert len((await a.step(StepBatch(want=5))).leased) == 2
        assert (await b.step(StepBatch(want=5))).leased == []
        redis_client.zadd(keys.holders, {"node-a": 1})  # its deadline passed long ago
        await b.step(StepBatch(maintain=True))
        assert redis_client.hget(keys.active, "s") is None
        assert len((await b.step(StepBatch(want=5))).leased) == 2

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=2))
    assert redis_client.exists(keys.permits_of("node-a")) == 0
    assert redis_client.zscore(keys.holders, "node-a") is None


def test_a_node_whose_permits_went_back_while_it_stalled_is_told_and_holds_none(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await b.step(StepBatch(enqueue=[entry(n) for n in range(6)]))
        first = await a.step(StepBatch(want=2))
        assert first.rejoined  # its first step: it held nothing before
        assert len(first.leased) == 2
        assert not (await a.step(StepBatch())).rejoined
        redis_client.zadd(keys.holders, {"node-a": 1})  # it stalled past its deadline
        await b.step(StepBatch(maintain=True))
        assert len((await b.step(StepBatch(want=2))).leased) == 2  # b has the cap now
        # back, a names the 2 permits it thinks it holds: it holds none, and gets none
        back = await a.step(StepBatch(want=2, ahead=[("s", 0, 2, 2, 0)]))
        assert back.rejoined
        assert (back.leased, back.permits) == ([], [])
        assert redis_client.hget(keys.active, "s") == b"2"

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=2))
    assert redis_client.hgetall(keys.permits_of("node-a")) == {}


def test_release_gives_back_leases_and_permits(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(4)]))
        leased = (await a.step(StepBatch(want=4))).leased
        assert len(leased) == 2
        members = [a.request_member(x.site, x.payload) for x in leased]
        assert await a.release(members) == 2
        assert len((await b.step(StepBatch(want=4))).leased) == 2

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=2))
    assert redis_client.exists(keys.permits_of("node-a")) == 0


def test_a_closing_step_settles_and_hands_back_leases_and_permits_in_one_round_trip(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """SIGTERM's hand-back: the step that acks a node's last download also gives every permit
    back and puts its unstarted leases back in the queue (step/release.lua)."""

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(4)]))
        leased = (await a.step(StepBatch(want=3))).leased
        assert len(leased) == 3
        done, *unstarted = [a.request_member(x.site, x.payload) for x in leased]
        closing = StepBatch(acks=[done], releasing=True, release=[*unstarted, b"not-held"])
        result = await a.step(closing)
        assert result.released == 2  # a member it no longer holds is skipped
        assert redis_client.zcard(keys.inflight) == 0
        assert redis_client.hget(keys.active, "s") is None
        assert redis_client.zscore(keys.holders, "node-a") is None
        assert len((await b.step(StepBatch(want=4))).leased) == 3  # the unstarted two, one more
        # a step without it releases nothing
        assert (await b.step(StepBatch())).released == 0

    run(redis_url, keys, scenario, limits=SiteLimits(concurrency=3))
    assert redis_client.exists(keys.permits_of("node-a")) == 0


def test_lease_spends_a_sites_tokens_at_its_rate(redis_url: str, keys: FrontierKeys) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(10)]))
        first = await a.step(StepBatch(want=10))
        assert len(first.leased) == 1  # one token to start with (burst 1 at 10/s)
        await asyncio.sleep(0.25)
        later = await a.step(StepBatch(want=10))
        assert 1 <= len(later.leased) <= 2

    run(redis_url, keys, scenario, limits=SiteLimits(rate=10.0, concurrency=0))


# -- phase 2: settle ------------------------------------------------------------------------


def test_settle_dead_letters_leave_the_inflight_set(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1)]))
        (leased,) = (await a.step(StepBatch(want=1))).leased
        member = a.request_member(leased.site, leased.payload)
        await a.step(StepBatch(dead=[(member, b'{"url":"http://s/1"}')]))

    run(redis_url, keys, scenario)
    assert redis_client.zcard(keys.inflight) == 0
    # the permit is the node's until it gives it back (it may start the next request)
    assert redis_client.hget(keys.active, "s") == b"1"
    assert redis_client.lrange(keys.dead, 0, -1) == [b'{"url":"http://s/1"}']


def test_settle_retry_waits_for_its_time_then_any_node_takes_it(
    redis_url: str, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, priority=3)]))
        (leased,) = (await a.step(StepBatch(want=1))).leased
        retry = b'{"url":"http://s/1","priority":3,"meta":{"retry_times":1}}'
        member = a.request_member(leased.site, leased.payload)
        await a.step(StepBatch(retries=[(member, 250, leased.site, retry)]))
        early = await b.step(StepBatch(maintain=True, want=1))
        assert (early.promoted, early.leased, early.counts) == (0, [], Counts(delayed=1))
        await asyncio.sleep(0.3)
        late = await b.step(StepBatch(maintain=True, want=1))
        assert late.promoted == 1
        assert [(x.site, x.payload) for x in late.leased] == [("s", retry)]

    run(redis_url, keys, scenario)


# -- phases 3 and 6: heartbeat, maintenance ---------------------------------------------------


def test_expired_lease_goes_back_and_heartbeat_keeps_it(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1), entry(2)]))
        leased = await a.step(StepBatch(want=2))
        kept, dropped = (a.request_member(x.site, x.payload) for x in leased.leased)
        assert redis_client.zcard(keys.inflight) == 2
        for _ in range(4):  # node a heartbeats only the first lease
            await asyncio.sleep(0.15)
            await a.step(StepBatch(heartbeat=[kept]))
        reaped = await b.step(StepBatch(maintain=True, want=5))
        assert reaped.reaped == 1
        assert [x.payload for x in reaped.leased] == [leased.leased[1].payload]
        assert redis_client.zscore(keys.inflight, kept) is not None
        # acking a lease that was reaped and re-leased elsewhere is harmless
        await a.step(StepBatch(acks=[dropped, kept]))
        assert redis_client.zcard(keys.inflight) == 1

    run(redis_url, keys, scenario)


def test_reaped_lease_counts_off_its_sites_active_leases(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, site="x"), entry(2, site="y")]))
        await a.step(StepBatch(want=2))
        assert redis_client.hmget(keys.active, "x", "y") == [b"1", b"1"]
        await asyncio.sleep(0.4)
        assert (await b.step(StepBatch(maintain=True))).reaped == 2

    run(redis_url, keys, scenario)
    assert redis_client.hmget(keys.active, "x", "y") == [None, None], "no leases, no entry"
    assert site_queue_size(redis_client, keys, "x") == 1


def test_leased_seeds_of_a_dead_node_return_to_start_urls(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    redis_client.lpush(keys.start_urls, b"http://s/1", b"http://s/2")

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        taken = await a.step(StepBatch(seed_want=1))
        assert taken.seeds == [b"http://s/1"]
        await asyncio.sleep(0.4)
        result = await b.step(StepBatch(maintain=True))
        assert result.reaped == 1
        assert result.counts == Counts(seeds=2)

    run(redis_url, keys, scenario)
    assert sorted(redis_client.lrange(keys.start_urls, 0, -1)) == [b"http://s/1", b"http://s/2"]


def test_adaptive_rate_moves_towards_target_over_latency(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    limits = SiteLimits(adaptive=True, target_concurrency=2.0, start_rate=2.0, concurrency=0)

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        # phase 5 records samples; phase 6 turns 5 or more into a rate
        await a.step(StepBatch(latency=[("s", 0.4, 4)], maintain=True))
        assert redis_client.hget(keys.rates, "s") is None
        await a.step(StepBatch(latency=[("s", 0.1, 1)], maintain=True))

    run(redis_url, keys, scenario, limits=limits)
    # mean latency 0.1 s: wanted 20/s, halfway from 2/s
    assert float(redis_client.hget(keys.rates, "s")) == pytest.approx(11.0)


# -- phases 4 and 7: pause, wake ----------------------------------------------------------------


def test_pause_parks_the_site_until_its_time_then_wake_brings_it_back(
    redis_url: str, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(3)]))
        paused = await a.step(StepBatch(pauses=[("s", 300)], want=3))
        assert paused.leased == []
        assert paused.next_wake_ms is not None
        assert 200 <= paused.next_wake_ms <= 300
        await asyncio.sleep(0.35)
        assert len((await b.step(StepBatch(want=3))).leased) == 3

    run(redis_url, keys, scenario)


# -- release and requeue_dead ---------------------------------------------------------------------


@pytest.mark.parametrize("members", [0, 3])
def test_release_puts_unstarted_leases_back(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys, members: int
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(n) for n in range(3)]))
        leased = (await a.step(StepBatch(want=members))).leased
        assert await a.release([a.request_member(x.site, x.payload) for x in leased]) == members

    run(redis_url, keys, scenario)
    assert site_queue_size(redis_client, keys, "s") == 3
    assert int(redis_client.get(keys.queued)) == 3
    assert redis_client.zcard(keys.inflight) == 0


def test_requeued_dead_letter_goes_back_to_the_site_it_was_leased_under(
    redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    record = {
        "url": "http://shop.test/1",
        "site": "10.1.1.1",
        "request": '{"url":"http://shop.test/1"}',
    }
    redis_client.lpush(keys.dead, json.dumps(record))
    assert retry_dead_letters(redis_client, keys) == (1, 0)
    assert site_queue_size(redis_client, keys, "10.1.1.1") == 1
    assert redis_client.llen(keys.dead) == 0


def test_clear_frontier_deletes_site_queues_too(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys, keyspace
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, site="s"), entry(2, site="t")], want=1))

    run(redis_url, keys, scenario)
    redis_client.lpush(keys.start_urls, b"http://s/")
    assert redis_client.exists(keys.site_index("t"), keys.inflight, keys.dupefilter) == 3
    clear_frontier(redis_client, keys)
    assert keyspace.existing(redis_client) == []


# -- the scripts' headers -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(path.stem for path in Path(str(lua.FOLDER)).glob("*.lua")))
def test_a_script_declares_every_key_it_uses(name: str) -> None:
    script = lua.load(name)
    assert set(lua.used_keys(script)) <= set(script.keys), "K.<name> not in the header's KEYS"
    keys = FrontierKeys.for_spider("products")
    assert len(set(script.keys_from(keys, work="products:dead:requeue:x"))) == len(script.keys)


def test_heartbeat_script_declares_every_key_it_uses() -> None:
    script = lua.load("heartbeat", "project.monitoring")
    assert set(lua.used_keys(script)) <= set(script.keys)
    script.keys_from(FrontierKeys.for_spider("products"))


@pytest.mark.parametrize(
    ("queue", "slot_tag"),
    [("products:requests", None), ("{products:start_urls}:requests", "products:start_urls")],
)
def test_site_queues_are_built_from_the_queue_key_and_share_its_hash_tag(
    redis_client: sync_redis.Redis, keys: FrontierKeys, queue: str, slot_tag: str | None
) -> None:
    """Python's site_index() builds what lib/site_queues.lua builds; a tagged queue key
    (Redis Cluster) keeps every site queue in its slot."""
    built = dataclasses.replace(keys, queue=queue)
    lib = lua.FOLDER / "lib"
    script = "local K = {queue = KEYS[1]}\n" + (lib / "chunked.lua").read_text()
    script += (lib / "site_queues.lua").read_text() + "\nreturn sq.index_key(ARGV[1])"
    from_lua = redis_client.eval(script, 1, queue, "shop.test:8080").decode()
    assert from_lua == built.site_index("shop.test:8080") == f"{queue}|i|shop.test:8080"
    assert hash_tag(from_lua) == hash_tag(queue) == slot_tag


# -- the layout upgrade ---------------------------------------------------------------------------


def test_leases_and_retries_of_an_older_layout_get_their_site_once(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """Layout 1 left the site out of in-flight and delayed members: they get it, once."""
    from project.frontier.layout import LAYOUT_VERSION, ensure_layout

    old_lease = b'node-x\nR{"url":"http://shop.test/1","priority":3}'
    old_ip_lease = b'node-x\nR{"site":"10.0.0.9","url":"http://a.test/2"}'
    old_seed = b"node-x\nShttp://shop.test/"
    old_retry = b'{"url":"http://Shop.Test:8080/3"}'
    redis_client.zadd(keys.inflight, {old_lease: 1, old_ip_lease: 1, old_seed: 1})
    redis_client.zadd(keys.delayed, {old_retry: 1})

    async def upgrade() -> list[int]:
        client = redis.asyncio.from_url(redis_url)
        try:
            return [await ensure_layout(client, keys), await ensure_layout(client, keys)]
        finally:
            await client.aclose()

    assert asyncio.run(upgrade()) == [3, 0], "three members rewritten, then nothing to do"
    assert redis_client.get(keys.layout) == str(LAYOUT_VERSION).encode()
    assert set(redis_client.zrange(keys.inflight, 0, -1)) == {
        b'node-x\nRshop.test\n{"url":"http://shop.test/1","priority":3}',
        b'node-x\nR10.0.0.9\n{"site":"10.0.0.9","url":"http://a.test/2"}',
        old_seed,
    }
    assert redis_client.zrange(keys.delayed, 0, -1) == [b"shop.test:8080\n" + old_retry]

    async def reap(a: LeasedQueue, _: LeasedQueue) -> None:
        assert (await a.step(StepBatch(maintain=True))).reaped == 3

    run(redis_url, keys, reap)
    assert site_queue_size(redis_client, keys, "shop.test") == 1
    assert site_queue_size(redis_client, keys, "10.0.0.9") == 1
    assert site_queue_size(redis_client, keys, "shop.test:8080") == 1, "the retry was due"
    assert redis_client.llen(keys.start_urls) == 1


# -- where requests may go (phase 1's scope) ---------------------------------------------------


def test_enqueue_keeps_requests_on_the_sites_seeds_opened(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        early = await a.step(StepBatch(enqueue=[entry(1, site="shop", scope="=")]))
        assert (early.added, early.offsite) == (0, 1), "no seed has opened the shop yet"
        seeded = await a.step(
            StepBatch(
                enqueue=[
                    entry(2, site="shop", scope="+"),  # a seed
                    entry(3, site="shop", scope="="),  # a link on the shop
                    entry(4, site="127.0.0.1:6379", scope="="),  # a link to Redis
                    entry(5, site="www.shop", scope="~shop"),  # the shop redirects to www
                    entry(6, site="elsewhere", scope=""),  # allowed_domains decide
                ]
            )
        )
        assert (seeded.added, seeded.offsite) == (4, 1)
        later = await a.step(StepBatch(enqueue=[entry(7, site="www.shop", scope="=")]))
        assert (later.added, later.offsite) == (1, 0), "a redirect target is the crawl's"

    run(redis_url, keys, scenario)
    assert redis_client.smembers(keys.allowed) == {b"shop", b"www.shop"}
    assert site_queue_size(redis_client, keys, "127.0.0.1:6379") == 0
    assert redis_client.scard(keys.dupefilter) == 5, "refused requests are not marked seen"


# -- settle: a reaped lease cannot fork its request -------------------------------------------


def test_settle_of_a_reaped_lease_does_not_fork_the_request(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1)]))
        (slow,) = (await a.step(StepBatch(want=1))).leased
        await asyncio.sleep(0.4)
        (taken,) = (await b.step(StepBatch(maintain=True, want=1))).leased  # b has it now
        member = a.request_member(slow.site, slow.payload)
        late = await a.step(
            StepBatch(
                retries=[(member, 0, slow.site, b'{"url":"http://s/1","meta":{"retry_times":1}}')],
                dead=[(member, b'{"url":"http://s/1"}')],
            )
        )
        assert late.stale == 2
        assert taken.payload == slow.payload

    run(redis_url, keys, scenario)
    assert redis_client.zcard(keys.delayed) == 0, "no second live copy"
    assert redis_client.llen(keys.dead) == 0
    assert redis_client.zcard(keys.inflight) == 1, "node b still holds it"


# -- poison: a request that kills every node that takes it --------------------------------------


def test_a_request_whose_lease_keeps_expiring_becomes_a_poison_dead_letter(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1), entry(2)]))
        for delivery in range(1, 4):
            taken = await a.step(StepBatch(want=2))
            assert len(taken.leased) == 2 if delivery == 1 else 1
            if delivery == 1:  # entry 2 is fine: its node acks it
                done = [x for x in taken.leased if b"/2" in x.payload]
                await a.step(StepBatch(acks=[a.request_member(x.site, x.payload) for x in done]))
            await asyncio.sleep(0.4)  # node a "dies" holding entry 1
            result = await b.step(StepBatch(maintain=True))
            if delivery < 3:
                assert (result.reaped, result.poisoned) == (1, [])
        (record,) = result.poisoned
        poison = json.loads(record)
        assert (poison["kind"], poison["attempts"], poison["url"]) == ("poison", 3, "http://s/1")
        assert poison["site"] == "s"

    run(redis_url, keys, scenario)
    assert redis_client.zcard(keys.inflight) == 0
    assert site_queue_size(redis_client, keys, "s") == 0, "not handed out a fourth time"
    assert redis_client.llen(keys.dead) == 1
    assert redis_client.hlen(keys.deliveries) == 0, "nothing left to count"


def test_an_acked_request_forgets_its_expired_leases(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1)]))
        await a.step(StepBatch(want=1))
        await asyncio.sleep(0.4)
        await b.step(StepBatch(maintain=True))
        assert redis_client.hlen(keys.deliveries) == 1
        (again,) = (await b.step(StepBatch(want=1))).leased
        await b.step(StepBatch(acks=[b.request_member(again.site, again.payload)]))

    run(redis_url, keys, scenario)
    assert redis_client.hlen(keys.deliveries) == 0


# -- requeue_dead: chunked, never destroys ------------------------------------------------------


def test_requeueing_100000_dead_letters_of_one_site_destroys_none(
    redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    records = [
        json.dumps({"url": f"http://s/{n}", "site": "s", "request": f'{{"url":"http://s/{n}"}}'})
        for n in range(100_000)
    ] + [json.dumps({"url": "not a url", "kind": "seed", "request": None})]
    with redis_client.pipeline(transaction=False) as pipe:
        for start in range(0, len(records), 10_000):
            pipe.rpush(keys.dead, *records[start : start + 10_000])
        pipe.execute()
    assert retry_dead_letters(redis_client, keys) == (100_000, 1)
    assert site_queue_size(redis_client, keys, "s") == 100_000
    assert int(redis_client.get(keys.queued)) == 100_000
    assert redis_client.lrange(keys.dead, 0, -1) == [records[-1].encode()], "the seed stays"
    assert not list(redis_client.scan_iter(match=f"{keys.dead}:requeue:*"))


def test_maintenance_forgets_the_counters_of_sites_idle_for_ten_minutes(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """The per-site hashes do not grow for ever."""
    limits = SiteLimits(rate=5.0, concurrency=0)

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[entry(1, site="old"), entry(2, site="busy"),
                                         entry(3, site="busy")]))  # fmt: skip
        for leased in (await a.step(StepBatch(want=3))).leased:
            await a.step(StepBatch(acks=[a.request_member(leased.site, leased.payload)]))
        await a.step(StepBatch(give_back=[("old", 1), ("busy", 1)]))  # the node is done
        assert redis_client.hget(keys.leases, "old") == b"1"
        seconds, _ = redis_client.time()
        long_ago = (int(seconds) - 11 * 60) * 1000
        redis_client.zadd(keys.recent, {"old": long_ago, "busy": long_ago})
        redis_client.hset(keys.buckets, "old", f"0 {long_ago}")
        await a.step(StepBatch(maintain=True))

    run(redis_url, keys, scenario, limits=limits)
    assert redis_client.hget(keys.leases, "old") is None
    assert redis_client.hget(keys.buckets, "old") is None
    assert redis_client.zscore(keys.recent, "old") is None
    # a site with work left is looked at again later
    assert redis_client.hget(keys.leases, "busy") is not None
    assert redis_client.zscore(keys.recent, "busy") > long_ago_bound(redis_client)


def long_ago_bound(client) -> int:
    seconds, _ = client.time()
    return (int(seconds) - 60) * 1000


# -- the start claim, seeds of either type, the SCHEDULER_PERSIST flush ------------------------


def test_one_node_claims_start_and_ends_it_in_the_step_that_enqueues_its_last_request(
    redis_url: str, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        assert await a.claim_start(new_crawl=True) == "claimed"
        assert await b.claim_start(new_crawl=True) == "running"
        busy = await b.step(StepBatch(maintain=True))
        assert busy.counts is not None
        assert busy.counts[4] == 1, "the fleet is busy while start() runs"
        done = await a.step(StepBatch(enqueue=[entry(1)], start="done"))
        assert done.start_held
        assert (await b.claim_start(new_crawl=False)) == "done"
        # the reply of that step was lost and the node sends "done" again: still its own
        assert (await a.step(StepBatch(start="done"))).start_held
        # the crawl goes on: a node starting now does not start it again
        assert (await b.claim_start(new_crawl=True)) == "done"
        (leased,) = (await b.step(StepBatch(want=1))).leased
        await b.step(StepBatch(acks=[b.request_member(leased.site, leased.payload)]))
        # nothing left anywhere: a node starting now begins a new crawl
        assert (await b.claim_start(new_crawl=True)) == "claimed"
        assert not (await a.step(StepBatch(start="run"))).start_held, "node-b's claim now"

    run(redis_url, keys, scenario)


def test_a_claim_not_extended_expires_to_a_waiting_node(redis_url: str, keys: FrontierKeys) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        assert await a.claim_start(new_crawl=True) == "claimed"
        assert await b.claim_start(new_crawl=False) == "running"
        await asyncio.sleep(0.4)  # the lease is 300 ms here
        assert await b.claim_start(new_crawl=False) == "claimed"

    run(redis_url, keys, scenario)


@pytest.mark.parametrize("command", ["sadd", "rpush"])
def test_seeds_come_from_the_key_as_it_is_and_go_back_as_it_is_now(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys, command: str
) -> None:
    getattr(redis_client, command)(keys.start_urls, "http://s/1")
    kind = "T" if command == "sadd" else "S"

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        taken = await a.step(StepBatch(seed_want=4))
        assert (taken.seeds, taken.seeds_kind) == ([b"http://s/1"], kind)
        assert a.seed_member(b"http://s/1", kind) in await a.server.zrange(keys.inflight, 0, -1)
        # meanwhile someone pushes a seed as the other type: the key is that type now
        if command == "sadd":
            await a.server.rpush(keys.start_urls, "http://s/2")
        else:
            await a.server.delete(keys.start_urls)
            await a.server.sadd(keys.start_urls, "http://s/2")
        await asyncio.sleep(0.4)
        reaped = await b.step(StepBatch(maintain=True))
        assert reaped.reaped == 1
        back = await a.server.type(keys.start_urls)
        members = (
            await a.server.smembers(keys.start_urls)
            if back == b"set"
            else await a.server.lrange(keys.start_urls, 0, -1)
        )
        assert set(members) == {b"http://s/1", b"http://s/2"}, "no seed lost either way"

    run(redis_url, keys, scenario)


def test_an_idle_nodes_count_reads_only_until_it_finds_work_left(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        assert (await b.step(StepBatch(count=True))).counts == Counts()
        await a.step(StepBatch(enqueue=[entry(1), entry(2)]))
        assert (await b.step(StepBatch(count=True))).counts == Counts(queued=2)
        await a.step(StepBatch(want=2))
        redis_client.lpush(keys.start_urls, b"http://s/3")
        # nothing queued: the leases out are the work left, the seed is not read
        assert (await b.step(StepBatch(count=True))).counts == Counts(inflight=2)
        full = await b.step(StepBatch(maintain=True))
        assert full.counts == Counts(queued=0, delayed=0, inflight=2, seeds=1, starting=0)

    run(redis_url, keys, scenario)


def test_a_seed_key_of_another_type_gives_no_seeds_and_no_error(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    redis_client.set(keys.start_urls, "not a list")

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        result = await a.step(StepBatch(enqueue=[entry(1)], seed_want=4, want=1))
        assert (result.seeds, len(result.leased)) == ([], 1)
        # the counts a maintaining step sends: such a key holds no seeds
        counted = await b.step(StepBatch(maintain=True, seed_want=1))
        assert counted.seeds == []
        assert counted.counts is not None
        assert counted.counts.seeds == 0

    run(redis_url, keys, scenario)


def test_the_persist_off_flush_deletes_only_a_crawl_that_is_still_over(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    script = lua.load("flush")
    flush = redis_client.register_script(script.source)
    redis_client.sadd(keys.dupefilter, "fp")
    redis_client.lpush(keys.dead, "{}")
    redis_client.lpush(keys.start_urls, "http://s/new")  # pushed while the nodes were closing
    assert flush(keys=script.keys_from(keys)) == -1
    assert redis_client.exists(keys.dupefilter)
    redis_client.delete(keys.start_urls)
    redis_client.set(keys.start, "run\nnode-c")  # a node began a new crawl
    assert flush(keys=script.keys_from(keys)) == -1
    redis_client.set(keys.start, "done")
    assert flush(keys=script.keys_from(keys)) == 2  # the seen-set and the claim
    assert not redis_client.exists(keys.dupefilter, keys.start)
    assert redis_client.llen(keys.dead) == 1, "dead letters stay"
