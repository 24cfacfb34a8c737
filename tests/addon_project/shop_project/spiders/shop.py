"""The test shop's catalogue, crawled by a spider of this project."""

from spiders.products import ProductsSpider


class ShopSpider(ProductsSpider):
    name = "shop"
