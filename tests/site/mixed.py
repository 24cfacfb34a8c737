"""The mixed site under ``/mixed/``: one shop whose product pages need a browser by URL pattern.

``/mixed/`` links the listing categories (``a.category-link``); ``/mixed/category/<k>?page=<p>``
lists a category's products (``a.product-link``, ``a.next``, ``a.prev``), each product in one
listing. A product's page is that of the shop (:func:`tests.site.pages.render_product`) under
the path of its pattern: ``/mixed/shelf/<id>`` has the markup in its HTML, ``/mixed/app/<id>``
only the script that builds it, ``/mixed/deal/<id>`` is static until ``switch_after`` deal pages
were served (or ``/_mixed?switch=1``), JavaScript-only after. Every page carries a beacon
script: a browser that runs it asks for ``/_mixed/beacon?path=<its path and query>``, which the
shop counts as a render of that page.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, fields, replace
from html import escape
from typing import TYPE_CHECKING

from tests.site.catalogue import Product, draw_product
from tests.site.pages import render_product

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "BEACON_PATH",
    "CONTROL_PATH",
    "EXPECTED_PATH",
    "FIRST_ID",
    "PATTERNS",
    "PREFIX",
    "MixedProduct",
    "MixedSite",
    "generate_mixed",
]

PREFIX = "/mixed/"
CONTROL_PATH = "/_mixed"
BEACON_PATH = "/_mixed/beacon"
EXPECTED_PATH = "/_mixed/expected"
#: Static, JavaScript-only, and static until the switch.
PATTERNS: tuple[str, ...] = ("shelf", "app", "deal")
#: Ids of the mixed products start here, far from the shop's (1..n), so no SKU is both.
FIRST_ID = 1_000_001
#: Products per listing category, about.
_PER_CATEGORY = 40
_LISTING = re.compile(r"/mixed/category/([1-9][0-9]*)")
# keepalive: the beacon is sent even if the crawler closes the page as soon as it has loaded.
_BEACON = (
    "<script>fetch('" + BEACON_PATH + "?path=' + encodeURIComponent(location.pathname"
    " + location.search), {keepalive: true}).catch(function () {});</script>\n"
)


@dataclass(frozen=True)
class MixedProduct(Product):
    """A product of the mixed site; its pattern names the path its page is served under."""

    pattern: str = "shelf"

    @property
    def url(self) -> str:
        """Canonical relative URL of the product page."""
        return f"{PREFIX}{self.pattern}/{self.id}"

    @property
    def listing_url(self) -> str:
        """Relative URL of the first page of the product's listing."""
        return f"{PREFIX}category/{self.categories[0]}?page=1"


def generate_mixed(
    n_products: int, seed: int = 0, *, js_share: float = 0.3, deal_share: float = 0.0
) -> tuple[MixedProduct, ...]:
    """The mixed products, by id; the same arguments always give the same products, and the
    shares decide only which pattern each has."""
    if n_products < 0:
        raise ValueError(f"n_products must be >= 0, got {n_products!r}")
    for name, share in (("js_share", js_share), ("deal_share", deal_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be within [0, 1], got {share!r}")
    if js_share + deal_share > 1.0 + 1e-9:
        raise ValueError("js_share and deal_share add up to more than 1")
    ids = list(range(FIRST_ID, FIRST_ID + n_products))
    order = ids[:]
    random.Random(f"{seed}:mixed-patterns").shuffle(order)
    apps = round(js_share * n_products)
    deals = min(round(deal_share * n_products), n_products - apps)
    pattern = dict.fromkeys(order[:apps], "app") | dict.fromkeys(order[apps : apps + deals], "deal")
    random.Random(f"{seed}:mixed-categories").shuffle(order)
    categories = max(1, round(n_products / _PER_CATEGORY))
    category = {pid: index % categories + 1 for index, pid in enumerate(order)}
    rng = random.Random(f"{seed}:mixed")
    products = []
    for pid in ids:
        drawn = draw_product(rng, pid, [(str(category[pid]), f"Aisle {category[pid]}")])
        kind = "js" if pattern.get(pid) == "app" else "plain"
        values = {f.name: getattr(drawn, f.name) for f in fields(drawn)}
        products.append(MixedProduct(**values | {"kind": kind}, pattern=pattern.get(pid, "shelf")))
    return tuple(products)


class MixedSite:
    """Serves the mixed products; counts the deal pages served, for their switch to JavaScript."""

    def __init__(
        self, products: Sequence[MixedProduct], page_size: int, switch_after: int = 0
    ) -> None:
        self._products = tuple(products)
        self._page_size = page_size
        self._switch_after = switch_after
        self._by_path = {p.url: p for p in self._products}
        self._by_id = {p.id: p for p in self._products}
        self._listings: dict[str, list[MixedProduct]] = {}
        for product in self._products:
            self._listings.setdefault(product.categories[0], []).append(product)
        self._listings = dict(sorted(self._listings.items(), key=lambda item: int(item[0])))
        self.switched = False
        self.deal_served = 0

    def product(self, product_id: int) -> MixedProduct | None:
        """The product with this id, or ``None``."""
        return self._by_id.get(product_id)

    def switch(self, on: bool) -> None:
        """Serve the deal pages with JavaScript only (*on*) or static again, from now on; off,
        the count towards ``switch_after`` starts over."""
        self.switched = on
        if not on:
            self.deal_served = 0

    def reset(self) -> None:
        """Back to the start: deal pages static, none served."""
        self.switch(False)

    def state(self) -> dict[str, object]:
        """``{"switched": bool, "deal_served": n}``."""
        return {"switched": self.switched, "deal_served": self.deal_served}

    def render(self, path: str, page: int | None, base_url: str) -> str | None:
        """HTML of the page at *path* (listings: page *page*, ``None`` if not a number), or
        ``None`` (a 404). A deal page served counts towards the switch."""
        if path == PREFIX:
            return self._root()
        if (match := _LISTING.fullmatch(path)) is not None:
            return self._listing(match.group(1), page)
        product = self._by_path.get(path)
        if product is None:
            return None
        if product.pattern == "deal":
            if self.switched:
                product = replace(product, kind="js")
            self.deal_served += 1
            if self._switch_after and self.deal_served >= self._switch_after:
                self.switched = True
        html = render_product(product, base_url)
        # render_product escapes every text it puts in the head: the first "</head>" is its end.
        return html.replace("</head>", _BEACON + "</head>", 1)

    def expected(self, base_url: str) -> dict[str, object]:
        """What a complete crawl stores, by absolute product URL, with the deal switch's state."""
        products = {
            base_url + p.url: {
                "name": p.name,
                "price": p.price,
                "currency": p.currency,
                "sku": p.sku,
                "availability": p.availability,
                "description": p.description,
                "pattern": p.pattern,
            }
            for p in self._products
        }
        return {"products": products, **self.state()}

    def _root(self) -> str:
        items = "".join(
            f'<li><a class="category-link" href="{PREFIX}category/{slug}?page=1">'
            f"Aisle {escape(slug)}</a></li>\n"
            for slug in self._listings
        )
        return _document("Aisles", f'<h1>Mixed aisles</h1>\n<ul class="categories">\n{items}</ul>')

    def _listing(self, slug: str, page: int | None) -> str | None:
        members = self._listings.get(slug)
        if members is None or page is None:
            return None
        pages = max(1, math.ceil(len(members) / self._page_size))
        if not 1 <= page <= pages:
            return None
        shown = members[(page - 1) * self._page_size : page * self._page_size]
        cards = "".join(
            f'<li><a class="product-link" href="{p.url}">{escape(p.name)}</a></li>\n' for p in shown
        )
        base = f"{PREFIX}category/{slug}"
        nav = []
        if page > 1:
            nav.append(f'<a rel="prev" class="prev" href="{base}?page={page - 1}">Previous</a>')
        nav.append(f'<span class="current">Page {page} of {pages}</span>')
        if page < pages:
            nav.append(f'<a rel="next" class="next" href="{base}?page={page + 1}">Next</a>')
        body = (
            f'<h1 class="category-name">Aisle {escape(slug)}</h1>\n'
            f'<ul class="products">\n{cards}</ul>\n'
            f'<nav class="pagination">{" ".join(nav)}</nav>'
        )
        return _document(f"Aisle {slug}, page {page}", body)


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)} | Fleet Mixed</title>\n{_BEACON}</head>\n<body>\n"
        f'<header><a class="home" href="{PREFIX}">Fleet Mixed</a></header>\n{body}\n'
        "</body>\n</html>\n"
    )
