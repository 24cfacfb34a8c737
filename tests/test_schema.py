"""Product normalisation: field cleaning, prices, availability, invalid fields by name,
bounded sizes, and the canonical link that becomes a product's ``_id``."""

from __future__ import annotations

import sys
from decimal import Decimal

import bson
import pytest

from project.schema import (
    MAX_BREADCRUMB_PARTS,
    MAX_DESCRIPTION_LENGTH,
    MAX_IMAGE_URLS,
    MAX_NAME_LENGTH,
    MAX_SKU_LENGTH,
    MAX_URL_LENGTH,
    Availability,
    Product,
    canonical_product_url,
    field_errors,
)

#: A valid product page's fields, as extracted (also the base of tests/test_store.py's products).
VALID = {
    "url": "http://shop.test/product/7?utm_source=x",
    "canonical_url": "http://shop.test/product/7",
    "name": "  Sturdy   Oak Chair ",
    "price": "19.99",
    "currency": "eur",
    "sku": " SKU-000007 ",
    "availability": "in stock",
    "description": " Built to last. ",
    "breadcrumb": ["Home", " Garden Tools "],
    "image_urls": ["/img/7-1.jpg", "/img/7-1.jpg", "https://cdn.test/7-2.jpg"],
}


def test_product_normalises_fields() -> None:
    product = Product.model_validate(VALID)
    assert product.name == "Sturdy Oak Chair"
    assert product.price == Decimal("19.99")
    assert product.currency == "EUR"
    assert product.sku == "SKU-000007"
    assert product.availability is Availability.IN_STOCK
    assert product.description == "Built to last."
    assert product.breadcrumb == ["Home", "Garden Tools"]
    assert product.image_urls == ["http://shop.test/img/7-1.jpg", "https://cdn.test/7-2.jpg"]


def test_content_hash_ignores_how_the_page_was_fetched() -> None:
    one = Product.model_validate(VALID)
    other = Product.model_validate(
        {**VALID, "url": "http://shop.test/product/7#reviews", "rendered": True}
    )
    changed = Product.model_validate({**VALID, "price": "18.99"})
    assert one.content_hash() == other.content_hash() != changed.content_hash()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("19.99", "19.99"), (" 5 ", "5"), ("1,299.00", "1299.00"), ("€3.50", "3.50"), ("$ 12", "12")],
)
def test_price_parses(text: str, expected: str) -> None:
    assert Product.model_validate({**VALID, "price": text}).price == Decimal(expected)


@pytest.mark.parametrize("text", ["call us", "12,,3", "", None, "0", "0.00", "-1", "1.2.3", "1,23"])
def test_garbage_price_is_an_error(text: str | None) -> None:
    with pytest.raises(ValueError, match="price") as info:
        Product.model_validate({**VALID, "price": text})
    assert set(field_errors(info.value)) == {"price"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", None),
        ("name", "   "),
        ("sku", None),
        ("currency", "EURO"),
        ("currency", "€"),
        ("canonical_url", None),
        ("canonical_url", "  "),
        ("url", "/product/7"),
        ("url", "ftp://shop.test/product/7"),
        ("availability", "maybe later"),
    ],
)
def test_invalid_field_is_reported_by_name(field: str, value: object) -> None:
    # Relative image URLs need a valid page URL: leave them out where the page URL is the error.
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, "image_urls": [], field: value})
    assert list(field_errors(info.value)) == [field]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("In Stock", Availability.IN_STOCK),
        ("http://schema.org/InStock", Availability.IN_STOCK),
        ("out of stock", Availability.OUT_OF_STOCK),
        ("Sold out", Availability.OUT_OF_STOCK),
        ("pre-order", Availability.PREORDER),
        ("", None),
        (None, None),
    ],
)
def test_availability_is_normalised(text: str | None, expected: Availability | None) -> None:
    assert Product.model_validate({**VALID, "availability": text}).availability is expected


# -- row 16: a page may name only its own site's product ------------------------------------------

PAGE = "http://shop.test/product/7?utm_source=x"


@pytest.mark.parametrize(
    ("canonical", "expected", "why"),
    [
        ("http://shop.test/product/7", "http://shop.test/product/7", None),
        ("/product/7", "http://shop.test/product/7", None),  # relative: resolved, not rejected
        ("../product/7?b=2&a=1#reviews", "http://shop.test/product/7?a=1&b=2", None),
        ("HTTP://SHOP.TEST:80/product/7", "http://shop.test/product/7", None),
        ("https://shop.test/product/7", "https://shop.test/product/7", None),
        ("http://user:pw@shop.test./product/%7e7", "http://shop.test/product/~7", None),
        # Another site's product, by host, by port, protocol-relative: the page's own URL.
        ("http://other.test/product/7", "http://shop.test/product/7?utm_source=x", "offsite"),
        ("http://shop.test:8080/product/7", "http://shop.test/product/7?utm_source=x", "offsite"),
        ("//other.test/product/7", "http://shop.test/product/7?utm_source=x", "offsite"),
        ("http://www.shop.test/product/7", "http://shop.test/product/7?utm_source=x", "offsite"),
        # Not an http(s) URL at all: the page's own URL too.
        ("ftp://shop.test/product/7", "http://shop.test/product/7?utm_source=x", "invalid"),
        ("javascript:alert(1)", "http://shop.test/product/7?utm_source=x", "invalid"),
        ("http://[::1/product/7", "http://shop.test/product/7?utm_source=x", "invalid"),
        ("http://shop.test:99999/x", "http://shop.test/product/7?utm_source=x", "invalid"),
        ("/" + "x" * MAX_URL_LENGTH, "http://shop.test/product/7?utm_source=x", "invalid"),
    ],
)
def test_row16_canonical_link_becomes_the_id_only_on_the_pages_own_site(
    canonical: str, expected: str, why: str | None
) -> None:
    assert canonical_product_url(PAGE, canonical) == (expected, why)
    product = Product.model_validate({**VALID, "url": PAGE, "canonical_url": canonical})
    assert product.canonical_url == expected
    assert product.url == PAGE, "the page URL itself is kept as it was fetched"


def test_row16_a_page_on_a_port_keeps_its_port() -> None:
    page = "http://127.0.0.1:8123/product/1"
    assert canonical_product_url(page, "/product/1") == ("http://127.0.0.1:8123/product/1", None)
    assert canonical_product_url(page, "http://127.0.0.1:9999/product/1")[1] == "offsite"


# -- row 3: field sizes bounded by the schema -----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "http://shop.test/" + "p" * MAX_URL_LENGTH),
        ("name", "n" * (MAX_NAME_LENGTH + 1)),
        ("sku", "s" * (MAX_SKU_LENGTH + 1)),
        ("description", "d" * (MAX_DESCRIPTION_LENGTH + 1)),
        ("breadcrumb", ["crumb"] * (MAX_BREADCRUMB_PARTS + 1)),
        ("breadcrumb", ["c" * 501]),
        ("image_urls", [f"/img/{n}.jpg" for n in range(MAX_IMAGE_URLS + 1)]),
        ("image_urls", ["/img/same.jpg"] * (4 * MAX_IMAGE_URLS + 1)),
        ("image_urls", ["/" + "i" * MAX_URL_LENGTH]),
        ("price", "1" * 65),
        ("price", Decimal("1" * 31)),
        ("price", 10**40),
        ("price", "0." + "1" * 40),
    ],
)
def test_row3_an_oversized_field_is_an_error_by_name(field: str, value: object) -> None:
    images = [] if field == "url" else VALID["image_urls"]  # relative: they need the page URL
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, "image_urls": images, field: value})
    assert list(field_errors(info.value)) == [field]  # type: ignore[arg-type]


def test_row3_the_largest_valid_product_fits_a_mongodb_document() -> None:
    wide = "\U0001f600"  # four bytes in UTF-8: the worst case per character
    product = Product.model_validate(
        {
            **VALID,
            "url": "http://shop.test/" + "u" * (MAX_URL_LENGTH - 17),
            "canonical_url": "/" + "c" * (MAX_URL_LENGTH - 18),
            "name": wide * MAX_NAME_LENGTH,
            "sku": wide * MAX_SKU_LENGTH,
            "description": wide * MAX_DESCRIPTION_LENGTH,
            "breadcrumb": [wide * 500] * MAX_BREADCRUMB_PARTS,
            "image_urls": [f"/{n}/" + "i" * (MAX_URL_LENGTH - 30) for n in range(MAX_IMAGE_URLS)],
        }
    )
    size = len(bson.encode({"_id": product.canonical_url, **product.content()}))
    assert size < 1024 * 1024 < 16 * 1024 * 1024, size


def _deep(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("price", "9" * 10_000_000),  # 10 MB of digits
        ("price", 10**5000),  # more digits than int() may print
        ("name", _deep(30_000)),  # deeper than repr() survives
        ("currency", {"a" * 10_000: "b" * 10_000}),
        ("breadcrumb", [_deep(30_000)]),
        ("availability", "x" * 1_000_000),
    ],
    ids=["10MB-price", "huge-int", "deep-name", "huge-dict", "deep-crumb", "1MB-availability"],
)
def test_row3_hostile_values_cost_a_short_message(field: str, value: object) -> None:
    assert sys.getrecursionlimit() < 30_000
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, field: value})
    reasons = field_errors(info.value)  # type: ignore[arg-type]
    assert list(reasons) == [field]
    assert all(len(message) < 400 for message in reasons[field]), reasons
