"""The per-site queues (lua/lib/site_queues.lua) against a real Redis: one list per priority,
packed entries, the older layout's sorted sets still drained, every key in the queue's slot."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st

from project.frontier import lua
from project.frontier.admin import clear_frontier
from project.frontier.config import SiteLimits
from project.frontier.keys import FrontierKeys, hash_tag
from project.frontier.queue import LeasedQueue, StepBatch
from project.frontier.site_queues import (
    OLDER,
    queued_requests,
    read_site_queues,
    site_queue_bytes,
    site_queue_size,
    sites_queued,
    unpack_entry,
)
from tests.test_fuzz import fuzz

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import redis as sync_redis

    from tests.fleet import KeySpace

BAND = 1e10  # lib/site_queues.lua's PRIORITY_BAND, as the scores show it


def _steps(redis_url: str, keys: FrontierKeys, scenario: Callable[..., Awaitable[None]]) -> None:
    async def main() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            await scenario(
                LeasedQueue(client, None, keys, "node-a", 60_000, SiteLimits(concurrency=0))
            )  # type: ignore[arg-type]
        finally:
            await client.aclose()

    asyncio.run(main())


def _payload(site: str, n: int, priority: int = 0, scheme: str = "https") -> bytes:
    """A payload as project/frontier/wire.py writes it: the URL first, the random id last."""
    doc = {"url": f"{scheme}://{site}/p/{n}", "callback": "parse_product", "priority": priority}
    return json.dumps({**doc, "id": os.urandom(6).hex()}, separators=(",", ":")).encode()


def _entry(site: str, priority: int, payload: bytes) -> tuple[bytes, str, int, bytes, str]:
    return (b"m" + os.urandom(8), site, priority, payload, "")


def _lease_all(queue: LeasedQueue) -> Awaitable[list]:
    async def lease() -> list:
        leased = []
        while batch := (await queue.step(StepBatch(want=50, slots=50))).leased:
            leased += batch
        return leased

    return lease()


def _lib(call: str) -> str:
    """lib/site_queues.lua with the queue key as KEYS[1], then *call*."""
    folder = lua.FOLDER / "lib"
    script = "local K = {queue = KEYS[1]}\n" + (folder / "chunked.lua").read_text()
    return script + (folder / "site_queues.lua").read_text() + "\n" + call


def test_requests_are_leased_best_priority_first_then_in_arrival_order(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    sent: dict[str, list[tuple[int, bytes]]] = {"a.test": [], "b.test:8080": []}
    priorities = [0, 10, -10, 0, 10, 0, -10, 3, 0]

    async def scenario(queue: LeasedQueue) -> None:
        for batch in range(3):
            entries = []
            for j, priority in enumerate(priorities):
                site = list(sent)[(batch + j) % 2]
                payload = _payload(site, batch * 100 + j, priority)
                sent[site].append((priority, payload))
                entries.append(_entry(site, priority, payload))
            assert (await queue.step(StepBatch(enqueue=entries))).added == len(entries)
        assert int(redis_client.get(keys.queued)) == 27
        queued = {site: queued_requests(redis_client, keys, site) for site in sent}
        assert {site: site_queue_size(redis_client, keys, site) for site in sent} == {
            site: len(requests) for site, requests in sent.items()
        }
        leased = await _lease_all(queue)
        for site, requests in sent.items():
            # best priority first; within a priority, in the order they were sent
            expected = [p for _, p in sorted(requests, key=lambda r: -r[0])]
            got = [(x.payload, x.score) for x in leased if x.site == site]
            assert [payload for payload, _ in got] == expected
            assert got == queued[site], "the readers see what a lease takes, scores too"
            scores = [score for _, score in got]
            assert scores == sorted(scores)
            for (priority, _), score in zip(
                sorted(requests, key=lambda r: -r[0]), scores, strict=True
            ):
                assert -(score // BAND) == priority
        # the node orders what it holds by score: the ready index gave the best site first
        assert leased[0].score == min(x.score for x in leased)

    _steps(redis_url, keys, scenario)
    assert int(redis_client.get(keys.queued)) == 0
    assert list(sites_queued(redis_client, keys)) == [], "emptied lists and indexes go"
    # a site's count of requests pushed is its count of leases now: none queued
    assert {site: site_queue_size(redis_client, keys, site) for site in sent} == dict.fromkeys(
        sent, 0
    )
    counts, leases = redis_client.hgetall(keys.site_counts), redis_client.hgetall(keys.leases)
    assert counts == leases
    assert sum(int(n) for n in counts.values()) == 27


@pytest.mark.parametrize(
    "payload",
    [
        b'{"url":"https://s.test/1","id":"0123456789ab"}',
        b'{"url":"http://s.test/1","priority":2,"id":"0123456789ab"}',
        b'{"url":"https://s.test","id":"0123456789ab"}',  # the opening and the id meet
        b'{"url":"https://s.test.evil/","id":"0123456789ab"}',  # another host, same start
        b'{"url":"https://other.test/","id":"0123456789AB"}',  # an id this queue did not write
        b'{"url":"https://s.test/x","id":"0123456789ab","revisit":{"etag":"1"}}',
        b'{"url":"https://s.test/x"}',
        b'{"url":"https://s.test',
        b"\xff\xfe not json \x00",
        b"A\x00\x00\x00\x00\x01short",  # looks like a packed entry
        b"",
    ],
)
def test_a_payload_comes_back_byte_for_byte(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys, payload: bytes
) -> None:
    async def scenario(queue: LeasedQueue) -> None:
        await queue.step(StepBatch(enqueue=[_entry("s.test", 0, payload)]))
        ((queued, _),) = queued_requests(redis_client, keys, "s.test")
        (leased,) = await _lease_all(queue)
        assert leased.payload == queued == payload

    _steps(redis_url, keys, scenario)


def test_an_entry_leaves_out_its_sites_url_opening_and_packs_the_id(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    payload = _payload("shop.test", 1)

    async def scenario(queue: LeasedQueue) -> None:
        await queue.step(StepBatch(enqueue=[_entry("shop.test", 0, payload)]))

    _steps(redis_url, keys, scenario)
    (entry,) = redis_client.lrange(keys.site_list("shop.test", "0"), 0, -1)
    opening, id_text = b'{"url":"https://shop.test', b',"id":"' + payload[-14:]
    assert payload.startswith(opening)
    assert payload.endswith(id_text)
    # a form byte, the arrival (5 bytes), the id (6), the rest as it was
    assert entry[0:1] == b"D"
    assert entry[12:] == payload[len(opening) : -len(id_text)]
    assert len(entry) == len(payload) - len(opening) - len(id_text) + 12


_PAYLOADS = st.one_of(
    st.binary(max_size=80),
    st.builds(
        lambda scheme, host, rest, id_: (
            b'{"url":"' + scheme + b"://" + host + rest + (b',"id":"' + id_ + b'"}' if id_ else b"")
        ),
        st.sampled_from([b"https", b"http", b"ftp"]),
        st.sampled_from([b"s.test", b"s.test:8080", b"\xff", b""]),
        st.binary(max_size=20),
        st.one_of(st.none(), st.binary(min_size=12, max_size=12), st.just(b"00ff00ff00ff")),
    ),
)


def test_an_entry_packed_by_the_script_unpacks_the_same_in_python(
    redis_client: sync_redis.Redis,
) -> None:
    """What status and the tests read (project/frontier/site_queues.py) is what a lease gets."""
    script = redis_client.register_script(
        _lib(
            "local entry = sq.pack_entry(ARGV[1], tonumber(ARGV[2]), sq.url_openings(ARGV[3]))\n"
            "local payload, arrival = sq.unpack_entry(entry, sq.url_openings(ARGV[3]))\n"
            "return {entry, payload, string.format('%.0f', arrival)}"
        )
    )

    @fuzz(200)
    @given(
        payload=_PAYLOADS,
        site=st.sampled_from(["s.test", "s.test:8080", "", "é"]),
        arrival=st.integers(0, 2**40 - 1),
    )
    def packs(payload: bytes, site: str, arrival: int) -> None:
        entry, back, at = script(keys=["q"], args=[payload, arrival, site])
        assert (back, int(at)) == (payload, arrival)
        assert unpack_entry(entry, site) == (payload, arrival)
        assert len(entry) <= len(payload) + 6

    packs()


def _older_layout(
    client: sync_redis.Redis, keys: FrontierKeys, site: str, priorities: list[int]
) -> list[bytes]:
    """A site queue as the older layout wrote it: one sorted set of payloads."""
    seq = int(client.incrby(keys.seq, len(priorities))) - len(priorities)
    payloads = []
    for j, priority in enumerate(priorities, 1):
        payload = _payload(site, 1000 + seq + j, priority)
        client.zadd(keys.older_site_queue(site), {payload: -priority * BAND + seq + j})
        payloads.append(payload)
    best = client.zrange(keys.older_site_queue(site), 0, 0, withscores=True)[0][1]
    client.zadd(keys.queue, {site: best})
    client.incrby(keys.queued, len(priorities))
    return payloads


def test_site_queues_of_the_older_layout_are_leased_in_order_with_the_new(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A crawl upgraded with requests queued: its sorted sets are drained, in score order with
    what is queued since, their payloads as they were; nothing is written to them."""
    old_mixed = _older_layout(redis_client, keys, "mixed.test", [0, -10, 0, 5])
    old_alone = _older_layout(redis_client, keys, "alone.test", [0, 0])
    assert site_queue_size(redis_client, keys, "alone.test") == 2, "counted before any step"

    async def scenario(queue: LeasedQueue) -> None:
        new = [_payload("mixed.test", n, priority) for n, priority in enumerate([0, 5, -5, 10])]
        await queue.step(
            StepBatch(
                enqueue=[_entry("mixed.test", p, new[n]) for n, p in enumerate([0, 5, -5, 10])]
            )
        )
        assert site_queue_size(redis_client, keys, "mixed.test") == 8
        assert redis_client.zcard(keys.older_site_queue("mixed.test")) == 4, "never written"
        (mixed,) = read_site_queues(redis_client, keys, ["mixed.test"])
        assert OLDER in mixed.sizes
        leased = await _lease_all(queue)
        got = [x.payload for x in leased if x.site == "mixed.test"]
        # 10 (new), 5 (older, then new), 0 (older twice, then new), -5 (new), -10 (older)
        assert got == [
            new[3],
            old_mixed[3],
            new[1],
            old_mixed[0],
            old_mixed[2],
            new[0],
            new[2],
            old_mixed[1],
        ]
        scores = [x.score for x in leased if x.site == "mixed.test"]
        assert scores == sorted(scores)
        assert [x.payload for x in leased if x.site == "alone.test"] == old_alone
        assert json.loads(old_alone[0])["url"].startswith("https://alone.test/p/")

    _steps(redis_url, keys, scenario)
    assert int(redis_client.get(keys.queued)) == 0
    assert list(sites_queued(redis_client, keys)) == []


@pytest.mark.parametrize("tagged", [False, True])
def test_every_key_of_a_site_queue_is_built_from_the_queue_key_in_its_slot(
    redis_url: str, redis_client: sync_redis.Redis, keyspace: KeySpace, tagged: bool
) -> None:
    keys = dataclasses.replace(keyspace, tagged=tagged).keys("products")
    site = "shop.test:8080"

    async def scenario(queue: LeasedQueue) -> None:
        await queue.step(StepBatch(enqueue=[_entry(site, p, _payload(site, p, p)) for p in (0, 7)]))

    _steps(redis_url, keys, scenario)
    from_lua = redis_client.eval(
        _lib(
            "return {sq.index_key(ARGV[1]), sq.list_key(ARGV[1], '7'), sq.COUNTS, sq.older_key(ARGV[1])}"
        ),
        1,
        keys.queue,
        site,
    )
    built = [
        keys.site_index(site),
        keys.site_list(site, "7"),
        keys.site_counts,
        keys.older_site_queue(site),
    ]
    assert [key.decode() for key in from_lua] == built
    written = {key.decode() for key in redis_client.scan_iter(match=keys.queue + "*")} - {
        keys.queue
    }
    assert written == {
        keys.site_index(site),
        keys.site_list(site, "0"),
        keys.site_list(site, "7"),
        keys.site_counts,
    }
    for key in written:
        assert hash_tag(key) == hash_tag(keys.queue) == (keys.start_urls if tagged else None)
    assert clear_frontier(redis_client, keys) > 0
    assert not any(redis_client.scan_iter(match=keys.queue + "*"))


def test_a_hostile_payload_costs_only_itself(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    huge = b"\xff" + os.urandom(999_999)  # not UTF-8, not JSON, a megabyte
    plain = [_payload("plain.test", n) for n in range(100)]

    async def scenario(queue: LeasedQueue) -> None:
        entries = [_entry("plain.test", 0, p) for p in plain]
        await queue.step(StepBatch(enqueue=[_entry("huge.test", 0, huge), *entries]))
        used, held = site_queue_bytes(redis_client, keys, ["huge.test"])
        assert held == 1
        assert len(huge) <= used < len(huge) * 1.05 + 4096  # jemalloc's size class above it
        used, held = site_queue_bytes(redis_client, keys, ["plain.test"])
        assert held == 100
        assert used / held < sum(map(len, plain)) / len(plain), "less than the payloads themselves"
        leased = await _lease_all(queue)
        assert sorted(x.payload for x in leased) == sorted([huge, *plain])

    _steps(redis_url, keys, scenario)


def test_an_upgrade_counts_what_each_site_has_had_queued_and_leases_in_order(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A frontier of the layout that counted requests still queued (<queue>|n) and leases
    apart: after the upgrade a site's size is its count less its leases, as before, and a
    sorted-set site that had been leased from joins its index at once, so it goes first."""
    from project.frontier.layout import LAYOUT_VERSION, ensure_layout

    lists = [_payload("lists.test", n) for n in range(3)]

    async def push(queue: LeasedQueue) -> None:
        await queue.step(StepBatch(enqueue=[_entry("lists.test", 0, p) for p in lists]))

    _steps(redis_url, keys, push)
    # as the older layout left them: 3 queued, 7 leased earlier; a sorted-set site leased 4
    redis_client.hset(keys.site_counts, "lists.test", 3)
    redis_client.hset(keys.leases, mapping={"lists.test": 7, "older.test": 4})
    older = _older_layout(redis_client, keys, "older.test", [0, 0])
    redis_client.set(keys.layout, 4)

    async def upgrade() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            await ensure_layout(client, keys)
            await ensure_layout(client, keys)  # once
        finally:
            await client.aclose()

    asyncio.run(upgrade())
    assert redis_client.get(keys.layout) == str(LAYOUT_VERSION).encode()
    assert site_queue_size(redis_client, keys, "lists.test") == 3
    assert site_queue_size(redis_client, keys, "older.test") == 2
    assert redis_client.hget(keys.site_counts, "older.test") == b"6", "4 leased + 2 queued"
    later = _payload("older.test", 99)

    async def lease(queue: LeasedQueue) -> None:
        await queue.step(StepBatch(enqueue=[_entry("older.test", 0, later)]))
        got = [x.payload for x in await _lease_all(queue) if x.site == "older.test"]
        assert got == [*older, later], "the sorted set's requests came first"

    _steps(redis_url, keys, lease)
    assert site_queue_size(redis_client, keys, "lists.test") == 0
    assert site_queue_size(redis_client, keys, "older.test") == 0
