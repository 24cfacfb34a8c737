"""Property-based fuzzing (hypothesis): seeds, payloads and the step's arguments.

Whatever a Redis writer pushes costs at most itself: a raw seed becomes a
:class:`Seed` or an :class:`InvalidSeed`, a payload a request or a ``ValueError``
(which the node turns into a dead letter), and no batch makes the step script
raise or leave the frontier inconsistent.

The default suite runs few examples (about 20 s); an on-demand run takes more and
shrinks what fails: ``FUZZ_EXAMPLES=2000 pytest -o timeout=0 tests/test_fuzz.py``.
Failing examples are kept in ``tests/artifacts/hypothesis`` and tried first next time;
the failures found so far are pinned as ``@example`` and as explicit tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, Phase, assume, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.provisional import urls
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from project.frontier.config import SiteLimits
from project.frontier.queue import Counts, LeasedQueue, StepBatch
from project.frontier.seeds import MAX_PRIORITY, InvalidSeed, Seed, parse_seed
from project.frontier.site_queues import queued_requests, sites_queued
from project.frontier.sites import MAX_URL_LENGTH, site_of
from project.frontier.wire import NODE_LOCAL_META, check_meta, decode_request, encode_request
from project.monitoring.status import PRIORITY_BAND
from spiders.products import ProductsSpider

#: Raises every test's max_examples (an on-demand run: FUZZ_EXAMPLES=2000).
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 0)
_DATABASE = DirectoryBasedExampleDatabase(
    Path(__file__).parent / "artifacts" / "hypothesis"  # git-ignored
)


def fuzz(examples: int, deadline_ms: int = 2000, **options: Any) -> settings:
    """Settings of one fuzz test: *examples* by default, more with FUZZ_EXAMPLES."""
    return settings(
        max_examples=max(examples, FUZZ_EXAMPLES),
        # generous: the suite shares two cores with crawls, and a slow example is not a bug
        deadline=timedelta(milliseconds=deadline_ms),
        database=_DATABASE,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **options,
    )


SPIDER = ProductsSpider()
#: What a request's callback or errback may be: the public methods the spider's own
#: code defines, and parse (Scrapy's Spider.log, close, start ... are machinery).
CALLBACKS = sorted(
    {"parse"}
    | {
        name
        for name, value in vars(ProductsSpider).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }
)
_UNSAFE_META = [
    "playwright_page_init_callback",
    "playwright_page_event_handlers",
    "playwright_page",
]
_META_KEYS = (
    sorted(NODE_LOCAL_META)
    + _UNSAFE_META
    + [
        "playwright",
        "playwright_context",
        "playwright_context_kwargs",
        "playwright_include_page",
        "playwright_page_methods",
        "_render_rule_keys",
        "redirect_urls",
        "retry_times",
        "dont_filter",
        "proxy",
        "__page_method__",
    ]
)
_CONTEXT_KWARGS = ["storage_state", "record_har_path", "user_data_dir", "downloads_path", "locale"]


# -- JSON-ish values ------------------------------------------------------------------------

_keys = st.one_of(st.sampled_from(_META_KEYS + _CONTEXT_KWARGS), st.text(max_size=12))
_huge_ints = st.integers(min_value=10**15, max_value=10**60) | st.integers(max_value=-(10**15))
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    _huge_ints,
    st.floats(),  # NaN and Infinity become the tokens Python's json reads back
    st.text(max_size=20),
)
#: Any JSON value, hostile keys included.
json_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_keys, kids, max_size=4),
    max_leaves=15,
)
#: JSON values that come back equal (no NaN): what meta and cb_kwargs may hold.
_safe_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
safe_values = st.recursive(
    _safe_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=12,
)


def _page_method(value: Any) -> dict[str, Any]:
    return {"__page_method__": value}


_page_methods = st.builds(
    _page_method,
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"method": st.sampled_from(["goto", "click", "evaluate", "screenshot", "nope"])},
            optional={
                "args": st.lists(st.one_of(urls(), json_values), max_size=2),
                "kwargs": st.dictionaries(st.sampled_from(["url", "path", "x"]), json_values),
            },
        ),
    ),
)
hostile_meta = st.dictionaries(
    _keys,
    st.one_of(
        json_values,
        st.dictionaries(st.sampled_from(_CONTEXT_KWARGS), json_values, max_size=3),
        st.lists(_page_methods, max_size=3),
        _page_methods,
    ),
    max_size=5,
)

_url_texts = st.one_of(
    urls(),
    st.builds(
        str.__add__,
        st.sampled_from(
            ["http://", "https://", "HTTP://", "ftp://", "file:///", "//", "http:", ""]
        ),
        st.text(max_size=40),
    ),
    st.sampled_from(
        [
            "http://[::1",
            "http://[::1/product/1",
            "http://a:99999/",
            "http://a:-1/",
            "http://:80/",
            "http://user@/",
            "http:///x",
            "https://\u2100/",
            "http://127.0.0.1:6379/",
            "http://" + "a" * MAX_URL_LENGTH,
            "data:text/html,hi",
            "javascript:alert(1)",
            " http://shop.test/ ",
        ]
    ),
)


# -- 1. parse_seed ---------------------------------------------------------------------------


def _check_seed(raw: bytes, max_bytes: int) -> Seed | None:
    """parse_seed's contract: a Seed that keeps every promise, or an InvalidSeed."""
    try:
        seed = parse_seed(raw, max_bytes)
    except InvalidSeed as exc:
        if not exc.code:
            raise AssertionError("an InvalidSeed names its reason") from exc
        return None
    assert isinstance(seed, Seed)
    assert len(raw) <= max_bytes
    parts = urlsplit(seed.url)
    assert parts.scheme in {"http", "https"}
    assert parts.hostname
    assert len(seed.url) <= MAX_URL_LENGTH
    assert isinstance(seed.priority, int)
    assert not isinstance(seed.priority, bool)
    assert abs(seed.priority) <= MAX_PRIORITY
    assert isinstance(seed.meta, dict)
    check_meta(seed.meta, seed.url)
    assert not NODE_LOCAL_META & set(seed.meta)
    assert seed.method == seed.method.upper()
    return seed


def _hostile_raw(kind: str, n: int) -> bytes:
    return {
        "deep_list": b"[" * n,
        "deep_object": b'{"url":"http://a/","meta":' + b'{"a":' * n + b"1" + b"}" * n + b"}",
        "deep_meta_list": b'{"url":"http://a/","meta":{"a":' + b"[" * n + b"]" * n + b"}}",
        "long_priority": b'{"url":"http://a/","priority":' + b"9" * n + b"}",
        "long_float": b'{"url":"http://a/","priority":1' + b"0" * n + b".5}",
        "long_exponent": b'{"url":"http://a/","priority":1e' + b"9" * min(n, 400) + b"}",
        "long_url": b"http://a/" + b"x" * n,
        "spaces": b" " * n + b"http://a/",
    }[kind]


hostile_raws = st.builds(
    _hostile_raw,
    st.sampled_from(
        [
            "deep_list",
            "deep_object",
            "deep_meta_list",
            "long_priority",
            "long_float",
            "long_exponent",
            "long_url",
            "spaces",
        ]
    ),
    st.sampled_from([1, 2, 10, 1000, 4300, 4301, 5000, 30_000, 100_000]),
)

_seed_headers = st.dictionaries(
    st.text(max_size=10),
    st.one_of(st.text(max_size=20), st.lists(st.text(max_size=10), max_size=3)),
    max_size=4,
)
#: Seeds as a user would write them, each field plausible (most are accepted).
plausible_seed_docs = st.fixed_dictionaries(
    {"url": st.one_of(urls(), urls(), urls(), _url_texts)},
    optional={
        "priority": st.integers(-2 * MAX_PRIORITY, 2 * MAX_PRIORITY),
        "meta": hostile_meta,
        "method": st.sampled_from(["GET", "post", "Put", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
        "headers": _seed_headers,
        "body": st.text(max_size=40),
    },
)
#: Seeds as a stranger would write them: any value in any field, unknown fields.
hostile_seed_docs = st.fixed_dictionaries(
    {},
    optional={
        "url": st.one_of(_url_texts, json_values),
        "priority": st.one_of(_huge_ints, json_values),
        "meta": json_values,
        "method": st.one_of(st.sampled_from(["CONNECT", "TRACE", ""]), st.text(max_size=8)),
        "headers": st.one_of(
            st.dictionaries(st.text(max_size=10), json_values, max_size=4), json_values
        ),
        "body": json_values,
        "extra": json_values,
        "callback": st.sampled_from(["parse", "__init__"]),
    },
)
seed_docs = st.one_of(plausible_seed_docs, hostile_seed_docs)


def _serialize(doc: Any, ascii_only: bool, cut: int | None) -> bytes:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8")
    return raw if cut is None else raw[:cut]


#: Where a JSON text is cut short (mostly it is not).
_cuts = st.one_of(st.none(), st.none(), st.none(), st.integers(0, 300))
seed_jsons = st.builds(
    _serialize, st.one_of(plausible_seed_docs, hostile_seed_docs, json_values), st.booleans(), _cuts
)
_max_bytes = st.one_of(st.just(65536), st.sampled_from([0, 1, 64]), st.integers(0, 1 << 20))
#: Raw seeds as `redis-cli lpush` may push them.
raw_seeds = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    _url_texts.map(str.encode),
    hostile_raws,
    seed_jsons,
)


@fuzz(600)
@given(raw_seeds, _max_bytes)
# seeds that once escaped validation and wedged the fleet
@example(b"http://[::1", 65536)
@example(b'{"url":"http://a/","priority":' + b"9" * 5000 + b"}", 65536)
@example(_hostile_raw("deep_object", 30_000), 1 << 20)
@example(b'{"url":"http://a/","meta":{"playwright_page_init_callback":"os.system"}}', 65536)
def test_any_seed_is_a_seed_or_an_invalid_seed(raw: bytes, max_bytes: int) -> None:
    _check_seed(raw, max_bytes)


@fuzz(300)
@given(
    st.one_of(
        st.builds(_serialize, plausible_seed_docs, st.booleans(), st.none()),
        _url_texts.map(str.encode),
    )
)
# found: a page-method tag anywhere in meta passes parse_seed, then decode_request raises
@example(b'{"url": "http://a.cn/", "meta": {"": {"__page_method__": null}}}')
def test_an_accepted_seed_becomes_a_request_that_travels(raw: bytes) -> None:
    """parse_seed's verdict is final: a seed it accepts is requested and enqueued."""
    seed = _check_seed(raw, 65536)
    assume(seed is not None)
    assert seed is not None
    request = SPIDER.make_request_from_seed(seed)
    copy, _ = decode_request(encode_request(request, SPIDER, id="x"), SPIDER)
    assert copy.url == request.url


# -- 2. decode_request -----------------------------------------------------------------------

_WIRE_FIELDS = {
    "url": st.one_of(_url_texts, json_values),
    "callback": st.one_of(
        st.sampled_from(
            [*CALLBACKS, "_follow", "_set_crawler", "close", "__init__", "crawler", "parse "]
        ),
        json_values,
    ),
    "errback": st.one_of(st.sampled_from(CALLBACKS), json_values),
    "method": st.one_of(st.sampled_from(["GET", "POST", "", "G ET"]), json_values),
    "headers": st.one_of(
        st.dictionaries(
            st.text(max_size=8),
            st.one_of(st.text(max_size=8), st.lists(json_values, max_size=3), json_values),
            max_size=3,
        ),
        json_values,
    ),
    "body": st.one_of(st.text(max_size=30), json_values),
    "body_b64": st.one_of(st.sampled_from(["AAAA", "!!", "QQ=", "", "===="]), json_values),
    "cookies": st.one_of(
        st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        st.lists(st.one_of(st.dictionaries(_keys, json_values, max_size=3), json_values)),
        json_values,
    ),
    "meta": st.one_of(hostile_meta, json_values),
    "encoding": st.one_of(
        st.sampled_from(["utf-8", "latin-1", "utf-16", "ascii", "idna", "rot13", "base64", "nope"]),
        json_values,
    ),
    "priority": st.one_of(st.integers(), _huge_ints, json_values),
    "dont_filter": st.one_of(st.booleans(), json_values),
    "flags": st.one_of(st.lists(json_values, max_size=3), json_values),
    "cb_kwargs": st.one_of(st.dictionaries(_keys, json_values, max_size=3), json_values),
    "class": st.one_of(
        st.sampled_from(
            [
                "scrapy.http.request.Request",
                "scrapy.http.request.form.FormRequest",
                "scrapy.http.request.json_request.JsonRequest",
                "os.system",
            ]
        ),
        json_values,
    ),
    "id": json_values,
    "attempts": json_values,
    "formdata": json_values,
}
payload_docs = st.fixed_dictionaries(
    {"url": _WIRE_FIELDS["url"]}, optional={k: v for k, v in _WIRE_FIELDS.items() if k != "url"}
)
payloads = st.one_of(
    st.binary(max_size=300),
    hostile_raws,
    st.builds(
        _serialize,
        st.one_of(payload_docs, json_values),
        st.booleans(),
        _cuts,
    ),
)


def _check_payload(payload: bytes) -> Request | None:
    """decode_request's contract: a request whose callbacks are the spider's, or a ValueError."""
    try:
        request, doc = decode_request(payload, SPIDER)
    except ValueError:
        return None
    assert isinstance(request, Request)
    assert isinstance(doc, dict)
    assert not NODE_LOCAL_META & set(request.meta)
    for func in (request.callback, request.errback):
        if func is not None:
            # a payload may only name the spider's own methods, not Scrapy's machinery
            assert getattr(func, "__self__", None) is SPIDER, func
            assert not func.__name__.startswith("_"), func
    return request


@pytest.mark.slow("600 hypothesis payloads, each decoded into a request against a real spider")
@fuzz(600)
@given(payloads)
# found by this test (each raised something other than a ValueError, or named a non-callback)
@example(b'{"url":"http://a/","class":[]}')  # TypeError: unhashable type: 'list'
@example(b'{"url":"http://a/","x":{"__page_method__":1}}')  # TypeError from the codec hook
@example(b"[" * 1000)  # RecursionError
@example(b'{"url":"http://a/","encoding":"nope"}')  # LookupError
@example(b'{"url":"http://a/","callback":"_set_crawler"}')  # a private method of Spider
@example(b'{"url":"http://a/","callback":"close"}')  # a staticmethod, not bound to the spider
def test_any_payload_is_a_request_or_a_value_error(payload: bytes) -> None:
    _check_payload(payload)


# -- the round trip

_hosts = st.one_of(
    st.sampled_from(["shop.test", "www.shop.test", "10.0.0.7", "[::1]", "xn--bcher-kva.example"]),
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z]{2,6}){0,2}", fullmatch=True),
    st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=1, max_size=10),
)
request_urls = st.builds(
    "{}://{}{}/{}{}".format,
    st.sampled_from(["http", "https"]),
    _hosts,
    st.sampled_from(["", ":8080", ":443"]),
    st.text(max_size=20),
    st.sampled_from(["", "?", "?page=2&a=b"]) | st.text(max_size=10).map("?{}".format),
)
_header_values = st.one_of(st.text(max_size=20), st.binary(max_size=20))


def _make_request(
    cls: type[Request],
    url: str,
    method: str,
    headers: dict[str, list[Any]],
    body: bytes | str,
    cookies: dict[str, str],
    meta: dict[str, Any],
    cb_kwargs: dict[str, Any],
    priority: int,
    dont_filter: bool,
    flags: list[str],
    callback: str | None,
    errback: str | None,
) -> Request:
    return cls(
        url,
        method=method,
        headers=headers,
        body=body,
        cookies=cookies,
        meta=meta,
        cb_kwargs=cb_kwargs,
        priority=priority,
        dont_filter=dont_filter,
        flags=flags,
        callback=getattr(SPIDER, callback) if callback else None,
        errback=getattr(SPIDER, errback) if errback else None,
    )


_callback_names = st.none() | st.sampled_from(CALLBACKS)
requests = st.builds(
    _make_request,
    cls=st.sampled_from([Request, FormRequest, JsonRequest]),
    url=request_urls,
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"])
    | st.from_regex(r"[A-Z]{1,10}", fullmatch=True),
    headers=st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True),
        st.lists(_header_values, min_size=1, max_size=3),
        max_size=4,
    ),
    body=st.binary(max_size=60) | st.text(max_size=30),
    cookies=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    meta=st.dictionaries(
        st.one_of(st.sampled_from(sorted(NODE_LOCAL_META)), st.text(max_size=10)),
        safe_values,
        max_size=4,
    ),
    cb_kwargs=st.dictionaries(st.text(max_size=10), safe_values, max_size=3),
    priority=st.integers(-(10**6), 10**6) | st.integers(),
    dont_filter=st.booleans(),
    flags=st.lists(st.text(max_size=8), max_size=3),
    callback=_callback_names,
    errback=_callback_names,
)


def _headers(request: Request) -> dict[bytes, list[bytes]]:
    return {key: request.headers.getlist(key) for key in request.headers}


@fuzz(400)
@given(requests)
# found: header bytes go out as latin-1 text and come back encoded as UTF-8
@example(Request("http://shop.test/", headers={"A": ["\x80"]}))
@example(Request("http://\u1d2c/"))  # Scrapy normalises this host twice (see below)
def test_a_request_comes_back_from_the_wire_as_it_went(request: Request) -> None:
    payload = encode_request(request, SPIDER, id="abc")
    copy, doc = decode_request(payload, SPIDER)
    assert doc["id"] == "abc"
    assert type(copy) is type(request)
    # Scrapy's URL normalisation is not idempotent for some hosts (http://\u1d2c/ becomes
    # http://A/, then http://a/): the wire keeps the URL, Scrapy normalises it once more
    assert copy.url == Request(request.url).url
    assert copy.method == request.method
    assert _headers(copy) == _headers(request)
    assert copy.body == request.body
    assert copy.cookies == request.cookies
    assert copy.meta == {k: v for k, v in request.meta.items() if k not in NODE_LOCAL_META}
    assert copy.cb_kwargs == request.cb_kwargs
    assert copy.priority == request.priority
    assert copy.dont_filter == request.dont_filter
    assert copy.flags == request.flags
    # no callback means parse, so parse is left out of the payload
    assert (copy.callback or SPIDER.parse) == (request.callback or SPIDER.parse)
    assert copy.errback == request.errback
    assert copy.encoding == request.encoding


# -- 3. the step's arguments, against a real Redis -------------------------------------------


@fuzz(300)
@given(st.text(max_size=60))
def test_a_site_never_holds_a_newline(url: str) -> None:
    """The scheduler's sites come from site_of(): the members' "\\n" separators stay unambiguous."""
    assert "\n" not in site_of(url)
    assert "\n" not in site_of("http://" + url)


NODES = ("node-a", "node-b")
_PRIORITY_LIMIT = 100_000  # lib/site_queues.lua's PRIORITY_LIMIT

#: Sites as site_of() makes them, and hostile ones (anything but "\n": see above).
sites = st.one_of(
    st.sampled_from(
        ["shop.test", "www.shop.test", "10.0.0.7:8080", "[::1]:6379", "_", "xn--bcher-kva.example"]
    ),
    st.sampled_from(["", " ", "*", "[", "?*]", "a:b:c", "s\r", "\t", "\x00", "é", "x" * 300]),
    st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=20),
)
#: What a payload's "priority" may be, as Lua's cjson reads it back when a lease is reaped.
_priority_tokens = st.one_of(
    st.integers(-2 * _PRIORITY_LIMIT, 2 * _PRIORITY_LIMIT).map(str),
    st.sampled_from(["1e400", "-1e400", "2.5", '"7"', "null", "[]", "99999999999999999999999"]),
    # not JSON, yet what Lua's cjson reads (so a payload in Redis may hold it)
    st.sampled_from(["NaN", "Infinity", "-Infinity", "0x10"]),
)
#: A payload without its unique id: JSON as the wire writes it, or any bytes.
payload_bodies = st.one_of(
    _priority_tokens.map(lambda p: b'{"url":"http://s/","priority":%s' % p.encode()),
    st.binary(max_size=30),
)
fingerprints = st.builds(bytes.__add__, st.sampled_from([b"f", b"m"]), st.binary(max_size=3))
_ms = st.one_of(st.integers(-1000, 30), st.integers(-(10**6), 10**9))
#: A site of the example's pool, by index.
_site_refs = st.integers(0, 4)
#: A member the node was handed (by index, newest first; mostly), or garbage bytes.
_member_refs = st.one_of(
    st.integers(0, 63),
    st.integers(0, 63),
    st.integers(0, 63),
    st.sampled_from([b"", b"\n", b"node-a\nR", b"node-a\nRs\n", b"node-b\nS"]),
    st.binary(max_size=12),
)


def _split(member: bytes) -> tuple[str, str, bytes, bytes]:
    """node, kind, site, payload of an in-flight member (site is b"" for a seed)."""
    node, _, rest = member.partition(b"\n")
    kind, body = rest[:1].decode("latin-1"), rest[1:]
    if kind == "S":
        return node.decode("latin-1"), kind, b"", body
    site, _, payload = body.partition(b"\n")
    return node.decode("latin-1"), kind, site, payload


@dataclass
class Snapshot:
    """Everything the step script keeps, read back after a round trip."""

    queues: dict[bytes, list[tuple[bytes, float]]]
    index: dict[bytes, float]
    throttled: dict[bytes, float]
    inflight: dict[bytes, float]
    delayed: dict[bytes, float]
    start_urls: list[bytes]
    active: dict[bytes, int]
    #: node -> site -> download permits it holds (lua/lib/permits.lua)
    permits: dict[str, dict[bytes, int]]
    capped: set[bytes]
    deliveries: dict[bytes, int]
    queued: int
    dead: int
    dupefilter: set[bytes]
    allowed: set[bytes]

    @classmethod
    def read(cls, client: redis.Redis, keys: Any) -> Snapshot:
        queues = {site: queued_requests(client, keys, site) for site in sites_queued(client, keys)}
        with client.pipeline(transaction=False) as pipe:
            for key in (keys.queue, keys.throttled, keys.inflight, keys.delayed):
                pipe.zrange(key, 0, -1, withscores=True)
            pipe.lrange(keys.start_urls, 0, -1)
            pipe.hgetall(keys.active)
            pipe.hgetall(keys.deliveries)
            pipe.get(keys.queued)
            pipe.llen(keys.dead)
            pipe.smembers(keys.dupefilter)
            pipe.smembers(keys.allowed)
            pipe.smembers(keys.capped)
            for node in NODES:
                pipe.hgetall(keys.permits_of(node))
            replies = pipe.execute()
        index, throttled, inflight, delayed, start_urls, active, deliveries, *rest = replies
        queued, dead, dupefilter, allowed, capped, *held = rest
        return cls(
            queues=queues,
            index=dict(index),
            throttled=dict(throttled),
            inflight=dict(inflight),
            delayed=dict(delayed),
            start_urls=start_urls,
            active={k: int(v) for k, v in active.items()},
            permits={
                n: {k: int(v) for k, v in h.items()} for n, h in zip(NODES, held, strict=True)
            },
            capped=capped,
            deliveries={k: int(v) for k, v in deliveries.items()},
            queued=int(queued or 0),
            dead=dead,
            dupefilter=dupefilter,
            allowed=allowed,
        )

    def requests(self) -> Counter[bytes]:
        """Where each payload is: queued, in flight or waiting to be retried (once, at most)."""
        found: Counter[bytes] = Counter()
        for entries in self.queues.values():
            found.update(payload for payload, _ in entries)
        found.update(_split(m)[3] for m in self.inflight if _split(m)[1] == "R")
        found.update(member.partition(b"\n")[2] for member in self.delayed)
        return found

    def seeds(self) -> Counter[bytes]:
        found = Counter(self.start_urls)
        found.update(_split(m)[3] for m in self.inflight if _split(m)[1] == "S")
        return found


class FrontierMachine(RuleBasedStateMachine):
    """Two nodes drive one frontier with random batches; the frontier stays consistent."""

    def __init__(self, redis_url: str, keys: Any, space: Any) -> None:
        super().__init__()
        self.keys, self.space = keys, space
        self.sync = redis.Redis.from_url(redis_url)
        self.loop = asyncio.new_event_loop()
        self.client = redis.asyncio.from_url(redis_url)
        self.nodes: dict[str, LeasedQueue] = {}
        self.sites: list[str] = []
        self.serial = 0
        #: payload -> site it was sent under (enqueue or retry); raw seeds pushed
        self.sent: dict[bytes, bytes] = {}
        self.pushed: set[bytes] = set()
        #: in-flight members each node was handed (kept after they settle: late acks)
        self.handed: dict[str, list[bytes]] = {node: [] for node in NODES}

    def teardown(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()
        self.space.delete(self.sync)
        self.sync.close()

    def _unique(self, body: bytes) -> bytes:
        self.serial += 1
        if body.startswith(b'{"url"'):
            return body + b',"id":%d}' % self.serial
        return body + b"#%d" % self.serial

    @initialize(
        leases=st.tuples(*[st.sampled_from([0, 0, 1, 5, 60_000])] * 2),
        limits=st.builds(
            SiteLimits,
            rate=st.sampled_from([0.0, 0.0, 0.5, 20.0, 1e6]),
            concurrency=st.sampled_from([0, 0, 1, 3]),
            burst_seconds=st.sampled_from([0.0, 0.1, 10.0]),
            adaptive=st.booleans(),
        ),
        max_deliveries=st.integers(1, 3),
        pool=st.lists(sites, min_size=1, max_size=5, unique=True),
    )
    def start(self, leases, limits, max_deliveries, pool) -> None:
        self.sites = pool
        for node, lease_ms in zip(NODES, leases, strict=True):
            self.nodes[node] = LeasedQueue(
                self.client, None, self.keys, node, lease_ms, limits, max_deliveries
            )

    # -- rules

    def _push_seeds(self, raws: list[bytes]) -> None:
        """Seeds pushed with redis-cli lpush, as anyone may."""
        unique = [self._unique(raw) for raw in raws]
        self.pushed.update(unique)
        self.sync.lpush(self.keys.start_urls, *unique)

    @rule(site=_site_refs, delay=st.floats(1e-320, 1e6), concurrency=st.integers(0, 4))
    def crawl_delay(self, site, delay, concurrency) -> None:
        """A robots.txt Crawl-delay caps a site (project/frontier/robots.py writes it so)."""
        self.sync.hset(self.keys.limits, self._site(site), f"{1.0 / delay} {concurrency}")

    @rule(node=st.sampled_from(NODES), members=st.lists(_member_refs, max_size=4))
    def release(self, node, members) -> None:
        members = [self._member(node, ref) for ref in members]
        before = Snapshot.read(self.sync, self.keys)
        back = self.loop.run_until_complete(self.nodes[node].release(members))
        assert back == len(set(members) & set(before.inflight))
        after = Snapshot.read(self.sync, self.keys)
        assert after.requests() == before.requests(), "released requests go back, all of them"
        assert after.seeds() == before.seeds()
        self._consistent(after)

    @rule(
        node=st.sampled_from(NODES),
        seeds=st.lists(st.binary(max_size=20), max_size=2),
        sleep_ms=st.sampled_from([0, 0, 0, 1, 6]),
        enqueue=st.lists(
            st.tuples(
                fingerprints,
                _site_refs,
                st.integers(-2 * _PRIORITY_LIMIT, 2 * _PRIORITY_LIMIT) | st.integers(),
                payload_bodies,
                st.sampled_from(["", "+", "="]) | _site_refs,  # a site: "~" + that site
            ),
            max_size=6,
        ),
        acks=st.lists(_member_refs, max_size=4),
        retries=st.lists(
            st.tuples(_member_refs, _ms, st.none() | _site_refs, payload_bodies), max_size=3
        ),
        dead=st.lists(_member_refs, max_size=3),
        heartbeat=st.lists(_member_refs, max_size=4),
        pauses=st.lists(st.tuples(_site_refs, _ms), max_size=2),
        latency=st.lists(st.tuples(_site_refs, st.floats(0, 1e4), st.integers(1, 50)), max_size=2),
        want=st.integers(0, 8),
        seed_want=st.integers(0, 3),
        maintain=st.booleans(),
        count=st.booleans(),
    )
    def step(
        self,
        node,
        seeds,
        sleep_ms,
        enqueue,
        acks,
        retries,
        dead,
        heartbeat,
        pauses,
        latency,
        **asked,
    ) -> None:
        """One round trip; before it, maybe some seeds are pushed and some time passes."""
        queue = self.nodes[node]
        if seeds:
            self._push_seeds(seeds)
        time.sleep(sleep_ms / 1000)  # short leases expire, retries and pauses come due
        member = self._member
        batch = StepBatch(
            enqueue=[
                (fp, self._site(s), priority, self._unique(body), self._scope(scope))
                for fp, s, priority, body, scope in enqueue
            ],
            acks=[member(node, m) for m in acks],
            # a retry goes back to its lease's site, as the loop sends it (or to another)
            retries=[
                (member(node, m), delay, self._site_of(member(node, m), s), self._unique(body))
                for m, delay, s, body in retries
            ],
            dead=[(member(node, m), b'{"url":"x","kind":"request"}') for m in dead],
            heartbeat=[member(node, m) for m in heartbeat],
            pauses=[(self._site(s), ms) for s, ms in pauses],
            latency=[(self._site(s), seconds, n) for s, seconds, n in latency],
            **asked,  # want, seed_want, maintain, count
        )
        self.sent.update({payload: s.encode() for _, s, _, payload, _ in batch.enqueue})
        self.sent.update({payload: s.encode() for _, _, s, payload in batch.retries})

        before = Snapshot.read(self.sync, self.keys)
        result = self.loop.run_until_complete(queue.step(batch))
        after = Snapshot.read(self.sync, self.keys)
        self._check_step(node, batch, result, before, after)
        self._consistent(after)
        if currently_in_test_context():  # what the examples reached, for hypothesis statistics
            reached = ["added", "duplicates", "offsite", "reaped", "promoted", "stale", "leased"]
            for name in [*reached, "seeds", "poisoned"]:
                if getattr(result, name):
                    event(name)
        self.handed[node] += [queue.request_member(x.site, x.payload) for x in result.leased]
        self.handed[node] += [queue.seed_member(raw) for raw in result.seeds]

    # Rules draw sites and members as indexes, resolved here: what hypothesis draws must not
    # depend on what Redis answered (timing decides which leases expire).

    def _site(self, ref: int) -> str:
        return self.sites[ref % len(self.sites)]

    def _scope(self, ref: str | int) -> str:
        return ref if isinstance(ref, str) else "~" + self._site(ref)

    def _member(self, node: str, ref: int | bytes) -> bytes:
        """A member this node was handed (a node settles only its own), or garbage."""
        if isinstance(ref, bytes):
            return ref
        handed = self.handed[node]
        return handed[-1 - ref % len(handed)] if handed else node.encode() + b"\nR"

    def _site_of(self, member: bytes, ref: int | None) -> str:
        _, kind, site, _ = _split(member)
        if ref is None and kind == "R" and site.decode("utf-8", "replace") in self.sites:
            return site.decode()
        return self._site(ref or 0)

    # -- what one round trip may change

    def _check_step(self, node, batch, result, before: Snapshot, after: Snapshot) -> None:
        # phase 1: scope, then the seen-set, exactly as lua/step/enqueue.lua documents them
        allowed = set(before.allowed) | {
            s.encode() for _, s, _, _, sc in batch.enqueue if sc == "+"
        }
        kept, seen, added = [], set(before.dupefilter), set()
        for fp, s, priority, payload, scope in batch.enqueue:
            origin = s if scope == "=" else scope[1:] if scope.startswith("~") else None
            if origin is not None and origin.encode() not in allowed:
                continue
            kept.append(payload)
            duplicate = fp[1:] in seen
            if not duplicate:
                seen.add(fp[1:])
            if fp[:1] == b"m" or not duplicate:
                added.add(
                    (payload, s.encode(), max(-_PRIORITY_LIMIT, min(_PRIORITY_LIMIT, priority)))
                )
        assert result.offsite == len(batch.enqueue) - len(kept)
        assert result.added == len(added)
        assert result.duplicates == len(kept) - len(added)
        now_requests, was_requests = after.requests(), before.requests()
        for payload, s, priority in added:
            assert now_requests[payload] == 1, "an added request is queued (or leased already)"
            for score in [sc for p, sc in after.queues.get(s, []) if p == payload]:
                assert -math.floor(score / PRIORITY_BAND) == priority
        # phase 2: only held leases settle, each once; the rest of the retries and dead are stale
        held, settled, stale = set(before.inflight), [], 0
        for e, member in enumerate(
            batch.acks + [r[0] for r in batch.retries] + [d[0] for d in batch.dead]
        ):
            if member in held:
                held.discard(member)
                settled.append((e, member))
            elif e >= len(batch.acks):
                stale += 1
        assert result.stale == stale
        retried = {
            batch.retries[e - len(batch.acks)][3]
            for e, _ in settled
            if len(batch.acks) <= e < len(batch.acks) + len(batch.retries)
        }
        for _, _, _, payload in batch.retries:
            assert now_requests[payload] == (payload in retried), "a stale retry forks nothing"
        dead_letters = sum(1 for e, _ in settled if e >= len(batch.acks) + len(batch.retries))
        assert after.dead == before.dead + dead_letters + len(result.poisoned)
        # nothing is lost: what left was settled or poisoned, what came was sent now
        ended = {_split(m)[3] for _, m in settled}
        poisoned = [self._poisoned(record) for record in result.poisoned]
        for payload in was_requests - now_requests:
            assert payload in ended or payload in poisoned, f"lost {payload!r}"
        gone = [raw for raw in before.seeds() - after.seeds() if raw not in ended]
        assert len(gone) <= poisoned.count(None), f"lost seeds {gone!r}"
        fresh = {p for p, _, _ in added} | retried
        for payload in now_requests - was_requests:
            assert payload in fresh, f"{payload!r} came from nowhere"
        assert not after.seeds() - before.seeds()
        # phases 8 and 9: what was leased is held by this node, within what it asked for
        assert len(result.leased) <= batch.want
        assert len(result.seeds) <= batch.seed_want
        for leased in result.leased:
            assert self.nodes[node].request_member(leased.site, leased.payload) in after.inflight
        for raw in result.seeds:
            assert self.nodes[node].seed_member(raw) in after.inflight
        whole = Counts(
            queued=after.queued,
            delayed=len(after.delayed),
            inflight=len(after.inflight),
            seeds=len(after.start_urls),
            starting=0,  # no node runs start() here
        )
        if batch.maintain:
            assert result.counts == whole
        elif batch.count:
            # a count stops at the first above zero, in this order; the rest read 0
            order = ["queued", "inflight", "delayed", "seeds", "starting"]
            first = next((name for name in order if getattr(whole, name)), None)
            expected = Counts(**({first: getattr(whole, first)} if first else {}))
            assert result.counts == expected
        assert result.next_wake_ms is None or result.next_wake_ms >= 0

    @staticmethod
    def _poisoned(record: bytes) -> bytes | None:
        """The payload a poison dead letter is about (None: a seed's, which it only previews)."""
        doc = json.loads(record.decode("utf-8", "surrogateescape"))
        assert doc["kind"] == "poison"
        request = doc.get("request")
        return None if request is None else request.encode("utf-8", "surrogateescape")

    # -- what holds after every round trip

    def _consistent(self, now: Snapshot) -> None:
        assert now.queued == sum(len(entries) for entries in now.queues.values())
        for site, score in now.index.items():
            assert now.queues.get(site), f"empty site {site!r} is indexed"
            assert score == now.queues[site][0][1], "a ready site is scored by its best request"
            assert site not in now.throttled
        for site, entries in now.queues.items():
            stranded = site not in now.index and site not in now.throttled
            assert not entries or not stranded or site in now.capped, f"{site!r} stranded"
        for member in now.inflight:
            node, kind, site, payload = _split(member)
            assert node in NODES
            assert kind in "RS"
            if kind == "R":
                assert self.sent.get(payload) == site, "a lease names the site it was sent under"
            else:
                assert payload in self.pushed
        for member in now.delayed:
            site, _, payload = member.partition(b"\n")
            assert self.sent.get(payload) == site
        held: Counter[bytes] = Counter()
        for permits in now.permits.values():
            assert all(n > 0 for n in permits.values()), "a node holds no permit of 0 or fewer"
            held.update(permits)
        assert {s: n for s, n in now.active.items() if n} == dict(held), "active == permits held"
        assert max(now.requests().values(), default=1) == 1, "a request is in one place"
        assert max(now.seeds().values(), default=1) == 1, "a seed is in one place"
        # lua/step/maintain.lua counts deliveries by sha1 of a member without its node
        bodies = [b"R" + s + b"\n" + p for s, entries in now.queues.items() for p, _ in entries]
        bodies += [m.partition(b"\n")[2] for m in now.inflight]
        bodies += [b"S" + raw for raw in now.start_urls]
        live = {hashlib.sha1(body).hexdigest().encode() for body in bodies}
        assert set(now.deliveries) <= live, "the delivery count of an entry that ended is deleted"


def test_random_batches_keep_the_frontier_consistent(redis_url: str, keys, keyspace) -> None:
    # Shrinking a failing run of the machine takes minutes of Redis round trips: on demand
    # only (FUZZ_EXAMPLES=...); the default suite reports the failing run as found.
    phases = list(Phase) if FUZZ_EXAMPLES else [p for p in Phase if p is not Phase.shrink]
    run_state_machine_as_test(
        lambda: FrontierMachine(redis_url, keys, keyspace),
        settings=fuzz(50, deadline_ms=5000, stateful_step_count=15, phases=phases),
    )


def _step(**batch: Any) -> dict[str, Any]:
    """Arguments of FrontierMachine.step: an empty round trip of node-a, but for *batch*."""
    empty = {"seeds": [], "sleep_ms": 0, "enqueue": [], "acks": [], "retries": [], "dead": []}
    empty |= {"heartbeat": [], "pauses": [], "latency": [], "want": 0, "seed_want": 0}
    return {"node": "node-a", "maintain": False, **empty, **batch}


def test_a_payload_whose_priority_lua_reads_as_nan_costs_only_itself(
    redis_url: str, keys, keyspace
) -> None:
    """Found by the machine: cjson reads NaN, and a NaN score fails the step that reaps it."""
    machine = FrontierMachine(redis_url, keys, keyspace)
    try:
        machine.start(
            leases=(0, 0), limits=SiteLimits(concurrency=0), max_deliveries=2, pool=["shop.test"]
        )
        enqueue = [(b"f", 0, 0, b'{"url":"http://s/","priority":NaN', "")]
        machine.step(**_step(enqueue=enqueue, want=1))
        machine.step(**_step(maintain=True))  # the lease expired: reap it
    finally:
        machine.teardown()


def test_a_site_woken_while_at_its_cap_stays_out_of_the_ready_index(
    redis_url: str, keys, keyspace
) -> None:
    """Found by the machine: a capped site that was also paused came back to the ready index
    when its pause ended, so a better request pushed later left its score stale."""
    machine = FrontierMachine(redis_url, keys, keyspace)
    try:
        machine.start(
            pool=["", "s\r"],
            leases=(0, 1),
            max_deliveries=2,
            limits=SiteLimits(rate=0.0, concurrency=3, burst_seconds=10.0, adaptive=False),
        )
        machine.crawl_delay(concurrency=0, delay=735754.7229040647, site=3)
        machine.crawl_delay(concurrency=1, delay=842134.3980787614, site=3)
        machine.step(
            acks=[],
            dead=[b"", 61, b"\xe8C-\xbb\x13"],
            enqueue=[
                (b"m", 0, -4393, b'{"url":"http://s/","priority":0x10', ""),
                (b"f", 0, -196645, b"VmRSS:", 2),
                (b"f", 1, 532, b'{"url":"http://s/","priority":Infinity', "+"),
                (b"m", 3, 393, b'{"url":"http://s/","priority":8240', "="),
                (b"m\xd4\xbf", 0, -71374334, b"\x1c", 2),
                (b"m\x85\xb4", 0, -523, b'{"url":"http://s/","priority":-1724', ""),
            ],
            heartbeat=[b"node-a\nR", b"\n"],
            latency=[],
            maintain=True,
            node="node-b",
            pauses=[(2, -56)],
            retries=[],
            seed_want=0,
            seeds=[b"\t\x88\xf50\xd9U", b"\xe0]0\x99\xabD8"],
            sleep_ms=1,
            want=2,
        )
        machine.step(
            acks=[],
            dead=[b"\xc6\xcd\xc0l\n\x85"],
            enqueue=[
                (b"f+4\xad", 1, -16585, b'{"url":"http://s/","priority":[]', 2),
                (b"f", 4, -229059, b'{"url":"http://s/","priority":1285', "+"),
                (b"f%", 3, -210678431, b'{"url":"http://s/","priority":NaN', ""),
            ],
            heartbeat=[b"\xe8\xc8\xed\xc3\xefETv\xe5O[\xd1", 40, b"\r\x01\xb3G"],
            latency=[(4, 1e-06, 43), (2, 2.00001, 36)],
            maintain=False,
            node="node-a",
            pauses=[(3, -521), (0, -2190)],
            retries=[],
            seed_want=2,
            seeds=[b"", b"v"],
            sleep_ms=1,
            want=0,
        )
        machine.crawl_delay(concurrency=4, delay=875110.0358154156, site=3)
        machine.crawl_delay(concurrency=0, delay=706018.0094041704, site=1)
        machine.step(
            acks=[b",\xe4:iK\x8e\x0c\xc8", 61, 17, 32],
            dead=[b"", b"\n", b"@\x00\xdbli+\xbd\x94\x01r\r\xde"],
            enqueue=[
                (b"m\xed\xab&", 0, -48888, b'{"url":"http://s/","priority":-538', ""),
                (b"m", 0, 329, b'{"url":"http://s/","priority":-1e400', ""),
                (b"f", 2, -2234, b'{"url":"http://s/","priority":-543', 0),
                (b"m", 3, -2389, b'{"url":"http://s/","priority":-Infinity', "+"),
                (b"f\xd8\x17", 3, -75539, b'{"url":"http://s/","priority":1e400', "+"),
                (b"f\r\n", 0, 230, b"\x17\x1am\x98", "="),
            ],
            heartbeat=[b"", 32, b"node-b\nS"],
            latency=[(0, 4208.9547349851855, 46), (1, 3.340865166361885e-135, 39)],
            maintain=False,
            node="node-b",
            pauses=[],
            retries=[
                (b"\x9f\xf2\xbcZpt\x07", -486, None, b'{"url":"http://s/","priority":"7"'),
                (b"final", -145, None, b'{"url":"http://s/","priority":256'),
            ],
            seed_want=3,
            seeds=[b"", b"\xec\xc8\xc5r"],
            sleep_ms=0,
            want=8,
        )
    finally:
        machine.teardown()
