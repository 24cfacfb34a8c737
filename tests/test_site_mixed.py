"""The mixed site of the test shop (``--mixed``): static, JavaScript-only and switching product
pages by URL pattern, listed once each, and the renders a browser reports."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from parsel import Selector

from tests.site.config import parse_args
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator

_MIXED = 123
_JS_SHARE = 0.3
_DEAL_SHARE = 0.2


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(
        20, seed=5, mixed=_MIXED, mixed_js_share=_JS_SHARE, mixed_deal_share=_DEAL_SHARE
    ) as server:
        yield server


@pytest.fixture
def fresh_shop(shop: ShopServer) -> ShopServer:
    shop.reset()
    return shop


@pytest.fixture(scope="module")
def expected(shop: ShopServer) -> dict[str, dict[str, Any]]:
    products: dict[str, dict[str, Any]] = shop.mixed_expected()["products"]
    return products


def _page(shop: ShopServer, path: str) -> Selector:
    page = shop.fetch(path)
    assert page.status == 200, path
    return Selector(text=page.text)


def _path(shop: ShopServer, url: str) -> str:
    assert url.startswith(shop.base_url)
    return url[len(shop.base_url) :]


def _first(shop: ShopServer, expected: dict[str, dict[str, Any]], pattern: str) -> str:
    return next(_path(shop, url) for url, p in expected.items() if p["pattern"] == pattern)


def _script_data(html: str) -> dict[str, Any]:
    blob = re.search(r'atob\("([A-Za-z0-9+/=]+)"\)', html)
    assert blob is not None
    data: dict[str, Any] = json.loads(base64.b64decode(blob.group(1)))
    return data


def _is_static(shop: ShopServer, path: str) -> bool:
    page = _page(shop, path)
    if page.css(".product"):
        return True
    assert _script_data(page.get())["sku"]
    return False


def test_listings_link_every_product_once_with_the_shares_asked(
    shop: ShopServer, expected: dict[str, dict[str, Any]]
) -> None:
    root = _page(shop, "/mixed/")
    categories = root.css("a.category-link::attr(href)").getall()
    assert len(categories) == round(_MIXED / 40)
    linked: Counter[str] = Counter()
    for href in categories:
        path: str | None = href
        while path is not None:
            listing = _page(shop, path)
            linked.update(listing.css("a.product-link::attr(href)").getall())
            path = listing.css("a.next::attr(href)").get()
    assert set(linked.values()) == {1}
    assert {shop.url(path) for path in linked} == set(expected)
    patterns = Counter(p["pattern"] for p in expected.values())
    assert patterns == {
        "app": round(_JS_SHARE * _MIXED),
        "deal": round(_DEAL_SHARE * _MIXED),
        "shelf": _MIXED - round(_JS_SHARE * _MIXED) - round(_DEAL_SHARE * _MIXED),
    }
    assert all(f"/mixed/{p['pattern']}/" in url for url, p in expected.items())


def test_static_page_has_the_markup_and_the_js_page_only_its_script(
    shop: ShopServer, expected: dict[str, dict[str, Any]]
) -> None:
    for pattern in ("shelf", "app"):
        path = _first(shop, expected, pattern)
        truth = expected[shop.url(path)]
        page = shop.fetch(path)
        assert page.headers["cache-control"] == "no-store"
        assert "etag" not in page.headers
        assert "last-modified" not in page.headers
        html = Selector(text=page.text)
        assert html.css("link[rel=canonical]::attr(href)").get() == shop.url(path)
        assert "fetch('/_mixed/beacon?path=' + encodeURIComponent(" in page.text
        if pattern == "shelf":
            product = html.css(".product")
            shown = (
                product.css(".product-name::text").get(),
                product.css(".price::text").get(),
                product.css(".price::attr(data-currency)").get(),
                product.css(".sku::text").get(),
            )
        else:
            assert not html.css(".product")
            assert truth["sku"] not in page.text
            data = _script_data(page.text)
            shown = (data["name"], data["price"], data["currency"], data["sku"])
        assert shown == (truth["name"], truth["price"], truth["currency"], truth["sku"])


def test_deal_pages_turn_javascript_only_after_switch_after_served() -> None:
    with ShopServer(20, mixed=40, mixed_deal_share=0.5, mixed_switch_after=3) as shop:
        products = shop.mixed_expected()["products"]
        deals = [_path(shop, url) for url, p in products.items() if p["pattern"] == "deal"]
        assert [_is_static(shop, path) for path in deals[:5]] == [True] * 3 + [False] * 2
        assert [_is_static(shop, path) for path in deals[:3]] == [False] * 3
        state = shop.mixed_expected()
        assert (state["switched"], state["deal_served"]) == (True, 8)


def test_control_endpoint_switches_deal_pages_at_once_and_back(
    fresh_shop: ShopServer, expected: dict[str, dict[str, Any]]
) -> None:
    deal = _first(fresh_shop, expected, "deal")
    assert _is_static(fresh_shop, deal)
    assert fresh_shop.mixed_switch(on=True) == {"switched": True, "deal_served": 1}
    assert not _is_static(fresh_shop, deal)
    assert fresh_shop.mixed_switch(on=False) == {"switched": False, "deal_served": 0}
    assert _is_static(fresh_shop, deal)
    assert _is_static(fresh_shop, _first(fresh_shop, expected, "shelf"))


def test_beacons_count_renders_of_served_pages_apart_from_hits(
    fresh_shop: ShopServer, expected: dict[str, dict[str, Any]]
) -> None:
    app = _first(fresh_shop, expected, "app")
    listing = "/mixed/category/1?page=1"
    for path in (app, app, listing):
        assert fresh_shop.fetch(path).status == 200
    for path in (app, listing):
        beacon = "/_mixed/beacon?" + urllib.parse.urlencode({"path": path})
        assert fresh_shop.fetch(beacon).status == 200
    assert fresh_shop.fetch("/_mixed/beacon?path=/mixed/never-served").status == 400
    stats = fresh_shop.stats()
    assert stats["mixed_hits"] == {app: 2, listing: 1}
    assert stats["mixed_renders"] == {app: 1, listing: 1}
    assert stats["total"] == 3
    fresh_shop.reset()
    stats = fresh_shop.stats()
    assert (stats["mixed_hits"], stats["mixed_renders"]) == ({}, {})


@pytest.mark.parametrize(
    "path",
    [
        "/mixed",
        "/mixed/category/0",
        "/mixed/category/01?page=1",
        "/mixed/category/99?page=1",
        "/mixed/category/1?page=0",
        "/mixed/category/1?page=x",
        pytest.param("/mixed/category/1?page=" + "9" * 5000, id="huge-page"),
        "/mixed/shelf/1",
        "/mixed/app/abc",
    ],
)
def test_paths_the_mixed_site_does_not_have_are_404(shop: ShopServer, path: str) -> None:
    assert shop.fetch(path).status == 404


def test_a_product_under_another_pattern_s_path_is_404(
    shop: ShopServer, expected: dict[str, dict[str, Any]]
) -> None:
    shelf = _first(shop, expected, "shelf")
    assert shop.fetch(shelf.replace("/shelf/", "/app/")).status == 404


def test_without_mixed_every_path_of_the_mixed_site_is_404() -> None:
    with ShopServer(20) as shop:
        for path in ("/mixed/", "/mixed/category/1?page=1", "/mixed/shelf/1000001"):
            assert shop.fetch(path).status == 404, path
        for path in ("/_mixed", "/_mixed/expected", "/_mixed/beacon?path=/mixed/"):
            assert shop.fetch(path).status == 404, path
        assert "/_mixed" not in shop.stats()["hits"]


@pytest.mark.parametrize(
    "path",
    [
        "/_mixed?switch=x",
        "/_mixed?switch=2",
        "/_mixed?switch=",
        "/_mixed?switch=-1",
        "/_mixed?switch=1&switch=0",
        "/_mixed?switch=%00%ff",
        pytest.param("/_mixed?switch=" + "1" * 10_000, id="huge-switch"),
        "/_mixed/beacon",
        "/_mixed/beacon?path=",
        "/_mixed/beacon?path=%00%ff",
        "/_mixed/beacon?path=/mixed/&path=/mixed/",
        pytest.param("/_mixed/beacon?path=/mixed/" + "x" * 10_000, id="huge-path"),
    ],
)
def test_control_endpoints_answer_garbage_with_400(shop: ShopServer, path: str) -> None:
    assert shop.fetch("/mixed/").status == 200
    before = shop.fetch("/_mixed").json(), shop.stats()["mixed_renders"]
    answer = shop.fetch(path)
    assert answer.status == 400
    assert answer.json()["error"]
    assert (shop.fetch("/_mixed").json(), shop.stats()["mixed_renders"]) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["--mixed", "-1"],
        ["--mixed-js-share", "1.5"],
        ["--mixed-js-share", "0.7", "--mixed-deal-share", "0.4"],
        ["--mixed-switch-after", "x"],
    ],
)
def test_mixed_options_are_checked(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
