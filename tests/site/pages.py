"""HTML of the test shop's pages, and the URL variants its listings link to."""

from __future__ import annotations

import base64
import json
import math
import random
import zlib
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.site.catalogue import Catalogue, Category, Product

__all__ = [
    "PNG",
    "category_pages",
    "listing_href",
    "product_href",
    "render_error",
    "render_listing",
    "render_product",
    "render_robots",
    "render_root",
]

#: A 1x1 transparent PNG served for every product image.
PNG: bytes = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)

# The product page ignores query strings, so all of these show the same product.
_PRODUCT_VARIANTS: tuple[str, ...] = (
    "/product/{id}",
    "/product/{id}",
    "/product/{id}?utm_source=cat&utm_medium=list",
    "/product/{id}?a=1&b=2",
    "/product/{id}?b=2&a=1",
    "/product/{id}#reviews",
    "/product/{id}?ref={slug}",
)


def _pick(*parts: object) -> int:
    """Stable pseudo-random number for a tuple of values (no global state, no hash seed)."""
    return zlib.crc32(":".join(map(str, parts)).encode())


def product_href(seed: int, slug: str, product_id: int, context: str = "list") -> str:
    """Relative URL (one of several variants) under which a listing links a product."""
    template = _PRODUCT_VARIANTS[_pick(seed, context, slug, product_id) % len(_PRODUCT_VARIANTS)]
    return template.format(id=product_id, slug=slug)


def listing_href(seed: int, slug: str, context: str) -> str:
    """Relative URL of a category's first page, sometimes with tracking parameters."""
    variant = _pick(seed, context, slug) % 4
    if variant == 0:
        return f"/category/{slug}?page=1&utm_source={context}"
    if variant == 1 and context != "nav":
        return f"/category/{slug}?utm_source={context}&page=1"
    return f"/category/{slug}?page=1"


def category_pages(category: Category, page_size: int) -> int:
    """Number of listing pages of a category (an empty category still has page 1)."""
    return max(1, math.ceil(len(category.product_ids) / page_size))


def _document(title: str, body: str, head: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)} | Fleet Shop</title>\n{head}</head>\n<body>\n"
        f'<header><a class="home" href="/">Fleet Shop</a></header>\n{body}\n</body>\n</html>\n'
    )


def render_root(catalogue: Catalogue) -> str:
    """Home page linking the first listing page of every category."""
    links = ((listing_href(catalogue.seed, c.slug, "nav"), c.name) for c in catalogue.categories)
    items = "".join(
        f'<li><a class="category-link" href="{escape(href)}">{escape(name)}</a></li>\n'
        for href, name in links
    )
    return _document("Home", f'<h1>Fleet Shop</h1>\n<ul class="categories">\n{items}</ul>')


def render_listing(catalogue: Catalogue, category: Category, page: int, page_size: int) -> str:
    """One listing page of a category, with related products and pagination."""
    seed, slug = catalogue.seed, category.slug
    ids = category.product_ids[(page - 1) * page_size : page * page_size]
    cards = "".join(
        _product_link("product-link", product_href(seed, slug, pid), catalogue, pid) for pid in ids
    )
    related = "".join(
        _product_link("related-link", product_href(seed, slug, pid, "related"), catalogue, pid)
        for pid in _related_ids(catalogue, category, page)
    )
    pages = category_pages(category, page_size)
    nav = []
    if page > 1:
        nav.append(
            f'<a rel="prev" class="prev" href="/category/{slug}?page={page - 1}">Previous</a>'
        )
    nav.append(f'<span class="current">Page {page} of {pages}</span>')
    if page < pages:
        nav.append(f'<a rel="next" class="next" href="/category/{slug}?page={page + 1}">Next</a>')
    index = catalogue.categories.index(category)
    neighbour = catalogue.categories[(index + 1) % len(catalogue.categories)]
    see_also = escape(listing_href(seed, neighbour.slug, "see-also"))
    body = (
        f'<h1 class="category-name">{escape(category.name)}</h1>\n<ul class="products">\n{cards}</ul>\n'
        f'<aside class="related"><h2>You may also like</h2>\n<ul>\n{related}</ul></aside>\n'
        f'<nav class="pagination">{" ".join(nav)}</nav>\n'
        f'<p class="see-also">See also <a class="category-link" href="{see_also}">{escape(neighbour.name)}</a></p>'
    )
    return _document(f"{category.name}, page {page}", body)


def _product_link(css_class: str, href: str, catalogue: Catalogue, product_id: int) -> str:
    product = catalogue.product(product_id)
    name = product.name if product is not None else ""
    return f'<li><a class="{css_class}" href="{escape(href)}">{escape(name)}</a></li>\n'


def _related_ids(catalogue: Catalogue, category: Category, page: int) -> list[int]:
    """2-3 products that are not in ``category``, stable for one listing page."""
    rng = random.Random(_pick(catalogue.seed, "related", category.slug, page))
    wanted = rng.randint(2, 3)
    found: list[int] = []
    for _ in range(20 * wanted):
        candidate = catalogue.products[rng.randrange(len(catalogue.products))]
        if category.slug not in candidate.categories and candidate.id not in found:
            found.append(candidate.id)
            if len(found) == wanted:
                break
    return found


def render_product(product: Product, base_url: str) -> str:
    """Product page; "js" products carry their data only in an encoded script."""
    head = f'<link rel="canonical" href="{escape(base_url)}{product.url}">\n'
    if product.kind == "js":
        blob = base64.b64encode(json.dumps(_product_data(product)).encode("ascii")).decode("ascii")
        script = _JS_RENDERER.replace("BLOB", blob)
        body = f'<div id="app"></div>\n<script>\n{script}</script>'
        return _document("Loading...", body, head)
    return _document(product.name, f'<div id="app">\n{_product_markup(product)}</div>', head)


def _product_data(product: Product) -> dict[str, object]:
    return {
        "id": product.id,
        "name": product.name,
        "price": product.page_price,
        "currency": product.currency,
        "sku": product.sku,
        "availability": product.availability,
        "description": product.description,
        "breadcrumb": _breadcrumb(product),
        "images": list(product.images),
    }


def _breadcrumb(product: Product) -> list[dict[str, str]]:
    home, category = product.breadcrumb
    return [
        {"name": home, "href": "/"},
        {"name": category, "href": f"/category/{product.categories[0]}?page=1"},
    ]


def _product_markup(product: Product) -> str:
    parts = [f'<div class="product" data-product-id="{product.id}">']
    parts.append(f'<h1 class="product-name">{escape(product.name)}</h1>')
    if product.page_price is not None:
        parts.append(
            f'<span class="price" data-currency="{escape(product.currency)}">{escape(product.page_price)}</span>'
        )
    parts.append(f'<span class="sku">{escape(product.sku)}</span>')
    parts.append(f'<span class="availability">{escape(product.availability)}</span>')
    parts.append(f'<div class="description">{escape(product.description)}</div>')
    crumbs = "".join(
        f'<li><a href="{escape(c["href"])}">{escape(c["name"])}</a></li>'
        for c in _breadcrumb(product)
    )
    parts.append(f'<ol class="breadcrumb">{crumbs}</ol>')
    parts.extend(
        f'<img class="product-image" src="{escape(src)}" alt="">' for src in product.images
    )
    parts.append("</div>\n")
    return "\n".join(parts)


# Builds the same DOM as _product_markup; the data is base64 so only a JS engine sees the product.
_JS_RENDERER = """(function () {
  var d = JSON.parse(atob("BLOB"));
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = text; }
    return e;
  }
  var root = el("div", "product");
  root.setAttribute("data-product-id", String(d.id));
  root.appendChild(el("h1", "product-name", d.name));
  var price = el("span", "price", d.price);
  price.setAttribute("data-currency", d.currency);
  root.appendChild(price);
  root.appendChild(el("span", "sku", d.sku));
  root.appendChild(el("span", "availability", d.availability));
  root.appendChild(el("div", "description", d.description));
  var crumbs = el("ol", "breadcrumb");
  d.breadcrumb.forEach(function (c) {
    var li = el("li"), a = el("a", null, c.name);
    a.setAttribute("href", c.href);
    li.appendChild(a);
    crumbs.appendChild(li);
  });
  root.appendChild(crumbs);
  d.images.forEach(function (src) {
    var img = el("img", "product-image");
    img.setAttribute("src", src);
    img.setAttribute("alt", "");
    root.appendChild(img);
  });
  document.title = d.name + " | Fleet Shop";
  document.getElementById("app").appendChild(root);
})();
"""


def render_robots(crawl_delay: float | None, disallow: list[str]) -> str:
    """robots.txt for every user agent; without options it allows everything."""
    lines = ["User-agent: *"]
    if crawl_delay is not None:
        lines.append(f"Crawl-delay: {crawl_delay:g}")
    lines.extend(f"Disallow: {path}" for path in disallow)
    if not disallow:
        lines.append("Disallow:")
    return "\n".join(lines) + "\n"


def render_error(status: int, message: str) -> str:
    """Small error page."""
    return _document(message, f'<h1 class="error">{status} {escape(message)}</h1>')
