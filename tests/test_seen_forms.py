"""The seen-set's forms (FRONTIER_SEEN_MODE) in the real step script, their records in Redis,
the move of a plain set into another form, and what each costs in memory."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy.exceptions import NotConfigured

from project.frontier import lua
from project.frontier.queue import LeasedQueue, StepBatch
from project.frontier.seen import SeenConfig, SeenFormError, ensure_form, migrate
from tests.test_frontier_step import UNLIMITED, entry

if TYPE_CHECKING:
    import redis as sync_redis

    from project.frontier.keys import FrontierKeys

FORMS = {
    "set": SeenConfig("set"),
    "exact": SeenConfig("exact", 100_000),
    "bloom": SeenConfig("bloom", 100_000, 1e-6),
}


def _digest(n: int) -> bytes:
    return hashlib.sha1(b"%d" % n, usedforsecurity=False).digest()


def _entry(n: int, mode: bytes = b"f") -> tuple[bytes, str, int, bytes, str]:
    _, site, priority, payload, scope = entry(n)
    return (mode + _digest(n), site, priority, payload, scope)


async def _queue(
    client: redis.asyncio.Redis, keys: FrontierKeys, config: SeenConfig
) -> LeasedQueue:
    queue = LeasedQueue(client, None, keys, "node-a", 5000, UNLIMITED)  # type: ignore[arg-type]
    queue.seen_form = await ensure_form(client, keys, config)
    return queue


def _run(redis_url: str, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("mode", sorted(FORMS))
def test_each_form_filters_duplicates_in_and_across_batches(
    mode: str, redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, FORMS[mode])
        first = await queue.step(StepBatch(enqueue=[_entry(1), _entry(2), _entry(1)]))
        assert (first.added, first.duplicates) == (2, 1)
        second = await queue.step(StepBatch(enqueue=[_entry(2), _entry(3), _entry(4, b"m")]))
        assert (second.added, second.duplicates) == (2, 1)
        # dont_filter passes, and marks its URL seen
        third = await queue.step(StepBatch(enqueue=[_entry(4, b"m"), _entry(4)]))
        assert (third.added, third.duplicates) == (1, 1)
        many = await queue.step(StepBatch(enqueue=[_entry(n) for n in range(10, 1500)]))
        assert (many.added, many.duplicates) == (1490, 0)
        again = await queue.step(StepBatch(enqueue=[_entry(n) for n in range(10, 1500)]))
        assert (again.added, again.duplicates) == (0, 1490)

    _run(redis_url, scenario)
    if mode == "set":
        assert redis_client.scard(keys.dupefilter) == 1494
        assert not redis_client.exists(keys.dupefilter + ":conf")
    else:
        assert int(redis_client.get(keys.dupefilter + ":n")) == 1494
        assert json.loads(redis_client.get(keys.dupefilter + ":conf")) == FORMS[mode].form()
        assert not redis_client.exists(keys.dupefilter)


def test_exact_buckets_are_intsets_and_a_fingerprint_of_any_length_fits(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, FORMS["exact"])
        odd = [(b"f" + fp, "s", 0, b'{"url":"http://s/%d"}' % i, "")
               for i, fp in enumerate([b"", b"x", b"\xff" * 64, b"\n\x00"])]  # fmt: skip
        result = await queue.step(StepBatch(enqueue=[*odd, *odd]))
        assert (result.added, result.duplicates) == (4, 4)
        await queue.step(StepBatch(enqueue=[_entry(n) for n in range(200)]))

    _run(redis_url, scenario)
    buckets = [k for k in redis_client.scan_iter(match=keys.dupefilter + ":*") if k[-1:].isdigit()]
    assert buckets
    assert {redis_client.object("encoding", k) for k in buckets} == {b"intset"}


def test_a_plain_set_is_refused_by_another_form_until_it_is_moved(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    redis_client.sadd(keys.dupefilter, *[_digest(n) for n in range(2500)])

    async def scenario(client: redis.asyncio.Redis) -> None:
        with pytest.raises(SeenFormError, match="fleetcrawl seen migrate"):
            await ensure_form(client, keys, FORMS["exact"])
        assert await migrate(client, keys, FORMS["exact"]) == 2500
        with pytest.raises(SeenFormError, match="already"):
            await migrate(client, keys, FORMS["exact"])
        # a node asking for another form than the recorded one stops
        with pytest.raises(SeenFormError, match="'exact' form"):
            await ensure_form(client, keys, FORMS["bloom"])
        with pytest.raises(SeenFormError, match="'exact' form"):
            await ensure_form(client, keys, FORMS["set"])
        queue = await _queue(client, keys, SeenConfig("exact", 5_000_000))  # recorded size wins
        assert queue.seen_form == FORMS["exact"].form()
        moved = await queue.step(StepBatch(enqueue=[_entry(n) for n in range(2490, 2510)]))
        assert (moved.added, moved.duplicates) == (10, 10)

    _run(redis_url, scenario)
    assert not redis_client.exists(keys.dupefilter)


def test_migrate_refuses_while_a_node_holds_the_crawl(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, FORMS["set"])
        await queue.step(StepBatch(enqueue=[_entry(n) for n in range(50)]))  # it holds now
        with pytest.raises(SeenFormError, match=r"1 node\(s\) still hold this crawl"):
            await migrate(client, keys, FORMS["exact"])
        assert await client.scard(keys.dupefilter) == 50  # untouched
        assert not await client.exists(keys.dupefilter + ":conf")
        await client.zadd(keys.holders, {queue.node_id: 0}, xx=True)  # its deadline passed
        assert await migrate(client, keys, FORMS["exact"]) == 50

    _run(redis_url, scenario)


def test_a_garbage_form_record_stops_the_node(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    redis_client.set(keys.dupefilter + ":conf", b"\xff{not json")

    async def scenario(client: redis.asyncio.Redis) -> None:
        with pytest.raises(SeenFormError, match="not a seen-set form"):
            await ensure_form(client, keys, FORMS["exact"])

    _run(redis_url, scenario)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"mode": "cuckoo"}, "FRONTIER_SEEN_MODE"),
        ({"expected": 10}, "FRONTIER_SEEN_EXPECTED"),
        ({"expected": 1 << 40}, "FRONTIER_SEEN_EXPECTED"),
        ({"error_rate": 0.5}, "FRONTIER_SEEN_ERROR_RATE"),
        ({"error_rate": 0.0}, "FRONTIER_SEEN_ERROR_RATE"),
    ],
)
def test_unusable_sizes_are_refused(values: dict[str, object], match: str) -> None:
    config = SeenConfig(**{"mode": "bloom", **values})  # type: ignore[arg-type]
    with pytest.raises(NotConfigured, match=match):
        config.check()


def test_forms_are_sized_from_the_expected_count() -> None:
    exact = SeenConfig("exact", 10_000_000).form()
    assert exact["mode"] == "exact"
    assert 128 <= 10_000_000 / exact["buckets"] <= 256  # well under set-max-intset-entries
    bloom = SeenConfig("bloom", 1_000_000_000, 1e-6).form()
    # 28.8 bits a URL (3.6 bytes), k = 20, in parts SETBIT can address
    assert bloom["k"] == 20
    assert max(bloom["sizes"]) <= 1 << 32
    assert bloom["total"] == sum(bloom["sizes"])
    assert 28.7 < bloom["total"] / 1e9 < 28.9
    # each part one allocator size class (16 bytes of it Redis'): nothing lost to rounding
    for size in bloom["sizes"][:-1]:
        allocated = size // 8 + 16
        top = 1 << (allocated.bit_length() - 1)
        assert allocated * 4 % top == 0


def test_flush_deletes_every_key_of_a_form(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, FORMS["exact"])
        result = await queue.step(StepBatch(enqueue=[_entry(n) for n in range(300)]))
        leased = await queue.step(StepBatch(want=300))
        await queue.step(
            StepBatch(acks=[queue.request_member(x.site, x.payload) for x in leased.leased])
        )
        assert result.added == 300
        script = lua.load("flush")
        assert await client.eval(script.source, len(script.keys), *script.keys_from(keys)) > 0

    _run(redis_url, scenario)
    assert list(redis_client.scan_iter(match=keys.dupefilter + "*")) == []


@pytest.mark.parametrize(("mode", "most"), [("exact", 16.0), ("bloom", 4.0)])
def test_bytes_per_url_at_the_expected_count(
    mode: str, most: float, redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """Within each form's budget (16 and 4 bytes a URL) at 200,000 URLs, by INFO memory."""
    count = 200_000
    config = SeenConfig(mode, count, 1e-6)
    script = redis_client.register_script(lua.load("seen").source)
    form = json.dumps(config.form())
    script(keys=[keys.dupefilter], args=[json.dumps({**config.form(), "do": "test"}), _digest(0)])
    before = int(redis_client.info("memory")["used_memory"])
    if mode == "bloom":
        script(keys=[keys.dupefilter], args=[json.dumps({**config.form(), "do": "prepare"})])
    for start in range(0, count, 1000):
        script(
            keys=[keys.dupefilter], args=[form, *[_digest(n) for n in range(start, start + 1000)]]
        )
    used = int(redis_client.info("memory")["used_memory"]) - before
    assert int(redis_client.get(keys.dupefilter + ":n")) == count
    # the server is shared with other tests: other keys may come and go meanwhile
    assert used / count < most + 1.5, used / count
    test = json.dumps({**config.form(), "do": "test"})
    known = script(keys=[keys.dupefilter], args=[test, *[_digest(n) for n in range(1000)]])
    assert known == 1000
    fresh = sum(
        int(script(keys=[keys.dupefilter], args=[test, *[_digest(n) for n in range(s, s + 1000)]]))
        for s in range(count, count + 20_000, 1000)
    )
    assert fresh == 0  # exact never; Bloom at 1e-6, 0.02 expected in 20,000
    for key in redis_client.scan_iter(match=keys.dupefilter + "*", count=10_000):
        redis_client.delete(key)


def test_clear_deletes_a_compact_seen_set_and_the_revisits(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    from project.frontier.admin import clear_frontier

    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, FORMS["bloom"])
        await queue.step(StepBatch(enqueue=[_entry(n) for n in range(50)],
                                   revisits=[(b"fp", 60_000, b's\n0\n{}\n{"url":"http://s/"}')]))  # fmt: skip

    _run(redis_url, scenario)
    redis_client.sadd(keys.runs + ":members", "node")
    assert clear_frontier(redis_client, keys) > 0
    assert list(redis_client.scan_iter(match=keys.dupefilter + "*")) == []
    assert not redis_client.exists(keys.revisit, keys.due, keys.runs + ":members")


def test_a_bloom_filter_is_allocated_without_a_write_its_replica_cannot_follow(tmp_path) -> None:
    """Preparing a 10 MiB filter keeps a replica whose output buffer is capped at 4 MiB in sync.

    A filter's parts used to be written as one SET of their whole size (up to 512 MiB) from the
    script: replicated as such, it overflows the replica's output buffer, the master drops the
    link and the replica resyncs in full. SETBIT at a missing key's last bit allocates the
    part exactly (MEMORY USAGE as a SET of its size) and replicates as a few bytes.
    """
    import subprocess
    import time

    import redis as sync_redis

    from project.frontier.keys import FrontierKeys
    from project.ops.install import ensure_redis_server
    from project.ops.processes import free_port

    binary = str(ensure_redis_server())
    ports = free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
    procs = []
    try:
        for n, port in enumerate(ports):
            extra = ["--client-output-buffer-limit", "replica 4mb 2mb 10"]
            if n:
                extra = ["--replicaof", "127.0.0.1", str(ports[0])]
            (tmp_path / str(n)).mkdir()
            procs.append(subprocess.Popen(
                [binary, "--port", str(port), "--dir", str(tmp_path / str(n)), *common, *extra],
                stdout=subprocess.DEVNULL,
            ))  # fmt: skip
        master = sync_redis.Redis("127.0.0.1", ports[0])
        replica = sync_redis.Redis("127.0.0.1", ports[1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if replica.info("replication").get("master_link_status") == "up":
                    break
            except sync_redis.ConnectionError:
                pass
            time.sleep(0.1)
        assert replica.info("replication")["master_link_status"] == "up"
        keys = FrontierKeys.for_spider("products")
        config = SeenConfig("bloom", 3_000_000, 1e-6)
        form = config.form()
        assert form["total"] // 8 > 8 * 1024 * 1024, form  # past the buffer's hard limit
        script = master.register_script(lua.load("seen").source)
        script(keys=[keys.dupefilter], args=[json.dumps({**form, "do": "prepare"})])
        master.execute_command("WAIT", 1, 10_000)
        time.sleep(1.0)
        stats = master.info("stats")
        assert stats["sync_full"] == 1, stats  # the first sync only: the link never broke
        for part, bits in enumerate(form["sizes"]):
            key = f"{keys.dupefilter}:bloom:{part}"
            assert replica.strlen(key) == master.strlen(key) == (bits + 7) // 8
            # allocated at its size: what a SET of that many bytes takes
            probe = "p" * len(key)  # MEMORY USAGE counts the key's name too
            master.set(probe, b"\0" * ((bits + 7) // 8))
            assert master.memory_usage(key, samples=0) == master.memory_usage(probe, samples=0)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_bloom_filter_past_its_expected_count_warns_and_shows_in_status(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys, caplog
) -> None:
    """The step's counts carry a Bloom filter's count: WARNINGs at 80 % and 100 %, once each;
    the stats' share; `status`'s seen_fill."""
    import logging

    from scrapy.utils.test import get_crawler

    from project.frontier.seen import BloomFill
    from project.monitoring.status import frontier_snapshot

    config = SeenConfig("bloom", 1000, 1e-6)
    stats = get_crawler().stats
    fills: list[float] = []

    async def scenario(client: redis.asyncio.Redis) -> None:
        queue = await _queue(client, keys, config)
        fill = BloomFill(queue.seen_form, stats)
        for start in range(0, 1200, 300):
            await queue.step(StepBatch(enqueue=[_entry(n) for n in range(start, start + 300)]))
            result = await queue.step(StepBatch(maintain=True))
            assert result.seen_count is not None
            assert result.counts is not None  # the other counts as before
            fill.update(result.seen_count)
            fills.append(stats.get_value("frontier/seen/fill_percent"))
        plain = await _queue(
            client, keys.__class__.for_spider("plain-" + keys.spider), FORMS["set"]
        )
        assert (await plain.step(StepBatch(maintain=True))).seen_count is None

    with caplog.at_level(logging.WARNING, logger="project.frontier.seen"):
        _run(redis_url, scenario)
    assert fills[0] < 80 <= fills[2] < 100 <= fills[3], fills
    warnings = [r.getMessage() for r in caplog.records if "Bloom seen-set holds" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "90% of the 1000" in warnings[0]  # the step that passed 80 %
    assert "start the next crawl with a larger FRONTIER_SEEN_EXPECTED" in warnings[1]
    status = frontier_snapshot(redis_client, keys)
    assert status["seen_fill"] is not None
    assert status["seen_fill"] >= 1.0
