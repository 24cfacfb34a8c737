"""Seed validation: every bad seed is named, none costs another."""

from __future__ import annotations

import pytest

from project.frontier.seeds import InvalidSeed, Seed, parse_seed, preview


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"http://shop.test/", Seed(url="http://shop.test/")),
        (b"  https://shop.test/a?b=1 \n", Seed(url="https://shop.test/a?b=1")),
        (
            (
                b'{"url": "http://shop.test/", "priority": 5, "meta": {"k": 1}, "method": "post",'
                b' "headers": {"A": "b"}, "body": "x=1"}'
            ),
            Seed("http://shop.test/", 5, {"k": 1}, "POST", {"A": "b"}, "x=1"),
        ),
    ],
)
def test_good_seeds(raw: bytes, expected: Seed) -> None:
    assert parse_seed(raw, 65536) == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"not a url", "url"),
        (b"ftp://shop.test/", "url"),
        (b"/relative", "url"),
        (b"", "empty"),
        (b"   ", "empty"),
        (b"\xff\xfe\x00", "encoding"),
        (b'{"url": 5}', "url_type"),
        (b'{"url": "http://x/", "priority": "high"}', "priority"),
        (b'{"url": "http://x/", "priority": true}', "priority"),
        (b'{"url": "http://x/", "meta": []}', "meta"),
        (b'{"url": "http://x/", "method": "BREW"}', "method"),
        (b'{"url": "http://x/", "headers": {"a": 1}}', "headers"),
        (b'{"url": "http://x/", "body": 1}', "body"),
        (b'{"url": "http://x/", "callback": "evil"}', "field"),
        (b'{"url": ', "json"),
        (b"x" * 70000, "too_large"),
        # seeds that once escaped validation and wedged the fleet
        (b"http://[::1", "url"),
        (b"http://shop.test:99999/", "url"),
        (b"http://" + b"a" * 3000 + b".test/", "url"),
        (b'{"url": "http://x/", "priority": ' + b"9" * 5000 + b"}", "json"),
        (b'{"url": "http://x/", "priority": 100001}', "priority"),
        (b'{"url": "http://x/", "meta": {"playwright_page_init_callback": "os.system"}}', "meta"),
        (b'{"url": "http://x/", "meta": {"_frontier_outcome": {"action": "dead"}}}', "meta"),
    ],
)
def test_bad_seeds_are_named(raw: bytes, code: str) -> None:
    with pytest.raises(InvalidSeed) as info:
        parse_seed(raw, 65536)
    assert info.value.code == code


def test_json_nested_30000_deep_is_an_invalid_seed() -> None:
    deep = b'{"url": "http://x/", "meta": ' + b'{"a": ' * 30000 + b"1" + b"}" * 30001
    with pytest.raises(InvalidSeed) as info:
        parse_seed(deep, 1_000_000)
    assert info.value.code == "json"


def test_preview_truncates_large_seeds() -> None:
    text = preview(b"y" * 10_000_000)
    assert len(text) < 300
    assert text.endswith("(10000000 bytes)")
