"""HTML of the test shop's pages, and the URL variants its listings link to."""

from __future__ import annotations

import base64
import json
import math
import random
import zlib
from html import escape
from typing import TYPE_CHECKING

from tests.site.catalogue import Product

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.site.catalogue import Catalogue, Category

__all__ = [
    "HOSTILE_PAGES",
    "LONG_URL_LENGTH",
    "PNG",
    "STRAY_PATHS",
    "category_pages",
    "hostile_hrefs",
    "hostile_page_parts",
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


#: The shop's own pages of the hostile mode (``--hostile``), by name; listings link each as a
#: product. None of them is a good product: a crawl that stores one has a hole.
HOSTILE_PAGES: dict[str, str] = {
    "huge": "/hostile/huge",  # a product page of --huge-bytes, streamed
    "retry-after-huge": "/hostile/retry-after-huge",  # 503 with Retry-After: 99999999999
    "retry-after-garbage": "/hostile/retry-after-garbage",  # 503 with Retry-After: soon
    "throttled": "/hostile/throttled",  # 429 without Retry-After, for ever
    "stall": "/hostile/stall",  # headers and a little body, then nothing for --stall-seconds
    "long-url": "/hostile/long-url/",  # linked only under a LONG_URL_LENGTH-character URL
}

#: Paths of the shop that only a client which misread a hostile link would ask for:
#: ``http:///nohost`` taken as a path on the page's own site, a port link sent to the shop.
STRAY_PATHS: tuple[str, ...] = ("/nohost", "/FLUSHALL", "/dev/zero", "/x")

#: Length of the over-long link; in the path, as the products spider drops query strings.
LONG_URL_LENGTH = 5000


def hostile_hrefs(ports: Sequence[int]) -> list[tuple[str, str]]:
    """``(css class, href)`` of the links a hostile listing carries before its products."""
    prefix = HOSTILE_PAGES["long-url"]
    elsewhere = [
        "file:///dev/zero",
        "ftp://127.0.0.1/x",
        "data:,hello",
        "javascript:alert(1)",
        *(f"http://127.0.0.1:{port}/FLUSHALL" for port in ports),
        "http://[::1/product/1",
        "http://shop:99999/",
        "http:///nohost",
        prefix + "x" * (LONG_URL_LENGTH - len(prefix)),
    ]
    # Both callbacks of the spider see the foreign links; the shop's own pages are products.
    links = [
        ("product-link" if index % 2 == 0 else "category-link", href)
        for index, href in enumerate(elsewhere)
    ]
    links += [("product-link", path) for name, path in HOSTILE_PAGES.items() if name != "long-url"]
    return links


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


def render_listing(
    catalogue: Catalogue,
    category: Category,
    page: int,
    page_size: int,
    hostile: Sequence[tuple[str, str]] = (),
) -> str:
    """One listing page of a category, with related products, pagination, and *hostile* links
    (``(css class, href)``) before everything else, so one bad link must cost only itself."""
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
    traps = "".join(
        f'<li><a class="{css_class}" href="{escape(href)}">Offer {i}</a></li>\n'
        for i, (css_class, href) in enumerate(hostile)
    )
    body = (
        f'<h1 class="category-name">{escape(category.name)}</h1>\n'
        + (f'<ul class="hostile">\n{traps}</ul>\n' if hostile else "")
        + f'<ul class="products">\n{cards}</ul>\n'
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
    """2-3 products that are not in ``category``, stable for one listing page (and across
    epochs: drawn from the ids of epoch 0, the removed ones passed over)."""
    rng = random.Random(_pick(catalogue.seed, "related", category.slug, page))
    wanted = rng.randint(2, 3)
    span = catalogue.base_products or len(catalogue.products)
    found: list[int] = []
    for _ in range(20 * wanted):
        # Epoch 0's ids are 1..n in order: the same draw as indexing its products.
        candidate = catalogue.product(rng.randrange(span) + 1) if span else None
        if (
            candidate is not None
            and category.slug not in candidate.categories
            and candidate.id not in found
        ):
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
    head += _product_json_ld(product, base_url)
    return _document(product.name, f'<div id="app">\n{_product_markup(product)}</div>', head)


#: schema.org's names for the catalogue's stock statuses.
_SCHEMA_AVAILABILITY: dict[str, str] = {
    "in stock": "https://schema.org/InStock",
    "out of stock": "https://schema.org/OutOfStock",
}


def _product_json_ld(product: Product, base_url: str) -> str:
    """schema.org ``Product`` and ``BreadcrumbList`` scripts: the same data as the markup (a
    malformed product's offer has the same missing or garbage price as its page)."""
    url = base_url + product.url
    offer: dict[str, object] = {"@type": "Offer", "url": url}
    if product.page_price is not None:
        offer["price"] = product.page_price
    offer["priceCurrency"] = product.currency
    offer["availability"] = _SCHEMA_AVAILABILITY[product.availability]
    data = {
        "@context": "https://schema.org",
        "@type": "Product",
        "name": product.name,
        "sku": product.sku,
        "description": product.description,
        "image": [base_url + src for src in product.images],
        "url": url,
        "offers": offer,
    }
    crumbs = {
        "@context": "https://schema.org",
        "@type": "BreadcrumbList",
        "itemListElement": [
            {"@type": "ListItem", "position": i, "name": c["name"], "item": base_url + c["href"]}
            for i, c in enumerate(_breadcrumb(product), start=1)
        ],
    }
    return "".join(
        f'<script type="application/ld+json">{_script_json(block)}</script>\n'
        for block in (data, crumbs)
    )


def _script_json(data: object) -> str:
    # "<" escaped, so no text of the product can close the script element.
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")


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
        {"name": category, "href": product.listing_url},
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


def render_robots(
    crawl_delay: float | None, disallow: list[str], sitemap: str | None = None
) -> str:
    """robots.txt for every user agent; without options it allows everything. *sitemap* is
    the absolute URL of the sitemap index, named on a ``Sitemap:`` line after a blank one."""
    lines = ["User-agent: *"]
    if crawl_delay is not None:
        lines.append(f"Crawl-delay: {crawl_delay:g}")
    lines.extend(f"Disallow: {path}" for path in disallow)
    if not disallow:
        lines.append("Disallow:")
    if sitemap is not None:
        lines += ["", f"Sitemap: {sitemap}"]
    return "\n".join(lines) + "\n"


def render_error(status: int, message: str) -> str:
    """Small error page."""
    return _document(message, f'<h1 class="error">{status} {escape(message)}</h1>')


def hostile_page_parts(name: str, base_url: str) -> tuple[bytes, bytes]:
    """A hostile page (``huge``, ``stall``) as the HTML before and after where the shop pads
    or stalls it; the product comes after, so only a page downloaded whole would show it."""
    path = HOSTILE_PAGES[name]
    product = Product(
        id=0,
        name=f"Hostile {name} page",
        price="1.00",
        currency="EUR",
        sku=f"HOSTILE-{name.upper()}",
        availability="in stock",
        description="A crawl must never store this product.",
        breadcrumb=("Home", "Hostile"),
        images=(),
        categories=("hostile",),
        page_price="1.00",
    )
    head = f'<link rel="canonical" href="{escape(base_url)}{path}">\n'
    html = _document(product.name, f'<div id="app">\n{_product_markup(product)}</div>', head)
    split = html.index("<body>\n") + len("<body>\n")
    return html[:split].encode(), html[split:].encode()
