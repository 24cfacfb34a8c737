"""robots.txt names the sitemap index; its children list every article and every book."""

from __future__ import annotations

import asyncio
import gzip
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from protego import Protego
from scrapy import signals
from scrapy.spiders import SitemapSpider
from scrapy.utils.sitemap import Sitemap, sitemap_urls_from_robots
from scrapy.utils.test import get_crawler

from project.addon import FleetAddon
from spiders.products import ProductsSpider
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.http import Response

    from tests.fleet import KeySpace

CHILDREN = ["/sitemaps/articles-1.xml.gz", "/sitemaps/articles-2.xml", "/sitemaps/books.xml"]


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(20, seed=8, books=70, articles=25, robots_disallow=["/private"]) as server:
        yield server


def _entries(shop: ShopServer, path: str) -> tuple[str, list[dict[str, Any]]]:
    page = shop.fetch(path)
    assert page.status == 200
    body = gzip.decompress(page.body) if path.endswith(".gz") else page.body
    sitemap = Sitemap(body)
    return sitemap.type, list(sitemap)


def test_robots_txt_names_the_sitemap_index(shop: ShopServer) -> None:
    page = shop.fetch("/robots.txt")
    assert page.headers["content-type"] == "text/plain; charset=utf-8"
    assert list(sitemap_urls_from_robots(page.body, shop.url("/robots.txt"))) == [
        shop.url("/sitemap.xml")
    ]
    robots = Protego.parse(page.text)
    assert list(robots.sitemaps) == [shop.url("/sitemap.xml")]
    assert not robots.can_fetch(shop.url("/private"), "fleetcrawl"), "the rules still hold"
    assert robots.can_fetch(shop.url("/product/1"), "fleetcrawl")


def test_sitemap_urls_follow_the_host_asked_for(shop: ShopServer) -> None:
    page = shop.fetch("/sitemap.xml", headers={"Host": "shop.example:8080"})
    assert "<loc>http://shop.example:8080/sitemaps/books.xml</loc>" in page.text
    robots = shop.fetch("/robots.txt", headers={"Host": "shop.example:8080"}).text
    assert robots.endswith("\nSitemap: http://shop.example:8080/sitemap.xml\n")


def test_the_index_lists_a_gzip_child_and_plain_ones(shop: ShopServer) -> None:
    page = shop.fetch("/sitemap.xml")
    assert page.headers["content-type"] == "application/xml; charset=utf-8"
    kind, entries = _entries(shop, "/sitemap.xml")
    assert kind == "sitemapindex"
    assert [e["loc"] for e in entries] == [shop.url(path) for path in CHILDREN]
    assert all(e["lastmod"] for e in entries)

    gz = shop.fetch(CHILDREN[0])
    assert gz.headers["content-type"] == "application/gzip"
    assert "content-encoding" not in gz.headers, "a gzip file, not a gzip-encoded response"
    assert gz.body[:3] == b"\x1f\x8b\x08"
    for path in CHILDREN[1:]:
        assert shop.fetch(path).headers["content-type"] == "application/xml; charset=utf-8"


def test_the_children_list_every_article_and_book_with_lastmod(shop: ShopServer) -> None:
    catalogue = shop.catalogue()
    listed: dict[str, str] = {}
    for path in CHILDREN:
        kind, entries = _entries(shop, path)
        assert kind == "urlset"
        assert entries, f"{path} lists nothing"
        for entry in entries:
            assert entry["loc"] not in listed, "listed twice"
            listed[entry["loc"]] = entry["lastmod"]
    articles = {shop.url(a["url"]): a["published"] for a in catalogue["articles"]}
    books = {shop.url(b["url"]): b["lastmod"] for b in catalogue["books"]}
    assert listed == {**articles, **books}
    assert set(articles) == shop.article_urls()
    assert set(books) == shop.book_urls()
    _, first = _entries(shop, CHILDREN[0])
    assert [e["loc"] for e in first] == [shop.url(a["url"]) for a in catalogue["articles"][:13]]


def test_sitemaps_of_an_empty_site_are_valid() -> None:
    with ShopServer(5, books=0, articles=0) as server:
        for path in ["/sitemap.xml", *CHILDREN]:
            kind, entries = _entries(server, path)
            assert kind in ("sitemapindex", "urlset")
            assert (len(entries) == 3) == (kind == "sitemapindex")


@pytest.mark.parametrize("path", ["/sitemap.xml.gz", "/sitemaps/", "/sitemaps/articles-3.xml"])
def test_unknown_sitemaps_are_404(shop: ShopServer, path: str) -> None:
    assert shop.fetch(path).status == 404


class _BookSitemapSpider(SitemapSpider):
    """A stock SitemapSpider that knows only the site's address and what a book URL is like."""

    name = "book_sitemap"
    sitemap_rules = [(r"/books/book/", "parse_book")]

    def __init__(self, site: str, *args: Any, **kwargs: Any) -> None:
        self.sitemap_urls = [site + "/robots.txt"]
        super().__init__(*args, **kwargs)

    def parse_book(self, response: Response) -> Iterator[dict[str, Any]]:
        rows = {r.css("th::text").get(): r.css("td::text").get() for r in response.css("tr")}
        yield {"url": response.url, "title": response.css("h1::text").get(), "upc": rows["UPC"]}


def test_a_sitemap_spider_finds_every_book_from_robots_txt_alone(shop: ShopServer) -> None:
    shop.reset()
    crawler = get_crawler(_BookSitemapSpider, {"ADDONS": {}})
    items: list[dict[str, Any]] = []

    def collect(item: dict[str, Any]) -> None:
        items.append(item)

    crawler.signals.connect(collect, signal=signals.item_scraped)
    asyncio.run(crawler.crawl_async(site=shop.base_url))

    books = {shop.url(b["url"]): (b["title"], b["upc"]) for b in shop.catalogue()["books"]}
    assert {item["url"]: (item["title"], item["upc"]) for item in items} == books
    assert len(items) == 70
    stats = shop.stats()
    assert set(stats["book_hits"]) == {urlsplit(url).path for url in books}
    assert max(stats["hits"].values()) == 1
    assert stats["total"] == 70 + 1 + len(CHILDREN) + 1, "robots.txt, the index, its children"


def test_the_products_spider_fetches_only_the_shop(
    redis_url: str,
    redis_client: redis.Redis,
    keyspace: KeySpace,
    make_shop: Callable[..., ShopServer],
) -> None:
    """The Sitemap line and the new sections change nothing of a products crawl."""
    shop = make_shop(products=30)
    redis_client.lpush(keyspace.keys("products").start_urls, shop.url("/"))
    settings = {
        "ADDONS": {FleetAddon: 0},
        "REDIS_URL": redis_url,
        **keyspace.settings,
        "ROBOTSTXT_OBEY": True,
        "ITEM_PIPELINES": {
            "pipelines.validation.ValidationPipeline": None,
            "pipelines.mongo.MongoPipeline": None,
        },
        "FRONTIER_IDLE_GRACE": 0.3,
        "FRONTIER_MAINTENANCE_SECONDS": 0.2,
        "MONITOR_ENABLED": False,
    }
    crawler = get_crawler(ProductsSpider, settings)
    asyncio.run(crawler.crawl_async())

    hits = shop.stats()["hits"]
    assert crawler.stats.get_value("item_scraped_count") == 30
    assert hits["/robots.txt"] == 1
    paths = {urlsplit(path).path for path in hits}
    assert {p for p in paths if not p.startswith(("/category/", "/product/"))} == {
        "/",
        "/robots.txt",
    }
    assert max(hits.values()) == 1
