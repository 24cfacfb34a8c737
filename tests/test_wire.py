"""JSON wire format of frontier requests."""

from __future__ import annotations

import json

import pytest
from scrapy import Request
from scrapy.http import FormRequest

from project.frontier.wire import UnserializableRequestError, decode_request, encode_request
from spiders.products import ProductsSpider


@pytest.fixture
def spider() -> ProductsSpider:
    return ProductsSpider()


def test_round_trip_keeps_every_field(spider: ProductsSpider) -> None:
    request = Request(
        "http://shop.test/category/a?page=2",
        callback=spider.parse_listing,
        errback=spider.parse,
        method="POST",
        headers={"X-Token": "t"},
        body=b"\xff\x00binary",
        cookies={"c": "1"},
        meta={"depth": 3, "nested": {"a": [1, 2.5, None, True]}},
        priority=10,
        dont_filter=True,
        cb_kwargs={"page": 2},
        flags=["f"],
    )
    payload = encode_request(request, spider, id="abc")
    json.loads(payload)  # plain JSON, no pickle
    copy, doc = decode_request(payload, spider)
    assert doc["id"] == "abc"
    assert copy.url == request.url
    assert copy.callback == spider.parse_listing
    assert copy.errback == spider.parse
    assert (copy.method, copy.body, copy.priority, copy.dont_filter) == (
        "POST",
        b"\xff\x00binary",
        10,
        True,
    )
    assert copy.headers.getlist("X-Token") == [b"t"]
    assert copy.meta == request.meta
    assert copy.cb_kwargs == {"page": 2}
    assert copy.cookies == {"c": "1"}
    assert copy.flags == ["f"]


def test_defaults_are_left_out(spider: ProductsSpider) -> None:
    assert json.loads(encode_request(Request("http://shop.test/"), spider)) == {
        "url": "http://shop.test/"
    }


@pytest.mark.parametrize(
    ("meta", "where"),
    [
        ({"when": object()}, "['meta']['when'] (object)"),
        ({"a": {"b": [1, {2, 3}]}}, "['meta']['a']['b'][1] (set)"),
        ({"raw": b"bytes"}, "['meta']['raw'] (bytes)"),
    ],
)
def test_unserializable_meta_fails_naming_the_field(
    spider: ProductsSpider, meta: dict, where: str
) -> None:
    with pytest.raises(UnserializableRequestError) as info:
        encode_request(Request("http://shop.test/", meta=meta), spider)
    assert f"request{where} is not JSON-serializable" in str(info.value)


def test_callback_must_be_a_spider_method(spider: ProductsSpider) -> None:
    with pytest.raises(UnserializableRequestError, match="callback"):
        encode_request(Request("http://shop.test/", callback=lambda r: None), spider)


def test_form_requests_travel_but_arbitrary_classes_do_not(spider: ProductsSpider) -> None:
    form = FormRequest("http://shop.test/login", formdata={"u": "x"})
    copy, _ = decode_request(encode_request(form, spider), spider)
    assert type(copy) is FormRequest
    assert copy.body == b"u=x"
    evil = json.dumps({"url": "http://shop.test/", "class": "os.system"})
    with pytest.raises(UnserializableRequestError, match="not allowed"):
        decode_request(evil, spider)


def test_backoff_grows_with_jitter() -> None:
    from project.frontier.retry import backoff_delay

    for attempt in range(6):
        ceiling = min(60.0, 1.0 * 2**attempt)
        delays = [backoff_delay(attempt, 1.0, 60.0) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 150, "no jitter"


@pytest.mark.parametrize(
    "meta",
    [
        {"playwright": True, "playwright_page_init_callback": "os.system"},
        {"playwright_page_event_handlers": {"dialog": "parse"}},
        {"playwright_context_kwargs": {"storage_state": "/etc/shadow"}},
    ],
)
def test_meta_that_would_run_code_on_nodes_is_refused(spider: ProductsSpider, meta) -> None:
    with pytest.raises(UnserializableRequestError, match="cannot travel"):
        encode_request(Request("http://shop.test/", meta=meta), spider)
    crafted = json.dumps({"url": "http://shop.test/", "meta": meta})
    with pytest.raises(UnserializableRequestError, match="cannot travel"):
        decode_request(crafted, spider)


# -- a payload read back from Redis is a stranger's -----------------------------------------------


def test_decoding_drops_node_local_meta_from_a_payload(spider: ProductsSpider) -> None:
    forged = json.dumps(
        {
            "url": "http://shop.test/p",
            "meta": {
                "_frontier_outcome": {"action": "dead"},
                "_frontier_lease": True,
                "download_latency": 3.0,
                "depth": 2,
            },
        }
    )
    request, _ = decode_request(forged, spider)
    assert request.meta == {"depth": 2}


@pytest.mark.parametrize(
    "callback", ["__init__", "__class__", "name", "custom_settings", "nope", "a b", 5, ["parse"]]
)
def test_a_payload_callback_must_name_a_spider_method(spider: ProductsSpider, callback) -> None:
    forged = json.dumps({"url": "http://shop.test/p", "callback": callback})
    with pytest.raises(UnserializableRequestError, match="callback"):
        decode_request(forged, spider)


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],
        "http://shop.test/",
        {"url": 5},
        {"url": "http://s/", "priority": "high"},
        {"url": "http://s/", "priority": True},
        {"url": "http://s/", "meta": []},
        {"url": "http://s/", "headers": "X: 1"},
        {"url": "http://s/", "cb_kwargs": [1]},
        {"url": "http://s/", "dont_filter": "yes"},
        {"url": "http://s/", "body_b64": "!!!"},
        {"url": "http://s/", "class": "os.system"},
    ],
)
def test_a_payload_of_the_wrong_shape_is_refused(spider: ProductsSpider, doc) -> None:
    with pytest.raises(UnserializableRequestError):
        decode_request(json.dumps(doc), spider)


def test_a_payload_opens_with_its_url_and_closes_with_its_id(spider: ProductsSpider) -> None:
    """The site queues leave out the ``{"url":"https://<site>`` a payload opens with and the
    ``,"id":"<12 hex>"}`` it closes with (lua/lib/site_queues.lua): whatever the request
    carries, those stay where they are, or each queued request costs 40 bytes more."""
    request = Request(
        "https://shop.test/p/1",
        callback=spider.parse_product,
        headers={"X-Token": "t"},
        meta={"depth": 3},
        priority=-10,
        cb_kwargs={"page": 2},
    )
    payload = encode_request(request, spider, id="0123456789ab")
    assert payload.startswith(b'{"url":"https://shop.test/')
    assert payload.endswith(b',"id":"0123456789ab"}')
