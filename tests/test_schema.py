"""Product normalisation: field cleaning, prices, availability, invalid fields by name."""

from __future__ import annotations

from decimal import Decimal

import pytest

from project.schema import Availability, Product, field_errors

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
        ("canonical_url", "/product/7"),
        ("canonical_url", "ftp://shop.test/product/7"),
        ("availability", "maybe later"),
    ],
)
def test_invalid_field_is_reported_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, field: value})
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
