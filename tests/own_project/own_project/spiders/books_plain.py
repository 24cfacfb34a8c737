"""A plain Scrapy CrawlSpider with start_urls: no Redis in it at all."""

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class BooksCrawlSpider(CrawlSpider):
    name = "books_plain"
    rules = (
        Rule(LinkExtractor(restrict_css="article.product_pod h3"), callback="parse_book"),
        Rule(LinkExtractor(restrict_css=("aside.sidebar", "li.next")), follow=True),
    )

    def __init__(self, *args, site="http://127.0.0.1", **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{site}/books/"]

    def parse_book(self, response):
        yield {
            "url": response.url,
            "title": response.css("h1::text").get(),
            "price": response.css("p.price_color::text").get(),
        }
