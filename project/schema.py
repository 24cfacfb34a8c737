"""Validated, normalised product: what the MongoDB pipeline stores."""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["CONTENT_FIELDS", "Availability", "Product", "field_errors"]

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

# Digits with an optional decimal part; thousands separated by commas in groups of three.
_PRICE = re.compile(r"(?:\d+|\d{1,3}(?:,\d{3})+)(?:\.\d+)?")
_PRICE_SYMBOLS = re.compile(r"[\s$€£¥]")
_CURRENCY = re.compile(r"[A-Z]{3}")
_SPACES = re.compile(r"\s+")


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

    url: str
    canonical_url: str
    name: str
    price: Decimal
    currency: str
    sku: str
    availability: Availability | None = None
    description: str | None = None
    breadcrumb: list[str] = []
    image_urls: list[str] = []
    rendered: bool = False

    @field_validator("url", "canonical_url", mode="before")
    @classmethod
    def _absolute_url(cls, value: object) -> str:
        text = _required_text(value)
        parts = urlsplit(text)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise PydanticCustomError(
                "url", "not an absolute http(s) URL: {value}", {"value": repr(text)}
            )
        return urlunsplit(
            (parts.scheme.lower(), parts.netloc.lower(), parts.path or "/", parts.query, "")
        )

    @field_validator("name", "sku", mode="before")
    @classmethod
    def _text(cls, value: object) -> str:
        return _SPACES.sub(" ", _required_text(value))

    @field_validator("price", mode="before")
    @classmethod
    def _price(cls, value: object) -> Decimal:
        if isinstance(value, Decimal | int | float) and not isinstance(value, bool):
            price = Decimal(str(value))
        else:
            text = _PRICE_SYMBOLS.sub("", _required_text(value))
            if not _PRICE.fullmatch(text):
                raise PydanticCustomError("price", "not a price: {value}", {"value": repr(value)})
            price = Decimal(text.replace(",", ""))  # the pattern admits only valid decimals
        if not price.is_finite() or price <= 0:
            raise PydanticCustomError(
                "price", "price must be > 0, got {value}", {"value": repr(value)}
            )
        return price

    @field_validator("currency", mode="before")
    @classmethod
    def _currency(cls, value: object) -> str:
        text = _required_text(value).upper()
        if not _CURRENCY.fullmatch(text):
            raise PydanticCustomError(
                "currency", "not a 3-letter currency code: {value}", {"value": repr(value)}
            )
        return text

    @field_validator("availability", mode="before")
    @classmethod
    def _availability(cls, value: object) -> Availability | None:
        if value is None or isinstance(value, Availability):
            return value
        if not isinstance(value, str):
            raise PydanticCustomError("availability", "not text: {value}", {"value": repr(value)})
        key = _SPACES.sub(" ", value.replace("-", " ").replace("_", " ")).strip().lower()
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
            "availability", "unknown availability: {value}", {"value": repr(value)}
        )

    @field_validator("description", mode="before")
    @classmethod
    def _optional_text(cls, value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise PydanticCustomError("text", "not text: {value}", {"value": repr(value)})
        return value.strip() or None

    @field_validator("breadcrumb", mode="before")
    @classmethod
    def _breadcrumb(cls, value: object) -> list[str]:
        return [_SPACES.sub(" ", part).strip() for part in _text_list(value) if part.strip()]

    @field_validator("image_urls", mode="before")
    @classmethod
    def _image_urls(cls, value: object, info: ValidationInfo) -> list[str]:
        base = info.data.get("url")
        urls: list[str] = []
        for raw in _text_list(value):
            url = urljoin(base, raw.strip()) if base else raw.strip()
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise PydanticCustomError(
                    "url", "image URL is not absolute http(s): {value}", {"value": repr(raw)}
                )
            if url not in urls:
                urls.append(url)
        return urls

    def content(self) -> dict[str, Any]:
        """The content fields, JSON-ready (price as its decimal text)."""
        data = self.model_dump(mode="json", include=set(CONTENT_FIELDS))
        data["price"] = str(self.price)
        return data

    def content_hash(self) -> str:
        """SHA-256 over the content fields: equal for equal products, whatever URL they came from."""
        blob = json.dumps(self.content(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()


def field_errors(exc: ValidationError) -> dict[str, list[str]]:
    """Messages of a validation error, grouped by top-level field."""
    reasons: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else "__root__"
        message = "missing" if error["type"] == "missing" else error["msg"]
        reasons.setdefault(field, []).append(message)
    return reasons


def _required_text(value: object) -> str:
    if value is None:
        raise PydanticCustomError("missing", "missing")
    if not isinstance(value, str):
        raise PydanticCustomError("text", "not text: {value}", {"value": repr(value)})
    text = value.strip()
    if not text:
        raise PydanticCustomError("empty", "empty")
    return text


def _text_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise PydanticCustomError("list", "not a list of text: {value}", {"value": repr(value)})
    if not all(isinstance(part, str) for part in value):
        raise PydanticCustomError("list", "not a list of text: {value}", {"value": repr(value)})
    return list(value)
