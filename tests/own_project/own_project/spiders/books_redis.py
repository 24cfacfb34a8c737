"""A spider written the way scrapy-redis' README writes one: a RedisSpider, a redis_key, dicts."""

from scrapy_redis.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "books"
    redis_key = "books:start_urls"

    def parse(self, response):
        links = response.css("aside.sidebar a::attr(href), li.next a::attr(href)")
        yield from response.follow_all(links.getall(), callback=self.parse)
        books = response.css("article.product_pod h3 a::attr(href)")
        yield from response.follow_all(books.getall(), callback=self.parse_book)

    def parse_book(self, response):
        yield {
            "url": response.url,
            "title": response.css("h1::text").get(),
            "price": response.css("p.price_color::text").get(),
            "upc": response.xpath("//th[text()='UPC']/following-sibling::td/text()").get(),
        }
