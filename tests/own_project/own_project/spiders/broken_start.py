"""A spider whose start() fails after three requests (and *pause* seconds): the fleet crawls
those and ends."""

import asyncio

import scrapy


class BrokenStartSpider(scrapy.Spider):
    name = "broken_start"

    def __init__(self, *args, site="http://127.0.0.1", pause="0", **kwargs):
        super().__init__(*args, **kwargs)
        self.site = site
        self.pause = float(pause)

    async def start(self):
        for product in (1, 2, 3):
            yield scrapy.Request(f"{self.site}/product/{product}", callback=self.parse_product)
        await asyncio.sleep(self.pause)
        raise RuntimeError("the product list went away")

    def parse_product(self, response):
        yield {"url": response.url}
