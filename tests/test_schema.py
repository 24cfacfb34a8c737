"""Product normalisation: field cleaning, prices, availability, invalid fields by name,
bounded sizes, and the canonical link that becomes a product's ``_id``."""

from __future__ import annotations

import sys
from decimal import Decimal

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

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
    [
        ("19.99", "19.99"),
        (" 5 ", "5"),
        ("1,299.00", "1299.00"),
        ("€3.50", "3.50"),
        ("$ 12", "12"),
        # Real-world formats, read by price-parser: decimal comma, thousands by . , space or '.
        ("12,50 €", "12.50"),
        ("1.234,56", "1234.56"),
        ("1 234,56 zł", "1234.56"),
        ("1\u00a0234,56 €", "1234.56"),  # no-break space
        ("1\u202f234,56 €", "1234.56"),  # narrow no-break space (French)
        ("$1,234.56", "1234.56"),
        ("£51.77", "51.77"),
        ("1.234.567,89 EUR", "1234567.89"),
        ("12.50", "12.50"),
        ("EUR 12,50", "12.50"),
        ("CHF 1'234.50", "1234.50"),
        ("10 000", "10000"),
        # One separator before exactly three digits groups thousands (price-parser's reading);
        # before other counts it is the decimal point. "1,23" was refused before price-parser.
        ("1,23", "1.23"),
        ("1.234", "1234"),
        ("1,234", "1234"),
        ("0.125", "0.125"),  # price-parser alone reads 125
        ("1234.567", "1234.567"),  # and 1234567
        (12, "12"),
        (12.5, "12.5"),
        (Decimal("7.10"), "7.10"),
    ],
)
def test_price_parses(text: object, expected: str) -> None:
    # A price that names another currency than VALID's EUR must say so in its currency.
    currency = {"1 234,56 zł": "PLN", "£51.77": "GBP", "CHF 1'234.50": "chf"}.get(str(text), "eur")
    product = Product.model_validate({**VALID, "price": text, "currency": currency})
    assert product.price == Decimal(expected)


@pytest.mark.parametrize(
    "text",
    [
        "call us", "12,,3", "", "   ", None, "0", "0.00", "-1", "€ -5", "1.2.3", "abc", "free",
        "12 apples 34", "1.2.3.4", "from $5", "£12.00 incl. VAT", "5 XYZ", "12.50 BTC", "12€50",
        "€", "12 34", "1,234,56", "$1.234.56", "12..5", ".5", "5.", "5,-", "1e5", "0x10",
        "\u0661\u0662", "€ 12 €", "1" * 65, "9" * 10_000_000, 0, -3, Decimal("NaN"),
        float("inf"), True, ["12"], {"amount": 12},
    ],
    ids=repr,
)  # fmt: skip
def test_garbage_price_is_an_error(text: object) -> None:
    with pytest.raises(ValueError, match="price") as info:
        Product.model_validate({**VALID, "price": text})
    assert set(field_errors(info.value)) == {"price"}  # type: ignore[arg-type]
    assert all(len(m) < 400 for m in field_errors(info.value)["price"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("price", "currency", "expected"),
    [
        ("12,50 €", None, "EUR"),
        ("£51.77", "", "GBP"),
        ("1.234.567,89 EUR", None, "EUR"),
        ("1 234,56 zł", "  ", "PLN"),
        ("US$ 5", None, "USD"),
        ("12,50 €", "€", "EUR"),  # the symbol extracted as the currency, made a code
        ("12,50 €", "eur", "EUR"),
    ],
)
def test_a_price_that_names_its_currency_fills_a_missing_one(
    price: str, currency: str | None, expected: str
) -> None:
    assert Product.model_validate({**VALID, "price": price, "currency": currency}).currency == (
        expected
    )


@pytest.mark.parametrize("price", ["$12.50", "¥1200", "12.50", "5 kr"])
def test_an_ambiguous_or_missing_currency_symbol_fills_nothing(price: str) -> None:
    # $ (USD, CAD, AUD, ...), ¥ (JPY, CNY) and kr (SEK, NOK, DKK) name several currencies.
    with pytest.raises(ValueError, match="currency") as info:
        Product.model_validate({**VALID, "price": price, "currency": None})
    assert set(field_errors(info.value)) == {"currency"}  # type: ignore[arg-type]


_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(
    whole=st.integers(1, 10**12),
    cents=st.integers(0, 99),
    separators=st.sampled_from([(",", "."), (".", ","), (" ", ","), ("\u202f", ","), ("'", ".")]),
    currency=st.sampled_from(
        [("", "USD"), ("€", None), (" EUR", None), (" zł", None), ("$", "USD")]
    ),
    leading=st.booleans(),
)
def test_a_formatted_price_is_read_as_its_amount(
    whole: int, cents: int, separators: tuple[str, str], currency: tuple[str, str | None],
    leading: bool,
) -> None:  # fmt: skip
    group, point = separators
    number = f"{whole:,}".replace(",", group) + f"{point}{cents:02d}"
    symbol, code = currency
    text = f"{symbol.strip()} {number}" if leading and symbol else f"{number}{symbol}"
    product = Product.model_validate({**VALID, "price": text, "currency": code})
    assert product.price == Decimal(f"{whole}.{cents:02d}")


@_FUZZ
@given(text=st.text(max_size=80) | st.from_regex(r"[-$€£ .,'0-9a-zA-Z]{0,20}", fullmatch=True))
def test_any_price_text_is_a_positive_price_or_an_error_by_name(text: str) -> None:
    try:
        product = Product.model_validate({**VALID, "price": text, "currency": None})
    except ValidationError as exc:
        fields = set(field_errors(exc))
    else:
        fields = set()
    if fields:
        assert fields <= {"price", "currency"}
        return
    assert product.price > 0
    assert product.currency.isupper()
    assert len(product.currency) == 3


def test_a_currency_that_contradicts_the_price_is_an_error() -> None:
    with pytest.raises(ValueError, match="currency") as info:
        Product.model_validate({**VALID, "price": "12,50 €", "currency": "USD"})
    assert field_errors(info.value) == {  # type: ignore[arg-type]
        "currency": ["'USD' but the price is in EUR"]
    }


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


# -- a page may name only its own site's product --------------------------------------------------

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
def test_canonical_link_becomes_the_id_only_on_the_pages_own_site(
    canonical: str, expected: str, why: str | None
) -> None:
    assert canonical_product_url(PAGE, canonical) == (expected, why)
    product = Product.model_validate({**VALID, "url": PAGE, "canonical_url": canonical})
    assert product.canonical_url == expected
    assert product.url == PAGE, "the page URL itself is kept as it was fetched"


def test_a_page_on_a_port_keeps_its_port() -> None:
    page = "http://127.0.0.1:8123/product/1"
    assert canonical_product_url(page, "/product/1") == ("http://127.0.0.1:8123/product/1", None)
    assert canonical_product_url(page, "http://127.0.0.1:9999/product/1")[1] == "offsite"


# -- field sizes bounded by the schema ------------------------------------------------------------


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
def test_an_oversized_field_is_an_error_by_name(field: str, value: object) -> None:
    images = [] if field == "url" else VALID["image_urls"]  # relative: they need the page URL
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, "image_urls": images, field: value})
    assert list(field_errors(info.value)) == [field]  # type: ignore[arg-type]


def test_the_largest_valid_product_fits_a_mongodb_document() -> None:
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
def test_hostile_values_cost_a_short_message(field: str, value: object) -> None:
    assert sys.getrecursionlimit() < 30_000
    with pytest.raises(ValueError, match=field) as info:
        Product.model_validate({**VALID, field: value})
    reasons = field_errors(info.value)  # type: ignore[arg-type]
    assert list(reasons) == [field]
    assert all(len(message) < 400 for message in reasons[field]), reasons
