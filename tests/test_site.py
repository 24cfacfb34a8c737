"""The test shop (tests/site/) serves the pages, variants and failures the crawl tests rely on."""

from __future__ import annotations

import base64
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections import defaultdict
from html import escape, unescape
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fleet import wait_for
from tests.site.catalogue import generate_catalogue
from tests.site.config import parse_args
from tests.site.hostile import Canary
from tests.site.pages import HOSTILE_PAGES, LONG_URL_LENGTH, STRAY_PATHS
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_HREF = re.compile(r'href="([^"]*)"')


def _fetch(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with _OPENER.open(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read().decode()


def _hrefs(html: str) -> list[str]:
    return [unescape(href) for href in _HREF.findall(html)]


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(
        300,
        seed=3,
        js_share=0.1,
        malformed_share=0.1,
        flaky_share=0.1,
        broken_share=0.05,
        flaky_failures=2,
    ) as server:
        yield server


@pytest.fixture
def fresh_shop(shop: ShopServer) -> ShopServer:
    shop.reset()
    return shop


@pytest.fixture(scope="module")
def expected(shop: ShopServer) -> dict[str, list[int]]:
    result: dict[str, list[int]] = shop.stats()["expected"]
    return result


def test_root_links_every_category(shop: ShopServer) -> None:
    status, _, html = _fetch(shop.url("/"))
    assert status == 200
    linked = {
        m.group(1) for href in _hrefs(html) if (m := re.match(r"/category/([a-z0-9-]+)\?", href))
    }
    categories = shop.catalogue()["categories"]
    assert len(categories) >= 3
    assert linked == {c["slug"] for c in categories}


def test_listing_walk_reaches_every_product_under_variants(shop: ShopServer) -> None:
    _, _, root = _fetch(shop.url("/"))
    starts = [h for h in _hrefs(root) if h.startswith("/category/")]
    assert any("utm_source" in h for h in starts), (
        "the root should link some listings under a variant"
    )
    hrefs_by_id: dict[int, set[str]] = defaultdict(set)
    listings = 0
    for start in starts:
        url: str | None = shop.url(start)
        while url is not None:
            status, _, html = _fetch(url)
            assert status == 200
            listings += 1
            for href in _hrefs(html):
                if m := re.match(r"/product/(\d+)", href):
                    hrefs_by_id[int(m.group(1))].add(href)
            following = re.search(r'<a rel="next" class="next" href="([^"]+)"', html)
            url = shop.url(unescape(following.group(1))) if following else None
    assert set(hrefs_by_id) == set(range(1, 301))
    assert listings == sum(c["pages"] for c in shop.catalogue()["categories"])
    assert any(len(hrefs) > 1 for hrefs in hrefs_by_id.values())
    variants = set().union(*hrefs_by_id.values())
    for marker in ("utm_source=", "a=1&b=2", "b=2&a=1", "#reviews", "ref="):
        assert any(marker in href for href in variants), marker


def test_product_page_markup_matches_catalogue(
    shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    product_id = expected["plain"][0]
    truth = shop.catalogue()["products"][product_id - 1]
    status, _, html = _fetch(shop.url(f"/product/{product_id}?utm_source=x#reviews"))
    assert status == 200
    assert f'<div class="product" data-product-id="{product_id}">' in html
    assert f'<h1 class="product-name">{escape(truth["name"])}</h1>' in html
    assert (
        f'<span class="price" data-currency="{truth["currency"]}">{truth["price"]}</span>' in html
    )
    assert f'<span class="sku">{truth["sku"]}</span>' in html
    assert f'<span class="availability">{truth["availability"]}</span>' in html
    assert f'<link rel="canonical" href="{shop.url(f"/product/{product_id}")}">' in html
    for src in truth["images"]:
        assert f'class="product-image" src="{src}"' in html


def test_images_and_robots(shop: ShopServer) -> None:
    with _OPENER.open(shop.url("/img/1-1.jpg"), timeout=30) as response:
        assert response.headers["Content-Type"] == "image/png"
        assert response.read().startswith(b"\x89PNG")
    status, _, robots = _fetch(shop.url("/robots.txt"))
    assert status == 200
    assert robots == f"User-agent: *\nDisallow:\n\nSitemap: {shop.url('/sitemap.xml')}\n"


@pytest.mark.parametrize(
    "path", ["/nope", "/product/0", "/product/301", "/category/nope", "/img/1-9.jpg"]
)
def test_unknown_paths_are_404(shop: ShopServer, path: str) -> None:
    assert _fetch(shop.url(path))[0] == 404


def test_listing_page_out_of_range_is_404(shop: ShopServer) -> None:
    category = shop.catalogue()["categories"][0]
    assert _fetch(shop.url(f"/category/{category['slug']}?page={category['pages'] + 1}"))[0] == 404
    assert _fetch(shop.url(f"/category/{category['slug']}?page=x"))[0] == 404


def test_stats_count_product_hits_across_variants(
    fresh_shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    product_id = expected["plain"][1]
    variants = [
        f"/product/{product_id}",
        f"/product/{product_id}?b=2&a=1",
        f"/product/{product_id}#reviews",
    ]
    for path in variants:
        assert _fetch(fresh_shop.url(path))[0] == 200
    _fetch(fresh_shop.url("/"))
    stats = fresh_shop.stats()
    assert stats["product_hits"] == {str(product_id): 3}
    assert stats["hits"] == {
        f"/product/{product_id}": 2,
        f"/product/{product_id}?b=2&a=1": 1,
        "/": 1,
    }
    assert stats["statuses"] == {"200": 4}
    assert stats["total"] == 4
    assert sum(stats["per_second"].values()) == 4
    assert stats["products"] == 300
    assert stats["config"]["flaky_failures"] == 2


def test_flaky_pages_answer_503_then_200(
    fresh_shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    product_id = expected["flaky"][0]
    statuses = [_fetch(fresh_shop.url(f"/product/{product_id}?try={i}"))[0] for i in range(4)]
    assert statuses == [503, 503, 200, 200]
    assert fresh_shop.stats()["product_hits"] == {str(product_id): 4}
    fresh_shop.reset()
    assert _fetch(fresh_shop.url(f"/product/{product_id}"))[0] == 503


def test_broken_pages_always_answer_503(
    fresh_shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    product_id = expected["broken"][0]
    assert [_fetch(fresh_shop.url(f"/product/{product_id}"))[0] for _ in range(4)] == [503] * 4
    assert fresh_shop.stats()["statuses"] == {"503": 4}


def test_js_pages_hide_product_markup(shop: ShopServer, expected: dict[str, list[int]]) -> None:
    product_id = expected["js"][0]
    truth = shop.catalogue()["products"][product_id - 1]
    status, _, html = _fetch(shop.url(f"/product/{product_id}"))
    assert status == 200
    assert 'class="price"' not in html
    assert 'class="product-name"' not in html
    assert truth["sku"] not in html
    assert '<div id="app"></div>' in html
    assert f'<link rel="canonical" href="{shop.url(f"/product/{product_id}")}">' in html
    blob = re.search(r'atob\("([A-Za-z0-9+/=]+)"\)', html)
    assert blob is not None
    data = json.loads(base64.b64decode(blob.group(1)))
    assert (data["name"], data["price"], data["sku"]) == (
        truth["name"],
        truth["price"],
        truth["sku"],
    )


def test_malformed_pages_have_no_valid_price(
    shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    products = shop.catalogue()["products"]
    missing = garbage = 0
    for product_id in expected["malformed"]:
        _, _, html = _fetch(shop.url(f"/product/{product_id}"))
        price = re.search(r'<span class="price"[^>]*>([^<]*)</span>', html)
        assert '<span class="sku">' in html
        if price is None:
            missing += 1
            assert products[product_id - 1]["page_price"] is None
        else:
            garbage += 1
            assert not re.fullmatch(r"\d+\.\d\d", price.group(1))
            assert price.group(1) == products[product_id - 1]["page_price"]
    assert missing > 0
    assert garbage > 0


def test_expected_kinds_partition_the_catalogue(
    shop: ShopServer, expected: dict[str, list[int]]
) -> None:
    kinds = ("plain", "js", "malformed", "flaky", "broken")
    ids = [pid for kind in kinds for pid in expected[kind]]
    assert sorted(ids) == list(range(1, 301))
    assert [len(expected[k]) for k in kinds[1:]] == [30, 30, 30, 15]
    assert {p["id"]: p["kind"] for p in shop.catalogue()["products"]} == {
        pid: kind for kind in kinds for pid in expected[kind]
    }


def test_catalogue_is_deterministic() -> None:
    first = generate_catalogue(500, seed=7, js_share=0.2, flaky_share=0.1, slow_share=0.1)
    assert first == generate_catalogue(500, seed=7, js_share=0.2, flaky_share=0.1, slow_share=0.1)
    assert first != generate_catalogue(500, seed=8, js_share=0.2, flaky_share=0.1, slow_share=0.1)
    assert len(first.ids_of_kind("js")) == 100
    assert sum(p.slow for p in first.products) == 50


@pytest.mark.parametrize("n_products", [1, 50, 500, 5000])
def test_catalogue_shape(n_products: int) -> None:
    catalogue = generate_catalogue(n_products, seed=1)
    assert len(catalogue.products) == n_products
    assert max(3, n_products // 100) <= len(catalogue.categories) <= max(3, n_products // 60 + 1)
    assert len({c.slug for c in catalogue.categories}) == len(catalogue.categories)
    for product in catalogue.products:
        assert 1 <= len(product.categories) <= 3
        assert product.sku == f"SKU-{product.id:06d}"
        assert re.fullmatch(r"\d+\.\d\d", product.price)
        assert product.breadcrumb == ("Home", catalogue.category(product.categories[0]).name)  # type: ignore[union-attr]
        assert 2 <= len(product.images) <= 3
    listed = [pid for c in catalogue.categories for pid in c.product_ids]
    assert set(listed) == {p.id for p in catalogue.products}


@pytest.mark.parametrize("bad", [{"js_share": 1.5}, {"js_share": 0.6, "broken_share": 0.6}])
def test_catalogue_rejects_bad_shares(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="share"):
        generate_catalogue(10, 0, **bad)


def test_latency_retry_after_burst_and_robots() -> None:
    with ShopServer(
        20,
        latency_ms=200,
        slow_share=0.5,
        slow_ms=300,
        retry_after_burst=2,
        retry_after=7,
        robots_crawl_delay=1.5,
        robots_disallow=["/private", "/checkout"],
    ) as server:
        started = time.monotonic()
        status, _, robots = _fetch(server.url("/robots.txt"))
        assert time.monotonic() - started >= 0.2
        assert robots == (
            "User-agent: *\nCrawl-delay: 1.5\nDisallow: /private\nDisallow: /checkout\n"
            f"\nSitemap: {server.url('/sitemap.xml')}\n"
        )

        plain = next(pid for pid in range(1, 21) if pid not in server.stats()["expected"]["slow"])
        for _ in range(2):
            status, headers, _ = _fetch(server.url(f"/product/{plain}"))
            assert (status, headers["Retry-After"]) == (429, "7")
        assert _fetch(server.url(f"/product/{plain}"))[0] == 200

        slow = server.stats()["expected"]["slow"][0]
        started = time.monotonic()
        assert _fetch(server.url(f"/product/{slow}"))[0] == 200
        assert time.monotonic() - started >= 0.5

        server.reset()
        assert _fetch(server.url(f"/product/{plain}"))[0] == 429


def test_timeline_times_every_counted_request_and_reset_clears_it() -> None:
    paths = ["/robots.txt", "/", "/category/nowhere?page=1", "/product/1", "/product/1"]
    with ShopServer(10, latency_ms=50) as server:
        for path in paths:
            server.fetch(path)
        server.stats()  # control endpoints are not counted
        timeline = server.timeline()
        assert [path for _, _, path, _ in timeline] == paths
        for arrival, finish, *_ in timeline:
            assert finish is not None
            assert finish >= arrival + 0.05
        arrivals = [arrival for arrival, *_ in timeline]
        assert arrivals == sorted(arrivals)

        server.reset()
        assert server.timeline() == []


def test_shop_server_reports_startup_failure() -> None:
    with pytest.raises(RuntimeError, match="did not start"), ShopServer(products=10, js_share=2):
        pass


@pytest.fixture(scope="module")
def hostile_shop() -> Iterator[ShopServer]:
    with ShopServer(
        40, hostile=True, hostile_ports=[6379, 9], huge_bytes=30_000_000, stall_seconds=1.0
    ) as server:
        yield server


@pytest.fixture
def fresh_hostile_shop(hostile_shop: ShopServer) -> ShopServer:
    hostile_shop.reset()
    return hostile_shop


def _raw_get(port: int, path: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return conn


def _vm_hwm(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) * 1024


def test_hostile_listings_link_traps_before_products(hostile_shop: ShopServer) -> None:
    category = hostile_shop.catalogue()["categories"][0]
    _, _, html = _fetch(hostile_shop.url(category["url"]))
    hrefs = _hrefs(html)
    traps = [
        "file:///dev/zero",
        "ftp://127.0.0.1/x",
        "data:,hello",
        "javascript:alert(1)",
        "http://127.0.0.1:6379/FLUSHALL",
        "http://127.0.0.1:9/FLUSHALL",
        "http://[::1/product/1",
        "http://shop:99999/",
        "http:///nohost",
    ]
    for trap in traps:
        assert trap in hrefs
    long_urls = [h for h in hrefs if h.startswith(HOSTILE_PAGES["long-url"])]
    assert [len(h) for h in long_urls] == [LONG_URL_LENGTH]
    for name, path in HOSTILE_PAGES.items():
        if name != "long-url":
            assert re.search(f'class="product-link" href="{path}"', html), name
    first_product = next(i for i, h in enumerate(hrefs) if h.startswith("/product/"))
    assert hrefs.index("file:///dev/zero") < first_product, "traps come before the products"
    assert hostile_shop.stats()["hostile_links"] == [
        h for h in hrefs if h in traps or h.startswith("/hostile/")
    ]


def test_shop_without_hostile_mode_has_no_traps(shop: ShopServer) -> None:
    category = shop.catalogue()["categories"][0]
    _, _, html = _fetch(shop.url(category["url"]))
    assert "/hostile/" not in html
    assert "file:" not in html
    for path in [*HOSTILE_PAGES.values(), *STRAY_PATHS]:
        assert _fetch(shop.url(path))[0] == 404
    stats = shop.stats()
    assert stats["config"]["hostile"] is False
    assert stats["hostile"] == {}
    assert stats["hostile_links"] == []


@pytest.mark.parametrize(
    ("name", "status", "retry_after"),
    [
        ("retry-after-huge", 503, "99999999999"),
        ("retry-after-garbage", 503, "soon"),
        ("throttled", 429, None),
    ],
)
def test_hostile_error_pages_answer_the_same_for_ever(
    fresh_hostile_shop: ShopServer, name: str, status: int, retry_after: str | None
) -> None:
    for _ in range(3):
        code, headers, _ = _fetch(fresh_hostile_shop.url(HOSTILE_PAGES[name]))
        assert (code, headers.get("Retry-After")) == (status, retry_after)
    stats = fresh_hostile_shop.stats()
    assert stats["hostile"] == {name: 3}
    assert stats["statuses"] == {str(status): 3}


def test_huge_page_is_streamed_without_holding_it(fresh_hostile_shop: ShopServer) -> None:
    with _OPENER.open(fresh_hostile_shop.url(HOSTILE_PAGES["huge"]), timeout=30) as response:
        assert response.headers["Content-Length"] is None
        assert response.headers["Transfer-Encoding"] == "chunked"
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
            tail = chunk
    assert size == 30_000_000
    assert b'<span class="sku">HOSTILE-HUGE</span>' in tail, "the product comes last"
    stats = fresh_hostile_shop.stats()
    assert stats["hostile"] == {"huge": 1}
    assert stats["hostile_sent"] == {"huge": 30_000_000}
    assert stats["hostile_completed"] == {"huge": 1}
    assert fresh_hostile_shop._process is not None
    assert _vm_hwm(fresh_hostile_shop._process.pid) < 200 * 2**20


def test_huge_page_stops_when_its_client_goes(fresh_hostile_shop: ShopServer) -> None:
    with _raw_get(fresh_hostile_shop.port, HOSTILE_PAGES["huge"]) as conn:
        received = 0
        while received < 1 << 20:
            received += len(conn.recv(1 << 16))
    time.sleep(0.5)
    stats = fresh_hostile_shop.stats()
    assert stats["hostile"] == {"huge": 1}
    assert stats["hostile_sent"]["huge"] < 15_000_000
    assert stats["hostile_completed"] == {}


def test_stall_page_sends_a_little_then_nothing_for_a_bounded_time(
    fresh_hostile_shop: ShopServer,
) -> None:
    started = time.monotonic()
    with _raw_get(fresh_hostile_shop.port, HOSTILE_PAGES["stall"]) as conn:
        first = b""
        while b"<body>" not in first:
            first += conn.recv(65536)
        assert time.monotonic() - started < 1.0, "headers and a little body come at once"
        assert first.startswith(b"HTTP/1.1 200 OK")
        assert b"HOSTILE-STALL" not in first
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += conn.recv(65536)
    assert time.monotonic() - started >= 1.0
    assert b"HOSTILE-STALL" in rest
    assert fresh_hostile_shop.stats()["hostile_completed"] == {"stall": 1}


def test_stall_page_is_dropped_when_its_client_goes(fresh_hostile_shop: ShopServer) -> None:
    with _raw_get(fresh_hostile_shop.port, HOSTILE_PAGES["stall"]) as conn:
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 OK")
    time.sleep(1.5)
    stats = fresh_hostile_shop.stats()
    assert stats["hostile"] == {"stall": 1}
    assert stats["hostile_completed"] == {}


def test_stray_paths_and_the_long_url_are_counted(fresh_hostile_shop: ShopServer) -> None:
    for path in STRAY_PATHS:
        assert _fetch(fresh_hostile_shop.url(path))[0] == 404
    long_url = HOSTILE_PAGES["long-url"] + "x" * 100
    status, _, html = _fetch(fresh_hostile_shop.url(long_url))
    assert status == 200
    assert "HOSTILE-LONG-URL" in html, "a crawl that fetched it would store a product"
    assert fresh_hostile_shop.stats()["hostile"] == {
        **{f"stray:{path}": 1 for path in STRAY_PATHS},
        "long-url": 1,
    }


def test_canary_records_every_connection() -> None:
    with Canary() as canary:
        assert canary.connections == 0
        with socket.create_connection(("127.0.0.1", canary.port), timeout=5) as conn:
            conn.sendall(b"GET /FLUSHALL HTTP/1.1\r\n\r\n")
        wait_for(lambda: canary.received, 5, "the canary to record the request")
        assert canary.connections == 1
        assert canary.received == [b"GET /FLUSHALL HTTP/1.1\r\n\r\n"]


@pytest.mark.parametrize(
    "argv", [["--hostile-ports", "0"], ["--hostile-ports", "65536"], ["--stall-seconds", "-1"]]
)
def test_hostile_options_are_checked(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_hostile_options_parse() -> None:
    config = parse_args(["--hostile", "--hostile-ports", "1", "2", "--hostile-ports", "3"])
    assert (config.hostile, config.hostile_ports) == (True, (1, 2, 3))
    assert config.as_dict()["hostile_ports"] == [1, 2, 3]
    assert (config.huge_bytes, config.stall_seconds) == (30_000_000, 60.0)
