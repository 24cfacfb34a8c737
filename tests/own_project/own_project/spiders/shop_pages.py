"""A plain Scrapy spider with the features spiders use: start_urls, follow_all, cb_kwargs,
an errback, and items of several types (a dataclass, an attrs class, a scrapy.Item)."""

from dataclasses import dataclass

import attrs
import scrapy


@dataclass
class ShopProduct:
    url: str
    name: str
    listing: str


@attrs.define
class ListingPage:
    url: str
    products: int


class FailedPage(scrapy.Item):
    url = scrapy.Field()
    error = scrapy.Field()


class ShopPagesSpider(scrapy.Spider):
    name = "shop_pages"

    def __init__(self, *args, site="http://127.0.0.1", **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{site}/"]

    def parse(self, response):
        yield from response.follow_all(css="a.category-link", callback=self.parse_listing)

    def parse_listing(self, response):
        products = response.css("a.product-link")
        yield ListingPage(url=response.url, products=len(products))
        yield from response.follow_all(
            products,
            callback=self.parse_product,
            errback=self.on_error,
            cb_kwargs={"listing": response.url},
        )
        yield from response.follow_all(css="a.next", callback=self.parse_listing)

    def parse_product(self, response, listing):
        yield ShopProduct(url=response.url, name=response.css("h1::text").get(), listing=listing)

    def on_error(self, failure):
        self.crawler.stats.inc_value("shop_pages/errback_calls")
        yield FailedPage(url=failure.request.url, error=type(failure.value).__name__)
