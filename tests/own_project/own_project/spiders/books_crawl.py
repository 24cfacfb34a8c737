"""A RedisCrawlSpider the way scrapy-redis' example project writes one (mycrawler_redis.py)."""

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider


class BooksCrawler(RedisCrawlSpider):
    """Spider that reads urls from redis queue (books_crawl:start_urls)."""

    name = "books_crawl"
    redis_key = "books_crawl:start_urls"

    rules = (
        Rule(LinkExtractor(restrict_css="article.product_pod h3"), callback="parse_page"),
        # follow the genres and their next pages
        Rule(LinkExtractor(restrict_css=("aside.sidebar", "li.next")), follow=True),
    )

    def __init__(self, *args, **kwargs):
        # Dynamically define the allowed domains list.
        domain = kwargs.pop("domain", "")
        self.allowed_domains = filter(None, domain.split(","))
        super().__init__(*args, **kwargs)

    def parse_page(self, response):
        return {
            "name": response.css("h1::text").extract_first(),
            "url": response.url,
        }
