"""Crawl a shop's catalogue: categories -> listing pages -> product pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from project.frontier.meta import REVISIT_UNSURE_META_KEY
from project.frontier.spiders import FleetSpider
from project.items import ProductItem
from project.rendering.middleware import FALLBACK_META_KEY

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    #: Says how the page was fetched: adaptive rendering does not compare it.
    render_ignore_fields = ("rendered",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request | ProductItem]:
        """Seeds may be any page of the shop: route by what the page is."""
        path = urlsplit(response.url).path
        if path.startswith("/product/"):
            yield from self.parse_product(response)
        elif path.startswith("/category/"):
            yield from self.parse_listing(response)
        else:
            hrefs = response.css("a[href*='/category/']::attr(href)").getall()
            yield from self._follow(response, hrefs, listing_url, self.parse_listing)

    def parse_listing(self, response: Response) -> Iterator[Request]:
        products = response.css("a.product-link::attr(href), a.related-link::attr(href)")
        yield from self._follow(response, products.getall(), product_url, self.parse_product)
        listings = response.css(
            "a.next::attr(href), a.prev::attr(href), a.category-link::attr(href)"
        )
        yield from self._follow(response, listings.getall(), listing_url, self.parse_listing)

    def _follow(
        self,
        response: Response,
        hrefs: list[str],
        canonical: Callable[[str], str],
        callback: Callable[..., Any],
    ) -> Iterator[Request]:
        """A request per link; a link that is not a URL costs only itself."""
        priority = LISTING_PRIORITY if callback == self.parse_listing else PRODUCT_PRIORITY
        for href in hrefs:
            try:
                parts = urlsplit(href.strip())
                if parts.scheme and not parts.netloc:
                    # "http:///nohost" would resolve onto this page's own site
                    raise ValueError(f"{href!r} has a scheme but no host")
                yield response.follow(
                    canonical(response.urljoin(href)), callback=callback, priority=priority
                )
            except ValueError:
                self.crawler.stats.inc_value("products/bad_links")
                self.logger.debug("Not a link on %s: %r", response.url, href[:200])

    def parse_product(self, response: Response) -> Iterator[Request | ProductItem]:
        product = response.css(".product")
        if not product:
            if "playwright" in response.flags or response.meta.get(FALLBACK_META_KEY):
                self.crawler.stats.inc_value("products/no_product_markup")
                response.meta[REVISIT_UNSURE_META_KEY] = True  # not read: nothing is gone
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
