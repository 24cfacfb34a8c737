"""A spider whose start() takes its time: the fleet must wait for it, and survive its node."""

import asyncio

import scrapy


class SlowStartSpider(scrapy.Spider):
    name = "slow_start"

    def __init__(self, *args, site="http://127.0.0.1", products="20", pause="0.3", **kwargs):
        super().__init__(*args, **kwargs)
        self.site, self.products, self.pause = site, int(products), float(pause)

    async def start(self):
        for product in range(1, self.products + 1):
            await asyncio.sleep(self.pause)
            yield scrapy.Request(f"{self.site}/product/{product}", callback=self.parse_product)

    def parse_product(self, response):
        yield {"url": response.url, "name": response.css("h1::text").get()}
