"""Crawl a shop's paginated JSON API: the categories, then every page of each one's products.

A plain Scrapy ``Spider``: ``GET <api>/api/categories`` lists the categories and the URL to
POST to; each category is paged with ``JsonRequest`` bodies ``{"category": slug, "page": n}``,
following the ``next`` body each answer gives, with the category in ``cb_kwargs``. It yields
``project.items.ProductItem`` (so the fleet's pipelines validate and store them), one per
product however many categories list it. The API's address is a spider argument::

    scrapy crawl catalogue_api -a api=http://127.0.0.1:8000      # on every node

On the fleet one node runs ``start()`` for all; ``-s ADDONS={} -O products.jsonl`` runs it
alone on Scrapy's own scheduler.

An answer that is not the JSON the API promises costs only itself
(``catalogue_api/bad_payload``, ``catalogue_api/bad_products``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Spider
from scrapy.http import JsonRequest, TextResponse

from project.frontier.meta import REVISIT_UNSURE_META_KEY
from project.items import ProductItem

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response

__all__ = ["CatalogueApiSpider"]

logger = logging.getLogger(__name__)

CATEGORIES_PATH = "/api/categories"


class CatalogueApiSpider(Spider):
    """Pages through ``/api/products`` for every category ``/api/categories`` lists."""

    name = "catalogue_api"

    def __init__(self, api: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parts = urlsplit(api or "")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"catalogue_api needs the API's base URL, -a api=http://host:port (got {api!r})"
            )
        self.api: str = api.rstrip("/") if api else ""
        #: Product ids already yielded: a product is in several categories.
        self._yielded: set[int] = set()

    async def start(self) -> AsyncIterator[JsonRequest]:
        """The categories request."""
        yield JsonRequest(self.api + CATEGORIES_PATH, callback=self.parse_categories)

    def parse_categories(self, response: Response) -> Iterator[JsonRequest]:
        """The first page of every category."""
        payload = self._payload(response)
        categories = payload.get("categories") if payload else None
        if not isinstance(categories, list):
            self._bad_payload(response, "no list of categories")
            return
        for category in categories:
            slug = category.get("slug") if isinstance(category, dict) else None
            url = category.get("url") if isinstance(category, dict) else None
            if not isinstance(slug, str) or not isinstance(url, str):
                self._bad_payload(response, f"a category without slug or url: {category!r:.200}")
                continue
            yield JsonRequest(
                response.urljoin(url),
                data={"category": slug, "page": 1},
                callback=self.parse_products,
                cb_kwargs={"category": slug},
            )

    def parse_products(
        self, response: Response, category: str
    ) -> Iterator[ProductItem | JsonRequest]:
        """One page of a category: its products, then the request for the next page."""
        payload = self._payload(response)
        products = payload.get("products") if payload else None
        if payload is None or not isinstance(products, list):
            self._bad_payload(response, f"no list of products for {category!r}")
            return
        for product in products:
            item = self._item(response, product)
            if item is not None:
                yield item
        following = payload.get("next")
        if isinstance(following, dict):
            yield JsonRequest(
                response.url,
                data=following,
                callback=self.parse_products,
                cb_kwargs={"category": category},
            )

    def _item(self, response: Response, product: Any) -> ProductItem | None:
        if not isinstance(product, dict) or not isinstance(product.get("url"), str):
            self.crawler.stats.inc_value("catalogue_api/bad_products")
            logger.debug("A product without url from %s: %.200r", response.url, product)
            return None
        product_id = product.get("id")
        if isinstance(product_id, int):
            if product_id in self._yielded:
                self.crawler.stats.inc_value("catalogue_api/duplicates")
                return None
            self._yielded.add(product_id)
        url = response.urljoin(product["url"])
        return ProductItem(
            url=url,
            canonical_url=url,
            name=_text(product.get("name")),
            price=_text(product.get("price")),
            currency=_text(product.get("currency")),
            sku=_text(product.get("sku")),
            availability=_text(product.get("availability")),
        )

    def _payload(self, response: Response) -> dict[str, Any] | None:
        if not isinstance(response, TextResponse):
            return None
        try:
            payload = response.json()
        except (ValueError, RecursionError):  # not JSON, too deep, a number too long
            return None
        return payload if isinstance(payload, dict) else None

    def _bad_payload(self, response: Response, why: str) -> None:
        self.crawler.stats.inc_value("catalogue_api/bad_payload")
        response.meta[REVISIT_UNSURE_META_KEY] = True  # not read whole: nothing is gone
        logger.warning("Unexpected API answer from %s: %s", response.url, why)


def _text(value: Any) -> str | None:
    """A JSON value as the item's text: numbers as written, anything else but text is None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) else None
