"""Items extracted by fleetcrawl spiders."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ProductItem"]


@dataclass
class ProductItem:
    """A product as extracted from a product page, before validation.

    Values are kept as the page shows them (``price`` is the raw text);
    the validation pipeline normalises and types them.
    """

    url: str
    canonical_url: str | None = None
    name: str | None = None
    price: str | None = None
    currency: str | None = None
    sku: str | None = None
    availability: str | None = None
    description: str | None = None
    breadcrumb: list[str] = field(default_factory=list)
    image_urls: list[str] = field(default_factory=list)
    rendered: bool = False
