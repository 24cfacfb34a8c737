"""Crawl a shop's catalogue: categories -> listing pages -> product pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from project.frontier.spiders import FleetSpider
from project.items import ProductItem
from project.rendering.middleware import FALLBACK_META_KEY

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["ProductsSpider"]

#: Listing pages unlock many product pages, so the shared queue hands them out first.
LISTING_PRIORITY = 10
PRODUCT_PRIORITY = 0


def listing_url(url: str) -> str:
    """Canonical listing URL: only the ``page`` parameter matters."""
    parts = urlsplit(url)
    page = [(k, v) for k, v in parse_qsl(parts.query) if k == "page"] or [("page", "1")]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(page[:1]), ""))


def product_url(url: str) -> str:
    """Canonical product URL: a product page ignores its query and fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


class ProductsSpider(FleetSpider):
    """Walks every category and stores every product once, fleet-wide."""

    name = "products"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request | ProductItem]:
        """Seeds may be any page of the shop: route by what the page is."""
        path = urlsplit(response.url).path
        if path.startswith("/product/"):
            yield from self.parse_product(response)
        elif path.startswith("/category/"):
            yield from self.parse_listing(response)
        else:
            for href in response.css("a[href*='/category/']::attr(href)").getall():
                yield response.follow(
                    listing_url(response.urljoin(href)),
                    callback=self.parse_listing,
                    priority=LISTING_PRIORITY,
                )

    def parse_listing(self, response: Response) -> Iterator[Request]:
        for href in response.css("a.product-link::attr(href), a.related-link::attr(href)").getall():
            yield response.follow(
                product_url(response.urljoin(href)),
                callback=self.parse_product,
                priority=PRODUCT_PRIORITY,
            )
        for href in response.css(
            "a.next::attr(href), a.prev::attr(href), a.category-link::attr(href)"
        ).getall():
            yield response.follow(
                listing_url(response.urljoin(href)),
                callback=self.parse_listing,
                priority=LISTING_PRIORITY,
            )

    def parse_product(self, response: Response) -> Iterator[Request | ProductItem]:
        product = response.css(".product")
        if not product:
            if "playwright" in response.flags or response.meta.get(FALLBACK_META_KEY):
                self.crawler.stats.inc_value("products/no_product_markup")
                return
            # Built by JavaScript: fetch the page once more, through Chromium.
            self.crawler.stats.inc_value("playwright/fallback")
            yield response.follow(
                response.url,
                callback=self.parse_product,
                priority=PRODUCT_PRIORITY,
                dont_filter=True,
                meta={"playwright": True, FALLBACK_META_KEY: True},
            )
            return
        price = product.css(".price")
        yield ProductItem(
            url=response.url,
            canonical_url=response.css("link[rel=canonical]::attr(href)").get(),
            name=product.css(".product-name::text").get(),
            price=price.css("::text").get(default="") if price else None,
            currency=price.attrib.get("data-currency") if price else None,
            sku=product.css(".sku::text").get(),
            availability=product.css(".availability::text").get(),
            description=product.css(".description::text").get(),
            breadcrumb=product.css("ol.breadcrumb li a::text").getall(),
            image_urls=product.css("img.product-image::attr(src)").getall(),
            rendered="playwright" in response.flags,
        )
