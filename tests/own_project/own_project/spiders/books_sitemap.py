"""A Scrapy SitemapSpider: the books come from the sitemaps its robots.txt names."""

from scrapy.spiders import SitemapSpider


class BooksSitemapSpider(SitemapSpider):
    name = "books_sitemap"
    sitemap_rules = [("/books/book/", "parse_book")]

    def __init__(self, *args, site="http://127.0.0.1", **kwargs):
        super().__init__(*args, **kwargs)
        self.sitemap_urls = [f"{site}/robots.txt"]

    def parse_book(self, response):
        yield {
            "url": response.url,
            "title": response.css("h1::text").get(),
            "price": response.css("p.price_color::text").get(),
        }
