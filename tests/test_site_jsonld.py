"""Product pages of the test shop carry schema.org JSON-LD that says what their markup says."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import extruct
import pytest

from tests.site.catalogue import Product
from tests.site.pages import render_product
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator

_SCRIPT = re.compile(r'<script type="application/ld\+json">(.*?)</script>', re.DOTALL)


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(60, seed=5, js_share=0.2, malformed_share=0.2) as server:
        yield server


@pytest.fixture(scope="module")
def truth(shop: ShopServer) -> dict[int, dict[str, Any]]:
    return {p["id"]: p for p in shop.catalogue()["products"]}


def _json_ld(shop: ShopServer, product_id: int) -> list[dict[str, Any]]:
    page = shop.fetch(f"/product/{product_id}")
    assert page.status == 200
    data = extruct.extract(
        page.text, base_url=shop.url(f"/product/{product_id}"), syntaxes=["json-ld"], uniform=True
    )
    blocks: list[dict[str, Any]] = data["json-ld"]
    return blocks


def test_every_plain_product_page_has_a_schema_org_product(
    shop: ShopServer, truth: dict[int, dict[str, Any]]
) -> None:
    plain = [p for p in truth.values() if p["kind"] == "plain"]
    assert len(plain) > 30
    for product in plain:
        blocks = _json_ld(shop, product["id"])
        assert [b["@type"] for b in blocks] == ["Product", "BreadcrumbList"]
        data = blocks[0]
        url = shop.url(product["url"])
        assert data["@context"] == "https://schema.org"
        assert (data["name"], data["sku"], data["description"], data["url"]) == (
            product["name"],
            product["sku"],
            product["description"],
            url,
        )
        assert data["image"] == [shop.url(src) for src in product["images"]]
        schema_availability = {"in stock": "InStock", "out of stock": "OutOfStock"}
        assert data["offers"] == {
            "@type": "Offer",
            "url": url,
            "price": product["price"],
            "priceCurrency": product["currency"],
            "availability": "https://schema.org/" + schema_availability[product["availability"]],
        }
        crumbs = blocks[1]["itemListElement"]
        assert [(c["position"], c["name"]) for c in crumbs] == list(
            enumerate(product["breadcrumb"], start=1)
        )
        assert crumbs[1]["item"] == shop.url(f"/category/{product['categories'][0]}?page=1")


def test_malformed_products_publish_the_same_bad_price(
    shop: ShopServer, truth: dict[int, dict[str, Any]]
) -> None:
    malformed = [p for p in truth.values() if p["kind"] == "malformed"]
    assert any(p["page_price"] is None for p in malformed)
    assert any(p["page_price"] is not None for p in malformed)
    for product in malformed:
        offer = _json_ld(shop, product["id"])[0]["offers"]
        assert offer.get("price") == product["page_price"]
        assert offer["priceCurrency"] == product["currency"]


def test_javascript_products_have_no_json_ld(
    shop: ShopServer, truth: dict[int, dict[str, Any]]
) -> None:
    js = [p["id"] for p in truth.values() if p["kind"] == "js"]
    assert js
    for product_id in js:
        page = shop.fetch(f"/product/{product_id}")
        assert "application/ld+json" not in page.text
        assert truth[product_id]["sku"] not in page.text


def test_product_markup_is_unchanged_by_the_json_ld(shop: ShopServer) -> None:
    page = shop.fetch("/product/1").text
    body = page[page.index("<body>") :]
    assert "ld+json" not in body, "the scripts are in the head; the body is as before"
    assert '<div class="product" data-product-id="1">' in body


@pytest.mark.parametrize(
    "name", ["</script><script>alert(1)</script>", 'Quote " and \\ backslash', "Ünïcödé & <b>"]
)
def test_json_ld_survives_hostile_text(name: str) -> None:
    product = Product(
        id=7,
        name=name,
        price="1.00",
        currency="EUR",
        sku="SKU-7",
        availability="in stock",
        description=name,
        breadcrumb=("Home", "X"),
        images=(),
        categories=("x",),
        page_price="1.00",
    )
    html = render_product(product, "http://shop.test")
    scripts = _SCRIPT.findall(html)
    assert len(scripts) == 2, "no text of the product closes its script"
    assert json.loads(scripts[0])["name"] == name
