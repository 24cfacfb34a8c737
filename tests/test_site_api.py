"""The test shop's JSON API: categories, paged products, and its answers to bad requests."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.site.api import MAX_BODY_BYTES
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator

_JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(130, seed=2, page_size=15, js_share=0.1, malformed_share=0.1) as server:
        yield server


@pytest.fixture
def fresh_shop(shop: ShopServer) -> ShopServer:
    shop.reset()
    return shop


def _post(shop: ShopServer, body: bytes | str | object) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    page = shop.fetch("/api/products", data, headers=_JSON)
    assert page.headers["content-type"] == "application/json"
    return page.status, page.json()


def test_categories_list_every_category_with_the_url_to_post_to(shop: ShopServer) -> None:
    page = shop.fetch("/api/categories")
    assert (page.status, page.headers["content-type"]) == (200, "application/json")
    categories = page.json()["categories"]
    truth = shop.catalogue()["categories"]
    assert [(c["slug"], c["name"]) for c in categories] == [(c["slug"], c["name"]) for c in truth]
    for listed, category in zip(categories, truth, strict=True):
        assert listed["url"] == shop.url("/api/products")
        assert listed["products"] == len(category["product_ids"])
        assert listed["pages"] == -(-len(category["product_ids"]) // 15)


def test_paging_a_category_gives_its_products_once_in_order(fresh_shop: ShopServer) -> None:
    catalogue = fresh_shop.catalogue()
    products = {p["id"]: p for p in catalogue["products"]}
    for category in catalogue["categories"]:
        query: dict[str, Any] | None = {"category": category["slug"], "page": 1}
        seen: list[int] = []
        pages = 0
        while query is not None:
            status, payload = _post(fresh_shop, query)
            assert status == 200
            pages += 1
            assert payload["page"] == query["page"]
            assert len(payload["products"]) <= 15
            for product in payload["products"]:
                truth = products[product["id"]]
                assert product == {
                    "id": truth["id"],
                    "name": truth["name"],
                    "price": truth["price"],
                    "currency": truth["currency"],
                    "sku": truth["sku"],
                    "url": fresh_shop.url(truth["url"]),
                    "availability": truth["availability"],
                }
                seen.append(product["id"])
            query = payload["next"]
            if query is not None:
                assert query == {"category": category["slug"], "page": payload["page"] + 1}
        assert seen == category["product_ids"]
        assert pages == payload["pages"] == max(1, -(-len(seen) // 15))
    api_hits = fresh_shop.stats()["api_hits"]
    assert sum(api_hits.values()) == sum(c["pages"] for c in _api_categories(fresh_shop))
    assert max(api_hits.values()) == 1


def _api_categories(shop: ShopServer) -> list[dict[str, Any]]:
    categories: list[dict[str, Any]] = shop.fetch("/api/categories").json()["categories"]
    return categories


def test_a_missing_page_number_means_page_one(shop: ShopServer) -> None:
    slug = shop.catalogue()["categories"][0]["slug"]
    assert _post(shop, {"category": slug}) == _post(shop, {"category": slug, "page": 1})


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{bad",
        b"\xff\xfe\x00garbage",
        b"[" * 20_000 + b"]" * 20_000,  # deeper than the JSON parser's recursion limit
        b'{"category": "x", "page": 1' + b"0" * 5000 + b"}",  # an integer too long to parse
        b"[]",
        b'"a string"',
        b"null",
    ],
    ids=["empty", "broken", "binary", "deep", "long-number", "array", "string", "null"],
)
def test_a_body_that_is_no_json_object_is_a_400(fresh_shop: ShopServer, body: bytes) -> None:
    status, payload = _post(fresh_shop, body)
    assert status == 400
    assert isinstance(payload["error"], str)
    assert fresh_shop.stats()["api_hits"] == {}, "a bad request is not a page of products"


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"category": 7, "page": 1}, 400),
        ({"page": 1}, 400),
        ({"category": "x", "page": "1"}, 400),
        ({"category": "x", "page": 0}, 400),
        ({"category": "x", "page": -3}, 400),
        ({"category": "x", "page": 1.5}, 400),
        ({"category": "x", "page": True}, 400),
        ({"category": "no-such-category", "page": 1}, 404),
        ({"category": "FIRST", "page": 10**30}, 404),
    ],
)
def test_bad_queries_get_a_json_error(shop: ShopServer, query: dict[str, Any], status: int) -> None:
    if query.get("category") == "FIRST":
        query = {**query, "category": shop.catalogue()["categories"][0]["slug"]}
    answer = _post(shop, query)
    assert answer[0] == status
    assert set(answer[1]) == {"error"}


def test_a_huge_body_is_refused(shop: ShopServer) -> None:
    status, payload = _post(shop, b" " * (MAX_BODY_BYTES + 1))
    assert status == 413
    assert "error" in payload


def test_products_must_be_posted(shop: ShopServer) -> None:
    page = shop.fetch("/api/products")
    assert (page.status, page.headers["allow"]) == (405, "POST")
    assert "error" in page.json()


def test_the_api_is_not_linked_from_the_shop(shop: ShopServer) -> None:
    assert "/api/" not in shop.fetch("/").text
    category = shop.catalogue()["categories"][0]
    assert "/api/" not in shop.fetch(category["url"]).text
