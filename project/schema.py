"""Validated, normalised product: what the MongoDB pipeline stores."""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from price_parser import Price
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from w3lib.url import canonicalize_url

from project.frontier.sites import MAX_URL_LENGTH
from project.storage.documents import content_hash

if TYPE_CHECKING:
    from urllib.parse import SplitResult

    from pydantic import ValidationError

__all__ = [
    "CONTENT_FIELDS",
    "MAX_BREADCRUMB_PARTS",
    "MAX_DESCRIPTION_LENGTH",
    "MAX_IMAGE_URLS",
    "MAX_NAME_LENGTH",
    "MAX_SKU_LENGTH",
    "MAX_URL_LENGTH",
    "Availability",
    "Product",
    "canonical_product_url",
    "field_errors",
    "is_http_url",
    "normalise_url",
]

#: Fields that make up a product's content; ``url`` and ``rendered`` only say how it was fetched.
CONTENT_FIELDS: tuple[str, ...] = (
    "canonical_url",
    "name",
    "price",
    "currency",
    "sku",
    "availability",
    "description",
    "breadcrumb",
    "image_urls",
)

# A price's number once its currency is cut off: an optional sign, digits (thousands in groups
# of three, separated by one of , . ' or a space throughout) and a decimal part after the other
# separator. One separator before exactly three digits groups thousands ("1.234" is 1234, as
# price-parser reads it); before other counts it is the decimal point ("1,23", "12,50").
_NUMBER = re.compile(
    r"(?P<sign>[-\u2212] ?)?"
    r"(?:(?P<grouped>[1-9][0-9]{0,2}(?P<sep>[,.' \u2019])[0-9]{3}(?:(?P=sep)[0-9]{3})*)"
    r"|(?P<plain>[0-9]+))"
    r"(?:(?P<point>[.,])(?P<fraction>[0-9]+))?"
)
_CURRENCY = re.compile(r"[A-Z]{3}")
#: Currency symbols that name one currency (``$``, ``¥`` and ``kr`` name several, so they don't).
_CURRENCY_SYMBOLS = {
    "€": "EUR", "£": "GBP", "zł": "PLN", "US$": "USD", "CA$": "CAD", "AU$": "AUD",
    "NZ$": "NZD", "HK$": "HKD", "R$": "BRL", "₹": "INR", "₽": "RUB", "₴": "UAH", "₺": "TRY",
    "₪": "ILS", "₩": "KRW", "Kč": "CZK",
}  # fmt: skip
_SPACES = re.compile(r"\s+")

# Field sizes: a valid product is at most about 600 KB of BSON, far below MongoDB's 16 MiB
# document limit, so every product the schema accepts can be stored (docs/architecture.md).
MAX_NAME_LENGTH = 1000
MAX_SKU_LENGTH = 200
MAX_DESCRIPTION_LENGTH = 65_536
MAX_BREADCRUMB_PARTS = 50
MAX_BREADCRUMB_PART_LENGTH = 500
MAX_IMAGE_URLS = 100
#: Longest price text parsed, and most significant digits of a price.
_MAX_PRICE_TEXT = 64
_MAX_PRICE_DIGITS = 30
#: Most characters of an invalid value quoted in an error message.
_PREVIEW = 200
_DEFAULT_PORTS = {"http": 80, "https": 443}
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, _PREVIEW, _PREVIEW, 40

_Url = Annotated[str, Field(max_length=MAX_URL_LENGTH)]


class Availability(StrEnum):
    """Normalised stock status."""

    IN_STOCK = "in_stock"
    OUT_OF_STOCK = "out_of_stock"
    PREORDER = "preorder"


_AVAILABILITY: dict[str, Availability] = {
    "in stock": Availability.IN_STOCK,
    "instock": Availability.IN_STOCK,
    "available": Availability.IN_STOCK,
    "out of stock": Availability.OUT_OF_STOCK,
    "outofstock": Availability.OUT_OF_STOCK,
    "sold out": Availability.OUT_OF_STOCK,
    "soldout": Availability.OUT_OF_STOCK,
    "unavailable": Availability.OUT_OF_STOCK,
    "discontinued": Availability.OUT_OF_STOCK,
    "preorder": Availability.PREORDER,
    "pre order": Availability.PREORDER,
}


class Product(BaseModel):
    """A product that passed validation; text stripped, URLs absolute, price a positive Decimal."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    url: _Url
    canonical_url: _Url
    name: Annotated[str, Field(max_length=MAX_NAME_LENGTH)]
    price: Decimal
    currency: str
    sku: Annotated[str, Field(max_length=MAX_SKU_LENGTH)]
    availability: Availability | None = None
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_LENGTH)] | None = None
    breadcrumb: Annotated[
        list[Annotated[str, Field(max_length=MAX_BREADCRUMB_PART_LENGTH)]],
        Field(max_length=MAX_BREADCRUMB_PARTS),
    ] = []
    image_urls: Annotated[list[_Url], Field(max_length=MAX_IMAGE_URLS)] = []
    rendered: bool = False

    @field_validator("url", mode="before")
    @classmethod
    def _absolute_url(cls, value: object) -> str:
        text = _required_text(value)
        parts = _http_url(text)
        if parts is None:
            raise PydanticCustomError(
                "url", "not an absolute http(s) URL: {value}", {"value": _preview(text)}
            )
        return urlunsplit(
            (parts.scheme.lower(), parts.netloc.lower(), parts.path or "/", parts.query, "")
        )

    @field_validator("canonical_url", mode="before")
    @classmethod
    def _canonical_url(cls, value: object, info: ValidationInfo) -> str:
        text = _required_text(value)
        page = info.data.get("url")
        # Without a valid page URL the product is invalid anyway (reported under url).
        return text if page is None else canonical_product_url(page, text)[0]

    @field_validator("name", "sku", mode="before")
    @classmethod
    def _text(cls, value: object) -> str:
        return _SPACES.sub(" ", _required_text(value))

    @model_validator(mode="before")
    @classmethod
    def _currency_from_price(cls, data: Any) -> Any:
        """A price that names its currency (``12,50 €``, ``EUR 12.50``) fills a missing one."""
        if not isinstance(data, dict) or not isinstance(data.get("price"), str):
            return data
        named = _named_currency(data["price"])
        currency = data.get("currency")
        if named is None:
            return data
        given = currency.strip() if isinstance(currency, str) else currency
        if given is None or given == "" or _CURRENCY_SYMBOLS.get(given) == named:
            return {**data, "currency": named}
        if isinstance(given, str) and given.upper() != named:
            return {**data, "currency": _CurrencyConflict(given, named)}
        return data

    @field_validator("price", mode="before")
    @classmethod
    def _price(cls, value: object) -> Decimal:
        if isinstance(value, Decimal | int | float) and not isinstance(value, bool):
            price = Decimal(value) if isinstance(value, Decimal) else Decimal(str(value))
        else:
            text = _required_text(value)[: _MAX_PRICE_TEXT + 1]
            parsed = _parse_price(text) if len(text) <= _MAX_PRICE_TEXT else None
            if parsed is None:
                raise PydanticCustomError(
                    "price", "not a price: {value}", {"value": _preview(value)}
                )
            price = parsed
        if not price.is_finite() or price <= 0:
            raise PydanticCustomError(
                "price", "price must be > 0, got {value}", {"value": _preview(value)}
            )
        if (
            len(price.as_tuple().digits) > _MAX_PRICE_DIGITS
            or price.adjusted() >= _MAX_PRICE_DIGITS
        ):
            raise PydanticCustomError(
                "price", "price has too many digits: {value}", {"value": _preview(value)}
            )
        return price

    @field_validator("currency", mode="before")
    @classmethod
    def _currency(cls, value: object) -> str:
        if isinstance(value, _CurrencyConflict):
            raise PydanticCustomError(
                "currency",
                "{value} but the price is in {named}",
                {"value": _preview(value.given), "named": value.named},
            )
        text = _required_text(value).upper()
        if not _CURRENCY.fullmatch(text):
            raise PydanticCustomError(
                "currency", "not a 3-letter currency code: {value}", {"value": _preview(value)}
            )
        return text

    @field_validator("availability", mode="before")
    @classmethod
    def _availability(cls, value: object) -> Availability | None:
        if value is None or isinstance(value, Availability):
            return value
        if not isinstance(value, str):
            raise PydanticCustomError(
                "availability", "not text: {value}", {"value": _preview(value)}
            )
        key = _SPACES.sub(" ", value[:100].replace("-", " ").replace("_", " ")).strip().lower()
        key = key.rsplit("/", 1)[-1]  # schema.org URLs: http://schema.org/InStock
        if not key:
            return None
        try:
            return Availability(key)
        except ValueError:
            pass
        if key in _AVAILABILITY:
            return _AVAILABILITY[key]
        raise PydanticCustomError(
            "availability", "unknown availability: {value}", {"value": _preview(value)}
        )

    @field_validator("description", mode="before")
    @classmethod
    def _optional_text(cls, value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise PydanticCustomError("text", "not text: {value}", {"value": _preview(value)})
        return value.strip() or None

    @field_validator("breadcrumb", mode="before")
    @classmethod
    def _breadcrumb(cls, value: object) -> list[str]:
        parts = _text_list(value, MAX_BREADCRUMB_PARTS)
        return [_SPACES.sub(" ", part).strip() for part in parts if part.strip()]

    @field_validator("image_urls", mode="before")
    @classmethod
    def _image_urls(cls, value: object, info: ValidationInfo) -> list[str]:
        base = info.data.get("url")
        urls: dict[str, None] = {}  # ordered, without duplicates
        # Duplicates are common (thumbnails): allow some before the count is checked.
        for raw in _text_list(value, 4 * MAX_IMAGE_URLS):
            try:
                url = urljoin(base, raw.strip()) if base else raw.strip()
                valid = _http_url(url) is not None
            except ValueError:
                valid = False
            if not valid:
                raise PydanticCustomError(
                    "url", "image URL is not absolute http(s): {value}", {"value": _preview(raw)}
                )
            urls[url] = None
        return list(urls)

    def content(self) -> dict[str, Any]:
        """The content fields, JSON-ready (price as its decimal text)."""
        data = self.model_dump(mode="json", include=set(CONTENT_FIELDS))
        data["price"] = str(self.price)
        return data

    def content_hash(self) -> str:
        """SHA-256 over the content fields: equal for equal products, whatever URL they came from."""
        return content_hash(self.content())


class _CurrencyConflict:
    """A currency field that contradicts the currency its price names."""

    def __init__(self, given: str, named: str) -> None:
        self.given = given
        self.named = named


def _price_parts(text: str) -> tuple[str | None, str] | None:
    """The currency a price text names (price-parser's token) and its number, or None.

    The currency may only lead or trail: ``12 apples 34``, ``from $5`` and ``12€50`` are not
    prices.
    """
    text = _SPACES.sub(" ", text).strip()
    token = Price.fromstring(text).currency
    if not token:
        return None, text
    if text.startswith(token):
        return token, text[len(token) :].strip()
    if text.endswith(token):
        return token, text[: -len(token)].strip()
    return None


def _parse_price(text: str) -> Decimal | None:
    """The amount of a price text in any of the usual formats, or None if it is not one.

    price-parser finds the currency and reads the number, told which separator is which
    (alone it reads ``0.125`` as 125 and ``12 apples 34`` as 12): the number must match
    ``_NUMBER`` whole.
    """
    parts = _price_parts(text)
    if parts is None:
        return None
    match = _NUMBER.fullmatch(parts[1])
    group, point = match and match["sep"], match and match["point"]
    if match is None or (group is not None and group == point):
        return None
    if point is None and group is not None:
        point = "." if group != "." else ","
    number = match["grouped"] or match["plain"]
    if match["fraction"]:
        number += f"{point}{match['fraction']}"
    amount = Price.fromstring(number, decimal_separator=point, digit_group_separator=group).amount
    if amount is None:
        return None
    return -amount if match["sign"] else amount


def _named_currency(price: str) -> str | None:
    """The currency code a price text names by code or unambiguous symbol, or None."""
    text = price.strip()
    if len(text) > _MAX_PRICE_TEXT or _parse_price(text) is None:
        return None  # not a price: it names nothing (the price is the error)
    parts = _price_parts(text)
    token = parts[0] if parts is not None else None
    if token is None:
        return None
    return token if _CURRENCY.fullmatch(token) else _CURRENCY_SYMBOLS.get(token)


def field_errors(exc: ValidationError) -> dict[str, list[str]]:
    """Messages of a validation error, grouped by top-level field."""
    reasons: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else "__root__"
        message = "missing" if error["type"] == "missing" else error["msg"]
        reasons.setdefault(field, []).append(message)
    return reasons


def canonical_product_url(page_url: str, canonical: str) -> tuple[str, str | None]:
    """The ``_id`` of a product page: its canonical link when that is on the page's own site.

    The link is resolved against the page and normalised (``w3lib.url.canonicalize_url``, default
    port dropped). A link to another site (``host[:port]``), or one that is not an http(s) URL, is
    replaced by the page's own URL, normalised alike: a page may not write another site's
    product. Returns the URL and, when the link was replaced, why (``offsite``, ``invalid``).
    """
    page = _canonical(page_url) or page_url
    try:
        absolute = urljoin(page_url, canonical.strip())
        parts = _http_url(absolute)
    except ValueError:
        parts = None
    if parts is None or len(absolute) > MAX_URL_LENGTH:
        return page, "invalid"
    if _site(parts) != _site(urlsplit(page_url)):
        return page, "offsite"
    normalised = _canonical(absolute)
    return (normalised, None) if normalised else (page, "invalid")


def normalise_url(url: str) -> str:
    """*url* normalised like a canonical link (``canonicalize_url``, no credentials, no default
    port), or unchanged if it cannot be."""
    return _canonical(url) or url


def is_http_url(text: str) -> bool:
    """*text* is an absolute http(s) URL with a host and a valid port."""
    return _http_url(text) is not None


def _http_url(text: str) -> SplitResult | None:
    """The parts of an absolute http(s) URL with a host and a valid port, else None."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError:
        return None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return parts


def _site(parts: SplitResult) -> tuple[str, int | None]:
    """``host[:port]`` of a URL: the port only when it is not its scheme's default."""
    port = parts.port
    if port == _DEFAULT_PORTS.get(parts.scheme.lower()):
        port = None
    return (parts.hostname or "").rstrip("."), port


def _canonical(url: str) -> str | None:
    """``canonicalize_url``, then ``host[:port]`` alone: no credentials, no default port."""
    try:
        parts = urlsplit(canonicalize_url(url))
        host, port = _site(parts)
    except (ValueError, UnicodeError):
        return None
    netloc = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=netloc if port is None else f"{netloc}:{port}"))


def _preview(value: object) -> str:
    """``repr`` of an invalid value, cut short: error messages are stored with the reject."""
    try:
        text = (
            repr(value) if isinstance(value, str) and len(value) <= _PREVIEW else _REPR.repr(value)
        )
    except (ValueError, RecursionError):  # an int of more than 4300 digits, a deep structure
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "..."


def _required_text(value: object) -> str:
    if value is None:
        raise PydanticCustomError("missing", "missing")
    if not isinstance(value, str):
        raise PydanticCustomError("text", "not text: {value}", {"value": _preview(value)})
    text = value.strip()
    if not text:
        raise PydanticCustomError("empty", "empty")
    return text


def _text_list(value: object, most: int) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise PydanticCustomError("list", "not a list of text: {value}", {"value": _preview(value)})
    if len(value) > most:
        raise PydanticCustomError(
            "too_long", "at most {most} items, got {count}", {"most": most, "count": len(value)}
        )
    if not all(isinstance(part, str) for part in value):
        raise PydanticCustomError("list", "not a list of text: {value}", {"value": _preview(value)})
    return list(value)
