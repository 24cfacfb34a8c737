"""Generic product spider: any shop whose pages publish schema.org ``Product`` data.

It reads JSON-LD and microdata with extruct, yields one ``ProductItem`` per page that
describes a product, and follows every link on the seed's host; nothing in it is specific
to one site. It is a stock scrapy-redis ``RedisSpider``: seeds come from ``schemaorg:start_urls``
(``REDIS_START_URLS_KEY``), as plain URLs or scrapy-redis JSON seeds::

    scrapy crawl schemaorg                     # on every node of the fleet
    redis-cli lpush schemaorg:start_urls https://shop.example/

The products go to MongoDB's ``products`` collection through the fleet's validation. Without
the fleet, ``-s ADDONS={} -s MAX_IDLE_TIME_BEFORE_CLOSE=10 -O products.jsonl`` runs it on
Scrapy's own scheduler and scrapy-redis' seed reading (without ``MAX_IDLE_TIME_BEFORE_CLOSE`` it
waits for more seeds for ever, as scrapy-redis spiders do). A page whose schema.org data
cannot be read costs only itself (``schemaorg/bad_data``); its links are still followed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lxml.etree import LxmlError
from scrapy.http import HtmlResponse
from scrapy.linkextractors import IGNORED_EXTENSIONS
from scrapy.utils.response import get_base_url
from scrapy.utils.url import url_has_any_extension
from scrapy_redis.spiders import RedisSpider

from project.items import ProductItem

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["SchemaOrgProductsSpider"]

logger = logging.getLogger(__name__)

SYNTAXES = ["json-ld", "microdata"]
#: schema.org types read as a product (``Product`` and its subtypes).
PRODUCT_TYPES = frozenset({"Product", "IndividualProduct", "ProductModel", "ProductGroup"})
#: Query parameters that only say where a visitor came from: left out of followed links.
TRACKING_PARAMETERS = frozenset({"fbclid", "gclid", "msclkid", "mc_cid", "mc_eid"})
_SKIPPED_EXTENSIONS = frozenset("." + ext for ext in IGNORED_EXTENSIONS)
#: How deep into ``@graph`` and ``mainEntity`` a product is looked for.
_MAX_DEPTH = 4
#: At most this many values of a list-valued property are read (``image`` and the like).
_MAX_VALUES = 100
# What extruct raises on data it cannot read: bad or too deep JSON, an empty or odd document.
_BAD_DATA = (ValueError, RecursionError, LxmlError)


class SchemaOrgProductsSpider(RedisSpider):  # type: ignore[misc]
    """Follows every link of the seed's site and yields the products its pages describe."""

    name = "schemaorg"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Canonical URLs already yielded: a product linked under several URLs is yielded once.
        self._yielded: set[str] = set()

    def parse(
        self, response: Response, site: str | None = None, **kwargs: Any
    ) -> Iterator[Request | ProductItem]:
        """A page of the site: its product, if it has one, then its links."""
        if not isinstance(response, HtmlResponse):
            return
        site = site or urlsplit(response.url).netloc.lower()
        item = self.parse_product(response)
        if item is not None:
            yield item
        yield from response.follow_all(
            self._site_links(response, site), callback=self.parse, cb_kwargs={"site": site}
        )

    def parse_product(self, response: HtmlResponse) -> ProductItem | None:
        """The page's product, or ``None`` if it describes none (or several)."""
        # Imported here, not at the top: Scrapy's spider loader imports every module of
        # SPIDER_MODULES in every `scrapy crawl`, and extruct (with bs4, html5lib and rdflib)
        # takes about 0.2 s to import, which a node crawling another spider should not wait for.
        import extruct

        try:
            data = extruct.extract(
                response.text, base_url=get_base_url(response), syntaxes=SYNTAXES, uniform=True
            )
        except _BAD_DATA as exc:
            self.crawler.stats.inc_value("schemaorg/bad_data")
            logger.debug("Unreadable schema.org data on %s: %s", response.url, exc)
            return None
        canonical = _canonical(response)
        product = _pick_product(data, response, {response.url, canonical})
        if product is None:
            return None
        canonical = canonical or _absolute(response, _text(product.get("url"))) or response.url
        if canonical in self._yielded:
            self.crawler.stats.inc_value("schemaorg/duplicates")
            return None
        self._yielded.add(canonical)
        offer = _offer(product.get("offers"))
        images = (_absolute(response, url) for url in _image_urls(product.get("image")))
        return ProductItem(
            url=response.url,
            canonical_url=canonical,
            name=_text(product.get("name")),
            price=_text(offer.get("price", offer.get("lowPrice"))),
            currency=_text(offer.get("priceCurrency")),
            sku=_text(product.get("sku")),
            availability=_text(offer.get("availability")),
            description=_text(product.get("description")),
            breadcrumb=_breadcrumb(data),
            image_urls=[url for url in images if url],
        )

    def _site_links(self, response: HtmlResponse, site: str) -> list[str]:
        """Absolute URLs of the page's links on *site*, without fragments, tracking
        parameters or non-HTML files; a link that is not a URL costs only itself."""
        links: dict[str, None] = {}
        for href in response.css("a::attr(href)").getall():
            try:
                raw = urlsplit(href.strip())
                if raw.scheme in ("http", "https") and not raw.netloc:
                    # "http:///path" is no link, not a path on this site
                    raise ValueError(f"{href!r} has a scheme but no host")
                parts = urlsplit(response.urljoin(href.strip()))
                _ = parts.port  # a port out of range raises ValueError
            except ValueError:
                self.crawler.stats.inc_value("schemaorg/bad_links")
                continue
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != site:
                continue
            url = urlunsplit((parts.scheme, parts.netloc, parts.path, _untracked(parts.query), ""))
            if not url_has_any_extension(url, _SKIPPED_EXTENSIONS):
                links[url] = None
        return list(links)


def _untracked(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not k.startswith("utm_") and k not in TRACKING_PARAMETERS]
    return query if len(kept) == len(pairs) else urlencode(kept)


def _canonical(response: HtmlResponse) -> str | None:
    return _absolute(response, response.css("link[rel=canonical]::attr(href)").get())


def _absolute(response: HtmlResponse, url: str | None) -> str | None:
    if not url:
        return None
    try:
        return response.urljoin(url.strip())
    except ValueError:
        return None


def _types(node: dict[str, Any]) -> set[str]:
    """``@type`` without its vocabulary: ``"schema:Product"`` and ``"https://schema.org/Product"``
    are ``"Product"``."""
    value = node.get("@type")
    names = value[:_MAX_VALUES] if isinstance(value, list) else [value]
    return {n.rsplit("/", 1)[-1].rsplit(":", 1)[-1] for n in names if isinstance(n, str)}


def _nodes(values: Iterable[Any], depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every object of *values*, and those in their ``@graph`` and ``mainEntity``."""
    for value in values:
        if isinstance(value, list) and depth < _MAX_DEPTH:
            yield from _nodes(value[:_MAX_VALUES], depth + 1)
        elif isinstance(value, dict):
            yield value
            if depth < _MAX_DEPTH:
                nested = [value.get("@graph"), value.get("mainEntity")]
                yield from _nodes([v for v in nested if v is not None], depth + 1)


def _pick_product(
    data: dict[str, list[Any]], response: HtmlResponse, page_urls: set[str | None]
) -> dict[str, Any] | None:
    """The page's product: the only one in its JSON-LD (else microdata), or the one whose
    ``url`` is the page's; ``None`` for a listing of several."""
    for syntax in SYNTAXES:
        products = [n for n in _nodes(data.get(syntax, [])) if _types(n) & PRODUCT_TYPES]
        if len(products) == 1:
            return products[0]
        for product in products:
            if _absolute(response, _text(product.get("url"))) in page_urls:
                return product
        if products:
            return None
    return None


def _offer(value: Any) -> dict[str, Any]:
    """The first offer (of an ``AggregateOffer`` too), with its price specification's price
    and currency where it has none of its own."""
    for _ in range(_MAX_DEPTH):
        if isinstance(value, list):
            value = next((v for v in value[:_MAX_VALUES] if isinstance(v, dict)), None)
        elif isinstance(value, dict) and "offers" in value and "price" not in value:
            value = value["offers"]
        else:
            break
    if not isinstance(value, dict):
        return {}
    spec = value.get("priceSpecification")
    if isinstance(spec, list):
        spec = next((s for s in spec if isinstance(s, dict)), None)
    if isinstance(spec, dict):
        return {**{k: spec[k] for k in ("price", "priceCurrency") if k in spec}, **value}
    return value


def _text(value: Any) -> str | None:
    """A property's text: strings stripped, numbers as written, the first of a list, the
    ``@value`` or ``name`` of an object."""
    for _ in range(_MAX_DEPTH):
        if isinstance(value, list):
            value = value[0] if value else None
        elif isinstance(value, dict):
            value = value.get("@value", value.get("name"))
        else:
            break
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _image_urls(value: Any) -> list[str]:
    values = value[:_MAX_VALUES] if isinstance(value, list) else [value]
    urls = []
    for image in values:
        url = image.get("url", image.get("contentUrl")) if isinstance(image, dict) else image
        if isinstance(url, str) and url.strip():
            urls.append(url)
    return urls


def _breadcrumb(data: dict[str, list[Any]]) -> list[str]:
    """Names of the page's first ``BreadcrumbList``, in position order."""
    for syntax in SYNTAXES:
        for node in _nodes(data.get(syntax, [])):
            if "BreadcrumbList" in _types(node):
                elements = node.get("itemListElement")
                items = elements[:_MAX_VALUES] if isinstance(elements, list) else [elements]
                crumbs = sorted((i for i in items if isinstance(i, dict)), key=_position)
                names = (_text(c.get("name", c.get("item"))) for c in crumbs)
                return [name for name in names if name]
    return []


def _position(item: dict[str, Any]) -> int:
    """A list item's ``position`` (microdata gives it as text); unknown ones sort first."""
    value = _text(item.get("position"))
    return int(value) if value is not None and value.isdecimal() and len(value) < 10 else 0
