"""A plain Spider whose start() yields its start URL late: the pages of a seed pushed to Redis
link to that URL first."""

import asyncio

import scrapy


class BooksLateStartSpider(scrapy.Spider):
    name = "books_late_start"

    def __init__(self, *args, site="http://127.0.0.1", delay="2", **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{site}/books/"]
        self.delay = float(delay)

    async def start(self):
        await asyncio.sleep(self.delay)
        async for request in super().start():
            yield request

    def parse(self, response):
        for href in response.css("article h3 a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_book)
        yield from response.follow_all(css="aside a, li.next a")

    def parse_book(self, response):
        yield {"url": response.url, "title": response.css("h1::text").get()}
