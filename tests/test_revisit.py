"""Revisit policies, their records in the step script, the conditional-request middleware
with hostile headers, and the field diffs of the change history."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from scrapy import Request, Spider, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from project.frontier.clock import FleetClock
from project.frontier.dupefilter import FleetDupeFilter
from project.frontier.ledger import Lease
from project.frontier.meta import REVISIT_META_KEY, REVISIT_OUT_META_KEY
from project.frontier.outcomes import settle_request
from project.frontier.queue import Counts, LeasedQueue, StepBatch
from project.frontier.revisit import (
    NotModified,
    RevisitConfig,
    RevisitLinksMiddleware,
    RevisitMiddleware,
    RevisitParseGuard,
    gone_refs,
    parse_duration,
    revisit_entries,
    touch_items,
)
from project.frontier.settlements import SettlementQueue
from project.frontier.signals import items_gone, seen_set_opened
from project.monitoring.status import frontier_snapshot
from project.storage.placement import PlacedItem
from project.storage.store import MongoStore
from project.storage.writes import field_changes
from tests.test_frontier_step import run
from tests.test_store import make_product

if TYPE_CHECKING:
    from pathlib import Path

    import redis as sync_redis
    from pymongo.database import Database
    from scrapy.crawler import Crawler

    from project.frontier.keys import FrontierKeys
    from project.ops.services import ServicesConfig


class _Spider(Spider):
    name = "revisits"

    def parse_product(self, response: Any) -> None:
        pass


def _config(**settings: Any) -> RevisitConfig:
    return RevisitConfig.from_settings(get_crawler(_Spider, settings).settings)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90.0), ("90", 90.0), ("30s", 30.0), ("15m", 900.0), ("1h", 3600.0), ("1d", 86400.0),
     ("2w", 1209600.0), (" 1.5H ", 5400.0), (0, 0.0)],
)  # fmt: skip
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "1y", "-1h", "h", "1h30m", True, None, "9" * 400, "1e9d", [1]]
)
def test_garbage_durations_are_refused_naming_the_setting(text: object) -> None:
    with pytest.raises(NotConfigured, match="FRONTIER_REVISIT"):
        parse_duration(text, "FRONTIER_REVISIT['x']")


def test_policies_match_by_pattern_then_callback_in_order() -> None:
    config = _config(
        FRONTIER_REVISIT={"/category/": "1h", "@parse_product": "1d", r"\?page=\d+$": 60}
    )
    spider = _Spider()
    assert config.interval(Request("http://s/category/a")) == 3600
    assert config.interval(Request("http://s/p/1", callback=spider.parse_product)) == 86400
    assert config.interval(Request("http://s/p/1?page=2")) == 60
    assert config.interval(Request("http://s/about")) == 0


@pytest.mark.parametrize(
    ("value", "match"),
    [({"(": "1h"}, "regular expression"), ({"/a/": "soon"}, "duration"), ({"": "1h"}, "pattern"),
     ({1: "1h"}, "pattern")],
)  # fmt: skip
def test_unusable_policies_stop_the_node(value: dict[Any, Any], match: str) -> None:
    with pytest.raises(NotConfigured, match=match):
        _config(FRONTIER_REVISIT=value)


def test_adaptive_intervals_move_within_their_bounds() -> None:
    fixed = _config(FRONTIER_REVISIT={".": "1d"})
    assert fixed.next_interval(7200, 86400, changed=True) == 86400
    adaptive = _config(
        FRONTIER_REVISIT={".": "1d"}, FRONTIER_REVISIT_ADAPTIVE=True,
        FRONTIER_REVISIT_MIN="1h", FRONTIER_REVISIT_MAX="2d",
    )  # fmt: skip
    assert adaptive.next_interval(0, 86400, changed=None) == 86400  # first fetch: the policy's
    assert adaptive.next_interval(86400, 86400, changed=True) == pytest.approx(86400 * 0.8)
    assert adaptive.next_interval(86400, 86400, changed=False) == pytest.approx(86400 * 1.4)
    interval = 86400.0
    for _ in range(50):
        interval = adaptive.next_interval(interval, 86400, changed=False)
    assert interval == 2 * 86400
    for _ in range(50):
        interval = adaptive.next_interval(interval, 86400, changed=True)
    assert interval == 3600
    with pytest.raises(NotConfigured, match="FRONTIER_REVISIT_MIN"):
        _config(FRONTIER_REVISIT={".": "1d"}, FRONTIER_REVISIT_MIN="2d", FRONTIER_REVISIT_MAX="1d")


# -- the step script's revisit phase -------------------------------------------------------


def _entry(n: int, mode: bytes = b"r") -> tuple[bytes, str, int, bytes, str]:
    return (mode + b"fp%d" % n, "s", 0, b'{"url":"http://s/%d"}' % n, "")


def _record(
    n: int, interval_ms: int, record: dict[str, Any] | None = None
) -> tuple[bytes, int, bytes]:
    blob = (
        b"s\n0\n" + json.dumps(record or {"etag": '"v1"'}).encode() + b'\n{"url":"http://s/%d"}' % n
    )
    return (b"fp%d" % n, interval_ms, blob)


def test_a_seen_url_goes_again_once_due_with_its_record_and_once_per_run(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(enqueue=[_entry(1), _entry(2), _entry(3)]))
        leased = (await a.step(StepBatch(want=3))).leased
        await a.step(StepBatch(acks=[a.request_member(x.site, x.payload) for x in leased],
                               revisits=[_record(1, 1), _record(2, 3_600_000)]))  # fmt: skip
        await asyncio_sleep(0.01)
        again = await a.step(StepBatch(enqueue=[_entry(1), _entry(2)], want=5))
        assert (again.added, again.duplicates, again.rediscovered, again.handed_out) == (1, 1, 1, 0)
        (revisit,) = [x for x in again.leased if b"revisit" in x.payload]
        assert json.loads(revisit.payload) == {"url": "http://s/1", "revisit": {"etag": '"v1"'}}
        # fetched in run 1; in run 2 it goes once, and a second rediscovery finds it queued
        redis_client.hset(keys.runs, "id", "run-1")
        await a.step(StepBatch(revisits=[_record(3, 1)]))
        redis_client.hset(keys.runs, "id", "run-2")
        await asyncio_sleep(0.01)
        assert (await a.step(StepBatch(enqueue=[_entry(3)]))).rediscovered == 1
        await asyncio_sleep(0.01)
        assert (await a.step(StepBatch(enqueue=[_entry(3)]))).duplicates == 1
        # interval 0: the URL left its policy, its record goes
        await a.step(StepBatch(revisits=[(b"fp1", 0, b"")]))
        assert not redis_client.hexists(keys.revisit, b"fp1")

    run(redis_url, keys, scenario)


def test_maintenance_hands_out_due_revisits_and_drops_garbage_records(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    redis_client.hset(keys.revisit, mapping={b"junk": b"no newlines", b"fp9": b"5\n\n\n\n{}\n"})
    redis_client.zadd(keys.due, {b"junk": 0, b"fp9": 0})

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        await a.step(StepBatch(revisits=[_record(n, 300) for n in range(5)]))
        await asyncio_sleep(0.35)
        # the garbage first (score 0): dropped, not handed out
        result = await a.step(StepBatch(maintain=True, revisit_due=4, want=10))
        assert (result.rediscovered, result.handed_out) == (0, 2)
        assert redis_client.zscore(keys.due, b"junk") is None
        assert not redis_client.hexists(keys.revisit, b"fp9")
        result = await a.step(StepBatch(maintain=True, revisit_due=100, want=10))
        assert (result.rediscovered, result.handed_out) == (
            0,
            3,
        )  # the two handed out are due again 300 ms later
        assert (await a.step(StepBatch(maintain=True, revisit_due=100))).handed_out == 0

    run(redis_url, keys, scenario)


def test_the_sweep_queues_the_due_pages_this_run_has_not_seen_and_only_those(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """Before a run ends, its idle nodes queue the due pages it neither rediscovered, nor
    seeded, nor fetched; each once, with its record; a bounded scan says when more are left."""

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        redis_client.hset(keys.runs, "id", "run-1")
        await a.step(StepBatch(enqueue=[_entry(n) for n in range(1, 5)]))
        leased = (await a.step(StepBatch(want=4))).leased
        await a.step(StepBatch(acks=[a.request_member(x.site, x.payload) for x in leased],
                               revisits=[_record(n, 1, {"items": [["p", f"{n}"]]})
                                         for n in range(1, 5)]))  # fmt: skip
        redis_client.hset(keys.runs, "id", "run-2")
        await asyncio_sleep(0.01)
        # run 2 rediscovers page 1 and is seeded with page 2
        step = await a.step(StepBatch(enqueue=[_entry(1), _entry(2, b"s")]))
        assert (step.rediscovered, step.added) == (1, 2)
        # while anything is queued or leased, the sweep waits: it could still be rediscovered
        assert (await a.step(StepBatch(count=True, sweep=10))).handed_out == 0
        queued = [json.loads(x.payload) for x in (await a.step(StepBatch(want=10))).leased]
        assert (await a.step(StepBatch(count=True, sweep=10))).handed_out == 0
        await a.step(StepBatch(acks=list(redis_client.zrange(keys.inflight, 0, -1))))
        swept = await a.step(StepBatch(count=True, sweep=10))
        assert swept.handed_out == 2  # pages 3 and 4
        assert swept.counts is not None
        assert swept.counts.revisits == 2  # queued: not over
        # the run's four pages, each queued once: rediscovered, seeded, swept
        queued += [json.loads(x.payload) for x in (await a.step(StepBatch(want=10))).leased]
        assert sorted(x["url"] for x in queued) == [f"http://s/{n}" for n in range(1, 5)]
        assert [x["revisit"]["items"] for x in queued if x["url"] in ("http://s/3", "http://s/4")]
        await a.step(StepBatch(acks=list(redis_client.zrange(keys.inflight, 0, -1))))
        assert (await a.step(StepBatch(count=True, sweep=10))).counts == Counts()  # over
        # a scan that found only pages of this run, as many as it may look at: not over yet
        await asyncio_sleep(0.01)
        bounded = await a.step(StepBatch(count=True, sweep=1))
        assert bounded.handed_out == 0
        assert bounded.counts == Counts(revisits=1)
        # no crawl run: no sweep
        redis_client.hdel(keys.runs, "id")
        assert (await a.step(StepBatch(count=True, sweep=10))).counts == Counts()

    run(redis_url, keys, scenario)


def _site_record(site: str, n: int, interval_ms: int = 1) -> tuple[bytes, int, bytes]:
    blob = f'{site}\n0\n{{"h":"x"}}\n{{"url":"http://{site}/{n}"}}'.encode()
    return (f"{site}-{n}".encode(), interval_ms, blob)


def test_revisit_records_are_capped_in_all_and_per_site(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """A new URL past FRONTIER_REVISIT_MAX_URLS or _MAX_SITE_URLS is not recorded (counted);
    a record rewritten costs no room; a record forgotten gives its room back."""
    limits = (3, 2, 0, 0)

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        first = await a.step(StepBatch(revisit_limits=limits, revisits=[
            _site_record("s", 1), _site_record("s", 2), _site_record("s", 3),
            _site_record("t", 1)]))  # fmt: skip
        assert first.revisits_capped == 1  # s-3: the site's cap
        assert sorted(redis_client.hkeys(keys.revisit)) == [b"s-1", b"s-2", b"t-1"]
        assert redis_client.hgetall(keys.revisit_sites) == {b"s": b"2", b"t": b"1"}
        assert redis_client.zscore(keys.due, b"s-3") is None
        again = await a.step(StepBatch(revisit_limits=limits, revisits=[
            _site_record("s", 1), _site_record("u", 1)]))  # fmt: skip
        assert again.revisits_capped == 1  # u-1: the cap in all; s-1 was rewritten
        await a.step(StepBatch(revisit_limits=limits, revisits=[(b"s-1", 0, b"")]))
        assert redis_client.hgetall(keys.revisit_sites) == {b"s": b"1", b"t": b"1"}
        room = await a.step(StepBatch(revisit_limits=limits, revisits=[_site_record("u", 1)]))
        assert room.revisits_capped == 0
        assert redis_client.hlen(keys.revisit) == 3
        await asyncio_sleep(0.01)
        shown = frontier_snapshot(redis_client, keys)["revisits"]  # fleetcrawl status
        assert shown == {"records": 3, "sites": 3, "due": 3}

    run(redis_url, keys, scenario)


def test_a_record_no_run_rediscovers_is_forgotten_after_its_runs_and_time(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    """The sweep fetches a page no run links to; after FRONTIER_REVISIT_FORGET_RUNS such runs
    in a row, over at least FRONTIER_REVISIT_FORGET_AFTER, it is forgotten; a rediscovery
    starts the count again."""

    async def sweep(a: LeasedQueue, run_id: str, limits: tuple[int, ...]) -> Any:
        redis_client.hset(keys.runs, "id", run_id)
        await asyncio_sleep(0.01)  # due again
        result = await a.step(StepBatch(count=True, sweep=10, revisit_limits=limits))
        await a.step(StepBatch(want=10))
        await a.step(StepBatch(acks=list(redis_client.zrange(keys.inflight, 0, -1))))
        return result

    async def scenario(a: LeasedQueue, _: LeasedQueue) -> None:
        limits = (100, 100, 2, 0)
        redis_client.hset(keys.runs, "id", "run-0")
        await a.step(StepBatch(enqueue=[_entry(1), _entry(2)]))
        await a.step(StepBatch(want=2))
        await a.step(StepBatch(acks=list(redis_client.zrange(keys.inflight, 0, -1)),
                               revisits=[_record(1, 1), _record(2, 1)],
                               revisit_limits=limits))  # fmt: skip
        assert (await sweep(a, "run-1", limits)).handed_out == 2  # missed once
        # run 2 rediscovers page 2: its misses start again
        redis_client.hset(keys.runs, "id", "run-2")
        await asyncio_sleep(0.01)
        assert (await a.step(StepBatch(enqueue=[_entry(2)]))).rediscovered == 1
        await a.step(StepBatch(want=10))
        await a.step(StepBatch(acks=list(redis_client.zrange(keys.inflight, 0, -1))))
        assert (await sweep(a, "run-2", limits)).handed_out == 1  # page 1: missed twice
        third = await sweep(a, "run-3", limits)
        assert (third.handed_out, third.revisits_forgotten) == (1, 1)  # page 1 forgotten
        assert not redis_client.hexists(keys.revisit, b"fp1")
        assert redis_client.zscore(keys.due, b"fp1") is None
        assert redis_client.hexists(keys.revisit, b"fp2")
        assert redis_client.hget(keys.revisit_sites, "s") == b"1"
        # a window longer than the runs took: missed often, not forgotten yet
        slow = (100, 100, 1, 3_600_000)
        for run_id in ("run-4", "run-5", "run-6"):
            assert (await sweep(a, run_id, slow)).revisits_forgotten == 0
        assert redis_client.hexists(keys.revisit, b"fp2")

    run(redis_url, keys, scenario)


def test_the_layout_upgrade_counts_each_sites_revisit_records(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    from project.frontier.layout import ensure_layout

    redis_client.hset(keys.revisit, mapping={
        b"a": b"5\nr\ns\n0\n{}\n{}", b"b": b"5\nr\ns\n0\n{}\n{}",
        b"c": b"5\nr\nt\n0\n{}\n{}", b"junk": b"no lines"})  # fmt: skip
    redis_client.set(keys.layout, 5)

    async def upgrade() -> None:
        client = redis.asyncio.from_url(redis_url)
        try:
            await ensure_layout(client, keys)
        finally:
            await client.aclose()

    asyncio.run(upgrade())
    assert redis_client.hgetall(keys.revisit_sites) == {b"s": b"2", b"t": b"1"}


def _fetched(status: int | None, yielded: list[list[str]], **out: Any) -> Request:
    """A request whose page gave items a, b and c last time, fetched now as given."""
    last = {"h": "x", "items": [["p", "a"], ["p", "b"], ["q", "c"]], "t": 1_700_000_000.5}
    record = {"h": "y", "i": 1000, "items": yielded}
    meta = {REVISIT_META_KEY: last, REVISIT_OUT_META_KEY: {"fp": b"f", "interval": 1.0,
                                                          "record": record, **out}}  # fmt: skip
    if status is not None:
        meta[REVISIT_OUT_META_KEY]["status"] = status
    return Request("http://s/p/1", meta=meta)


@pytest.mark.parametrize(
    ("status", "yielded", "out", "gone"),
    [
        # a page parsed whole that no longer yields b and c
        (200, [["p", "a"]], {"parsed": True}, [("p", "b"), ("q", "c")]),
        (203, [["p", "a"], ["p", "b"], ["q", "c"]], {"parsed": True}, []),
        # the page is gone: all it gave
        (404, [], {}, [("p", "a"), ("p", "b"), ("q", "c")]),
        (410, [], {}, [("p", "a"), ("p", "b"), ("q", "c")]),
        # no evidence: a callback that raised, an item dropped or not named, an error, a 304
        (200, [["p", "a"]], {}, []),
        (200, [["p", "a"]], {"parsed": True, "unsure": True}, []),
        (503, [], {"parsed": True}, []),
        (500, [], {}, []),
        (None, [], {"parsed": True}, []),
        (302, [], {"parsed": True}, []),
        # a page that answers "accepted", "no content" or a part shows not all it has
        (202, [], {"parsed": True}, []),
        (204, [], {"parsed": True}, []),
        (206, [], {"parsed": True}, []),
    ],
)
def test_an_item_is_gone_only_on_evidence_from_its_page(
    status: int | None, yielded: list[list[str]], out: dict[str, Any], gone: list[Any]
) -> None:
    refs, before = gone_refs(_fetched(status, yielded, **out))
    assert refs == gone
    if gone:  # not seen after the page's last fetch named them: the moment it settled
        assert before == 1_700_000_000.5


def test_a_callback_that_says_it_could_not_read_its_page_tells_nothing_gone() -> None:
    request = _fetched(200, [], parsed=True)
    assert gone_refs(request)[0]
    request.meta["revisit_unsure"] = True  # the products spider, when Chromium shows nothing
    assert gone_refs(request) == ([], None)


def test_a_record_without_its_fetch_time_is_no_evidence() -> None:
    """Records written before fleetcrawl stamped them (``t``), or with a garbage one."""
    for t in (None, "soon", True, -5, 1e300):
        request = _fetched(404, [])
        request.meta[REVISIT_META_KEY]["t"] = t
        assert gone_refs(request) == ([], None), t


def test_no_last_record_or_a_garbage_one_is_no_evidence() -> None:
    request = Request("http://s/p/1", meta={REVISIT_OUT_META_KEY: {"status": 404, "record": {}}})
    assert gone_refs(request) == ([], None)
    for last in ({"items": "all", "t": 5.0}, {"items": [[1, 2], "x", ["a"]]}, "text", None):
        meta = {REVISIT_META_KEY: last, REVISIT_OUT_META_KEY: {"status": 404, "record": {}}}
        assert gone_refs(Request("http://s/p/1", meta=meta)) == ([], None)


def test_a_page_whose_item_was_dropped_or_that_raised_tells_nothing_gone() -> None:
    """The middleware hears Scrapy's signals: an item dropped, an item error, a callback error."""
    middleware, crawler = _middleware()
    for signal in (signals.item_dropped, signals.item_error, signals.spider_error):
        request = _fetched(200, [], parsed=True)
        response = HtmlResponse(request.url, body=b"", request=request)
        assert gone_refs(request)[0]
        crawler.signals.send_catch_log(signal, item={}, response=response, spider=crawler.spider,
                                       exception=ValueError("x"), failure=None)  # fmt: skip
        assert gone_refs(request) == ([], None), signal
    del middleware


def test_a_parse_that_asks_for_its_own_page_again_tells_nothing_gone() -> None:
    """A page fetched again through Chromium (the products spider's fallback) yields its items
    from that second request: the first parse, which yields none, is no evidence."""
    crawler = get_crawler(_Spider, {"FRONTIER_REVISIT": {".": "1h"}})
    links = RevisitLinksMiddleware.from_crawler(crawler)
    for again, gone in ((True, []), (False, [("p", "a"), ("p", "b"), ("q", "c")])):
        request = _fetched(200, [])
        response = HtmlResponse(request.url, body=b"", request=request)
        other = request.url if again else "http://s/p/2"
        list(links.process_spider_output(response, [Request(other, dont_filter=True)]))
        assert gone_refs(request)[0] == gone
    # the same URL asked with another body (an API's next page) is another request
    request = _fetched(200, [])
    response = HtmlResponse(request.url, body=b"", request=request)
    nxt = Request(request.url, method="POST", body=b'{"page":2}')
    list(links.process_spider_output(response, [nxt]))
    assert gone_refs(request)[0]


def test_a_callback_error_a_middleware_swallows_is_still_no_evidence() -> None:
    """RevisitParseGuard, next to the spider, hears the exception first."""
    crawler = get_crawler(_Spider, {"FRONTIER_REVISIT": {".": "1h"}})
    guard = RevisitParseGuard.from_crawler(crawler)
    request = _fetched(200, [], parsed=True)
    response = HtmlResponse(request.url, body=b"", request=request)
    assert guard.process_spider_exception(response, ValueError("x")) is None
    assert gone_refs(request) == ([], None)


def test_the_fleet_clock_keeps_the_offset_of_its_shortest_recent_round_trip() -> None:
    clock = FleetClock()
    assert not clock.synced
    clock.observe(1_000_000_500, 1_000_000.0, 1_000_000.2)  # Redis 0.4 s ahead, a 200 ms trip
    assert abs(clock.offset - 0.4) < 1e-6
    clock.observe(1_000_001_000, 1_000_000.5, 1_000_000.52)  # a 20 ms trip: better
    assert abs(clock.offset - 0.49) < 1e-6
    clock.observe(1_000_009_000, 1_000_001.0, 1_000_001.5)  # a slower trip does not replace it
    assert abs(clock.offset - 0.49) < 1e-6
    clock.observe(1_000_100_000, 1_000_100.0, 1_000_100.5)  # a minute later, any sample does
    assert abs(clock.offset - -0.25) < 1e-6
    clock.observe(None, 1.0, 2.0)  # a reply without Redis' time changes nothing
    clock.observe(5, 2.0, 1.0)
    assert abs(clock.offset - -0.25) < 1e-6


async def asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


# -- the middleware, against hostile answers ------------------------------------------------


def _middleware(**settings: Any) -> tuple[RevisitMiddleware, Any]:
    crawler = get_crawler(_Spider, {"FRONTIER_REVISIT": {".": "1h"}, **settings})
    crawler.spider = crawler._create_spider()
    middleware = RevisitMiddleware.from_crawler(crawler)
    middleware._fingerprint = lambda request: b"fp"  # type: ignore[method-assign]
    return middleware, crawler


@pytest.mark.parametrize(
    "etag",
    [b"x" * 100_000, "é".encode(), b"\x00\n\r", "\u202e\ud800".encode("utf-8", "surrogatepass")],
)
def test_hostile_validators_are_not_sent_back(etag: bytes) -> None:
    middleware, _ = _middleware()
    request = Request("http://s/p/1")
    response = HtmlResponse(request.url, body=b"<p>x</p>", request=request,
                            headers={b"ETag": etag, b"Last-Modified": etag})  # fmt: skip
    assert asyncio.run(middleware.process_response(request, response)) is response
    record = request.meta[REVISIT_OUT_META_KEY]["record"]
    assert "etag" not in record
    assert "lm" not in record
    (entry,) = revisit_entries(
        request, "s", b'{"url":"http://s/p/1","revisit":{"h":"x"}}', 1_700_000_000.0
    )
    assert b"\n" not in entry[2].split(b"\n", 3)[2]  # the record is one line
    assert json.loads(entry[2].split(b"\n", 3)[3]) == {"url": "http://s/p/1"}


def test_a_304_is_unchanged_and_a_changed_body_is_changed() -> None:
    middleware, crawler = _middleware()
    request = Request("http://s/p/1", meta={REVISIT_META_KEY: {"etag": '"v1"', "h": "old", "i": 5}})
    assert middleware.process_request(request) is None
    assert request.headers[b"If-None-Match"] == b'"v1"'
    with pytest.raises(NotModified):
        asyncio.run(
            middleware.process_response(
                request, HtmlResponse(request.url, status=304, request=request)
            )
        )
    assert crawler.stats.get_value("revisit/not_modified") == 1
    assert request.meta[REVISIT_OUT_META_KEY]["record"]["etag"] == '"v1"'
    again = Request("http://s/p/1", meta={REVISIT_META_KEY: {"h": "old"}})
    response = HtmlResponse(again.url, body=b"new", request=again, headers={b"ETag": b'"v2"'})
    asyncio.run(middleware.process_response(again, response))
    assert crawler.stats.get_value("revisit/changed") == 1
    assert again.meta[REVISIT_OUT_META_KEY]["record"]["etag"] == '"v2"'


def test_a_garbage_record_from_redis_costs_nothing() -> None:
    middleware, _ = _middleware()
    for record in ({"etag": 5, "lm": ["x"], "i": "soon", "items": "all"}, "text", None, 7):
        request = Request("http://s/p/1", meta={REVISIT_META_KEY: record})
        assert middleware.process_request(request) is None
        assert b"If-None-Match" not in request.headers
        response = HtmlResponse(request.url, status=304, request=request)
        try:
            asyncio.run(middleware.process_response(request, response))
        except NotModified:
            assert isinstance(record, dict)


def test_records_are_keyed_by_the_seen_set_the_scheduler_opened() -> None:
    """Without the fleet's scheduler nothing is recorded; with it, its seen-set's members."""
    crawler = get_crawler(_Spider, {"FRONTIER_REVISIT": {".": "1h"}})
    middleware = RevisitMiddleware.from_crawler(crawler)
    request = Request("http://s/p/1")
    response = HtmlResponse(request.url, body=b"<p>x</p>", request=request)
    assert asyncio.run(middleware.process_response(request, response)) is response
    assert REVISIT_OUT_META_KEY not in request.meta
    assert crawler.request_fingerprinter is not None
    seen_set = FleetDupeFilter(None, "k", crawler.request_fingerprinter)
    crawler.signals.send_catch_log(seen_set_opened, dupefilter=seen_set)
    asyncio.run(middleware.process_response(request, response))
    assert request.meta[REVISIT_OUT_META_KEY]["fp"] == seen_set.fingerprint(request)


def _scraped(crawler: Any, item: Any, **record: Any) -> dict[str, Any]:
    """The record *item*'s page leaves for its next fetch, once *item* was scraped."""
    request = Request(
        "http://s/p/1", meta={REVISIT_OUT_META_KEY: {"record": {"items": [], **record}}}
    )
    response = HtmlResponse(request.url, body=b"", request=request)
    crawler.signals.send_catch_log(
        signals.item_scraped, item=item, response=response, spider=crawler.spider
    )
    return dict(request.meta[REVISIT_OUT_META_KEY]["record"])


def test_a_stored_item_is_named_in_its_pages_record_by_the_store(tmp_path: Path) -> None:
    """The record names what the store answers for the item; no store, the record is as it was."""
    without = _middleware()  # kept: a signal holds its receiver weakly
    item, validators = {"sku": "1"}, {"etag": '"e"', "lm": "Mon"}
    assert _scraped(without[1], item, **validators) == {"items": [], **validators}
    with_store = _middleware(MONGO_JOURNAL_DIR=str(tmp_path / "journal"))
    crawler = with_store[1]
    store = MongoStore.from_crawler(crawler)
    store.remember(item, PlacedItem("item", "things", "id-1", {}, "h", "thing"))
    assert _scraped(crawler, item, **validators) == {"items": [["things", "id-1"]], **validators}
    # an item the store cannot name: no validators, so the next fetch parses the page again
    assert _scraped(crawler, {"sku": "2"}, **validators) == {"items": []}


async def _open_store(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> tuple[Crawler, MongoStore]:
    """A crawler and its store, open, writing to *mongo*."""
    crawler = get_crawler(_Spider, {"MONGO_URI": services.mongo_url,
        "MONGO_DATABASE": mongo.name, "MONGO_JOURNAL_DIR": str(tmp_path / "journal")})  # fmt: skip
    store = MongoStore.from_crawler(crawler)
    await store.open()
    return crawler, store


def test_items_the_frontier_names_still_there_are_touched_by_the_store(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    """touch_items (a 304, a page not due) reaches the store through its signal: last_seen moves."""

    async def run() -> tuple[dict[str, Any], Any]:
        # the pymongo calls block the loop: nothing else runs on it here
        crawler, store = await _open_store(services, mongo, tmp_path)
        await store.save_product(make_product(1))
        before = mongo.products.find_one()
        assert before is not None
        long_ago = datetime(2020, 1, 1, tzinfo=UTC)
        mongo.products.update_one({"_id": before["_id"]}, {"$set": {"last_seen": long_ago}})
        records = [json.dumps({"items": [["products", before["_id"]]]}).encode(), b"garbage"]
        touch_items(crawler, records)
        deadline = time.monotonic() + 10
        while not crawler.stats.get_value("mongo/touched") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await store.close()
        return before, crawler.stats

    before, stats = asyncio.run(run())
    after = mongo.products.find_one({"_id": before["_id"]})
    assert stats.get_value("mongo/touched") == 1
    assert after is not None
    assert after["last_seen"].replace(tzinfo=UTC) > datetime(2020, 1, 2, tzinfo=UTC)


def test_the_store_marks_gone_only_what_was_not_seen_since_and_records_each_once(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    """items_gone reaches the store: gone_at and one change for an item last seen before the
    evidence; an item seen after it, one gone already, a replay or an unknown id: nothing."""
    one, two = "http://shop.test/product/1", "http://shop.test/product/2"

    async def run() -> Any:
        crawler, store = await _open_store(services, mongo, tmp_path)
        await store.save_product(make_product(1), seen=1_000_000.0)
        await store.save_product(make_product(2), seen=3_000_000.0)  # seen after the evidence
        # a page that named both at 2,000,000 no longer does: product 2 was seen since
        await store.gone([("products", one), ("products", two), ("products", "nope")],
                         before=2_000_000.0, at=2_100_000.0)  # fmt: skip
        await store.gone([("products", one)], before=2_000_000.0, at=2_500_000.0)  # a replay
        # evidence from a page that named product 2 after its sighting: gone, at the store's
        # clock (now)
        crawler.signals.send_catch_log(items_gone, refs=[("products", two)], before=3_500_000.0)
        deadline = time.monotonic() + 10
        while crawler.stats.get_value("mongo/gone_evidence", 0) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await store.close()
        return crawler.stats

    stats = asyncio.run(run())
    first, second = mongo.products.find_one({"_id": one}), mongo.products.find_one({"_id": two})
    assert first is not None
    assert second is not None
    assert first["gone_at"].replace(tzinfo=UTC) == datetime.fromtimestamp(2_100_000, UTC)
    # not by the evidence older than its sighting; by the signal's, at the store's clock (now)
    assert second["gone_at"].replace(tzinfo=UTC) > datetime.fromtimestamp(3_000_000, UTC)
    changes = list(mongo.changes.find({"field": "gone_at"}))
    assert sorted(c["item_id"] for c in changes) == [one, two]
    assert stats.get_value("mongo/gone") == 2
    assert stats.get_value("mongo/gone_evidence") == 5


def test_a_gone_mark_written_again_adds_no_change_and_an_item_back_is_a_write(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    """The same gone record written twice (its batch replayed) leaves one change: its _id
    comes from the stamp the marking wrote. An item seen again after it was gone, its content
    the same, is written: ``written_at`` moves (a since-read gets it) and a change says so;
    the sighting the mark outdated, written again, brings nothing back."""
    one = "http://shop.test/product/1"

    async def run() -> None:
        _, store = await _open_store(services, mongo, tmp_path)
        await store.save_product(make_product(1), seen=1_000_000.0)
        for _ in range(2):  # the same record, as a replay sends it
            await store.gone([("products", one)], before=2_000_000.0, at=2_100_000.0)
            await asyncio.sleep(0.05)
        marked = mongo.products.find_one({"_id": one})
        assert marked is not None
        # the sighting the mark outdated, written again (its batch replayed): still gone
        await store.save_product(make_product(1), seen=1_000_000.0)
        still = mongo.products.find_one({"_id": one})
        assert still is not None
        assert still.get("gone_at") == marked["gone_at"]
        assert still["written_at"] == marked["written_at"]
        await asyncio.sleep(0.01)
        await store.save_product(make_product(1), seen=3_000_000.0)  # back, unchanged
        await store.close()
        back = mongo.products.find_one({"_id": one})
        assert back is not None
        assert "gone_at" not in back
        assert back["written_at"] > marked["written_at"]

    asyncio.run(run())
    changes = list(mongo.changes.find({"item_id": one}).sort("_id", 1))
    assert [(c["field"], c["new"] is None) for c in changes] == [("gone_at", False),
                                                                  ("gone_at", True)]  # fmt: skip
    assert changes[1]["old"] is not None


def test_a_304_that_names_an_item_marked_gone_brings_it_back_as_a_write(
    services: ServicesConfig, mongo: Database[Any], tmp_path: Path
) -> None:
    """A touch (a 304 page naming its items) newer than a gone item's last sighting brings it
    back as a parsed sighting does: ``gone_at`` goes, ``written_at`` moves, one change; the
    same touch again adds nothing, an older one leaves an item gone, an unknown id is no harm."""
    one, two = "http://shop.test/product/1", "http://shop.test/product/2"

    async def run() -> Any:
        crawler, store = await _open_store(services, mongo, tmp_path)
        await store.save_product(make_product(1), seen=1_000_000.0)
        await store.save_product(make_product(2), seen=1_500_000.0)
        await store.gone([("products", one), ("products", two)], before=2_000_000.0, at=2_100_000.0)
        marked = mongo.products.find_one({"_id": one})
        for _ in range(2):  # the same touch, as a replay sends it
            await store.touch([("products", one), ("products", "unknown")], seen=3_000_000.0)
        await store.touch([("products", two)], seen=1_200_000.0)  # older than its sighting
        await store.close()
        return marked, crawler.stats

    marked, stats = asyncio.run(run())
    back, still = mongo.products.find_one({"_id": one}), mongo.products.find_one({"_id": two})
    assert back is not None
    assert still is not None
    assert "gone_at" not in back
    assert back["last_seen"].replace(tzinfo=UTC) == datetime.fromtimestamp(3_000_000, UTC)
    assert back["written_at"] > marked["written_at"]
    assert still["gone_at"].replace(tzinfo=UTC) == datetime.fromtimestamp(2_100_000, UTC)
    changes = list(mongo.changes.find({"item_id": one}).sort("_id", 1))
    assert [(c["field"], c["new"] is None) for c in changes] == [("gone_at", False),
                                                                  ("gone_at", True)]  # fmt: skip
    assert changes[1]["crawl_id"] == changes[0]["crawl_id"]
    assert stats.get_value("mongo/touched_back") == 1


# -- change history --------------------------------------------------------------------


def test_field_changes_name_each_changed_field_dotted_and_skip_bookkeeping() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    old = {"_id": "u", "price": 10.0, "offers": {"price": 10, "currency": "EUR"}, "tags": [1, 2],
           "gone": "x", "last_seen": at, "content_hash": "a", "when": at.replace(tzinfo=None)}  # fmt: skip
    new = {"_id": "u", "price": 12.5, "offers": {"price": 12, "currency": "EUR"}, "tags": [2, 1],
           "added": True, "last_seen": datetime.now(UTC), "content_hash": "b", "when": at}  # fmt: skip
    assert field_changes(old, new) == [
        ("added", None, True),
        ("gone", "x", None),
        ("offers.price", 10, 12),
        ("price", 10.0, 12.5),
        ("tags", [1, 2], [2, 1]),
    ]
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(50):
        cursor["a"] = {}
        cursor = cursor["a"]
    assert len(field_changes({"x": deep}, {"x": {}})) == 1


def test_a_redirected_page_also_records_the_url_its_links_name() -> None:
    middleware, _ = _middleware()
    middleware._fingerprint = lambda request: request.url.encode()  # type: ignore[method-assign]
    request = Request("http://s/new", meta={"redirect_urls": ["http://s/old"], "redirect_times": 1})
    response = HtmlResponse(
        request.url, body=b"<p>x</p>", request=request, headers={b"ETag": b'"e"'}
    )
    asyncio.run(middleware.process_response(request, response))
    payload = (
        b'{"url":"http://s/new","meta":{"redirect_urls":["http://s/old"],"redirect_times":1,"k":2}}'
    )
    own, first = revisit_entries(request, "s", payload, 1_700_000_000.0)
    assert own[0] == b"http://s/new"
    assert json.loads(own[2].split(b"\n", 3)[2])["etag"] == '"e"'
    assert first[0] == b"http://s/old"
    assert first[1] == 3_600_000
    _site, _priority, record, original = first[2].split(b"\n", 3)
    assert json.loads(record) == {"redirect": 1}  # no validators: fetched whole, it redirects
    assert json.loads(original) == {"url": "http://s/old", "meta": {"k": 2}}


def test_a_record_over_its_byte_cap_drops_its_items_then_is_not_kept() -> None:
    """FRONTIER_REVISIT_MAX_RECORD_BYTES: a page naming many long item ids keeps none of them
    (nor validators: its next fetch is a whole one), and a request too big is not recorded."""
    middleware, _ = _middleware()
    request = Request("http://s/p/1")
    response = HtmlResponse(request.url, body=b"<p>x</p>", request=request,
                            headers={b"ETag": b'"e"'})  # fmt: skip
    asyncio.run(middleware.process_response(request, response))
    record = request.meta[REVISIT_OUT_META_KEY]["record"]
    record["items"] = [["products", "x" * 500] for _ in range(40)]  # about 20 KB
    payload = b'{"url":"http://s/p/1"}'
    (whole,) = revisit_entries(request, "s", payload, 1.0, max_bytes=10**6)
    assert len(whole[2]) > 20_000
    (small,) = revisit_entries(request, "s", payload, 1.0, max_bytes=8192)
    kept = json.loads(small[2].split(b"\n", 3)[2])
    assert kept["items"] == []
    assert "etag" not in kept
    assert len(small[2]) < 200
    # this fetch's own evidence is untouched: the page did yield those items
    assert len(request.meta[REVISIT_OUT_META_KEY]["record"]["items"]) == 40
    huge = json.dumps({"url": "http://s/p/1", "meta": {"k": "v" * 9000}}).encode()
    assert revisit_entries(request, "s", huge, 1.0, max_bytes=8192) is None


def test_a_request_too_big_to_record_is_acked_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    middleware, crawler = _middleware()
    crawler.stats.open_spider()
    request = Request("http://user:secret@s/p/1")
    response = HtmlResponse(request.url, body=b"<p>x</p>", request=request)
    asyncio.run(middleware.process_response(request, response))
    settlements = SettlementQueue()
    lease = Lease(
        b"member", "s", json.dumps({"url": request.url, "cb_kwargs": {"k": "v" * 9000}}).encode()
    )
    with caplog.at_level(logging.WARNING):
        settle_request(request, lease, None, settlements, crawler, crawler.spider, "n", 1.0, 8192)
    batch = StepBatch()
    settlements.collect(batch, 0)
    assert batch.acks == [b"member"]  # the page is done all the same
    assert batch.revisits == []
    assert crawler.stats.get_value("revisit/too_big") == 1
    assert "over FRONTIER_REVISIT_MAX_RECORD_BYTES=8192" in caplog.text
    assert "secret" not in caplog.text
