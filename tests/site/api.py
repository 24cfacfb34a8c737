"""The shop's JSON API: the same catalogue as the HTML listings, a page per POST.

``GET /api/categories`` lists the categories; ``POST /api/products`` with the JSON body
``{"category": slug, "page": n}`` answers one page of a category's products and the body of
the next page's request (``null`` after the last). A body that is not such an object is a 400
with a JSON ``{"error": ...}``; an unknown category or a page past the last is a 404.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.site.pages import category_pages
from tests.site.reply import JSON, Reply

if TYPE_CHECKING:
    from tests.site.catalogue import Catalogue

__all__ = ["CATEGORIES_PATH", "MAX_BODY_BYTES", "PRODUCTS_PATH", "CatalogueApi"]

CATEGORIES_PATH = "/api/categories"
PRODUCTS_PATH = "/api/products"
#: Largest request body read; a bigger one is a 413.
MAX_BODY_BYTES = 64 * 1024


class CatalogueApi:
    """Answers the API's two endpoints for one catalogue."""

    def __init__(self, catalogue: Catalogue, page_size: int) -> None:
        self._catalogue = catalogue
        self._page_size = page_size

    def categories(self, base_url: str) -> Reply:
        """Every category: slug, name, product count, pages and the URL to POST to."""
        categories = [
            {
                "slug": c.slug,
                "name": c.name,
                "products": len(c.product_ids),
                "pages": category_pages(c, self._page_size),
                "url": base_url + PRODUCTS_PATH,
            }
            for c in self._catalogue.categories
        ]
        return _json(200, {"categories": categories})

    def products(self, method: bytes, body: bytes, base_url: str) -> tuple[Reply, str | None]:
        """The reply to one request of ``/api/products``, and ``"<slug>/<page>"`` if it was a
        valid one (the key the shop's statistics count it under)."""
        if method != b"POST":
            reply = _error(405, "use POST with a JSON body {category, page}")
            reply.headers[b"allow"] = b"POST"
            return reply, None
        if len(body) > MAX_BODY_BYTES:
            return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes"), None
        try:
            query = json.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return _error(400, f"the body is not JSON: {str(exc)[:200]}"), None
        if not isinstance(query, dict):
            return _error(400, "the body must be a JSON object {category, page}"), None
        slug, page = query.get("category"), query.get("page", 1)
        if not isinstance(slug, str):
            return _error(400, "category must be a string"), None
        if not isinstance(page, int) or isinstance(page, bool) or page < 1:
            return _error(400, "page must be a positive integer"), None
        category = self._catalogue.category(slug)
        if category is None:
            return _error(404, "no such category"), None
        pages = category_pages(category, self._page_size)
        if page > pages:
            return _error(404, f"the category has {pages} pages"), None
        ids = category.product_ids[(page - 1) * self._page_size : page * self._page_size]
        products = []
        for product_id in ids:
            product = self._catalogue.product(product_id)
            assert product is not None  # categories list only the catalogue's products
            products.append(
                {
                    "id": product.id,
                    "name": product.name,
                    "price": product.price,
                    "currency": product.currency,
                    "sku": product.sku,
                    "url": base_url + product.url,
                    "availability": product.availability,
                }
            )
        following = {"category": slug, "page": page + 1} if page < pages else None
        payload = {"products": products, "page": page, "pages": pages, "next": following}
        return _json(200, payload), f"{slug}/{page}"


def _json(status: int, payload: object) -> Reply:
    return Reply(status, json.dumps(payload).encode(), JSON, {b"cache-control": b"no-store"})


def _error(status: int, message: str) -> Reply:
    return _json(status, {"error": message})
