"""A plain spider that names its requests' download slot, as Scrapy lets a spider do."""

import scrapy


class BooksSlotSpider(scrapy.Spider):
    name = "books_slot"

    def __init__(self, *args, site="http://127.0.0.1", **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{site}/books/"]

    def parse(self, response):
        links = response.css("aside a::attr(href), li.next a::attr(href)").getall()
        yield from response.follow_all(links, meta={"download_slot": "book-shop"})
        books = response.css("article.product_pod h3 a::attr(href)").getall()
        yield from response.follow_all(
            books, callback=self.parse_book, meta={"download_slot": "book-shop"}
        )

    def parse_book(self, response):
        yield {"url": response.url, "title": response.css("h1::text").get()}
