"""The example spiders (spiders/schemaorg.py, catalogue_api.py, articles.py) crawl the test site.

Each runs in this process on Scrapy's own scheduler, without the fleet add-on, as a user
would run a stock spider; the schema.org spider takes its seed from Redis, as scrapy-redis
spiders do. Their callbacks are also fed hostile answers directly.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from scrapy import signals
from scrapy.http import HtmlResponse, JsonRequest, Request, TextResponse
from scrapy.utils.test import get_crawler

from project.items import ProductItem
from spiders.articles import ArticleItem, ArticleSitemapSpider, ArticlesSpider
from spiders.catalogue_api import CatalogueApiSpider
from spiders.schemaorg import SchemaOrgProductsSpider
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from tests.fleet import KeySpace

# Stock Scrapy: no fleet add-on, Scrapy's scheduler and dupefilter, no pipelines.
STOCK: dict[str, Any] = {"ADDONS": {}, "LOG_LEVEL": "INFO"}
_SCHEMA_AVAILABILITY = {
    "in stock": "https://schema.org/InStock",
    "out of stock": "https://schema.org/OutOfStock",
}


def _crawl(
    spidercls: type[Spider], settings: dict[str, Any] | None = None, **arguments: Any
) -> tuple[Crawler, list[Any]]:
    """Run one crawl in this process; the items it scraped, in order."""
    crawler = get_crawler(spidercls, {**STOCK, **(settings or {})})
    items: list[Any] = []

    def collect(item: Any) -> None:
        items.append(item)

    crawler.signals.connect(collect, signal=signals.item_scraped)
    asyncio.run(crawler.crawl_async(**arguments))
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert crawler.stats.get_value("log_count/ERROR") is None
    return crawler, items


def _spider(spidercls: type[Spider], **arguments: Any) -> Any:
    """A spider bound to a crawler (for its stats), to call its callbacks directly."""
    # A RedisSpider makes its Redis client at once; this one is never used, so never connects.
    crawler = get_crawler(spidercls, {**STOCK, "REDIS_URL": "redis://127.0.0.1:9/0"})
    return spidercls.from_crawler(crawler, **arguments)


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(
        80, seed=11, page_size=12, js_share=0.1, malformed_share=0.1, articles=35
    ) as server:
        yield server


@pytest.fixture(scope="module")
def catalogue(shop: ShopServer) -> dict[str, Any]:
    return shop.catalogue()


@pytest.fixture
def fresh_shop(shop: ShopServer) -> ShopServer:
    shop.reset()
    return shop


# -- schemaorg: a scrapy-redis RedisSpider ------------------------------------------------------


def test_schemaorg_spider_finds_every_product_with_schema_org_data_once(
    fresh_shop: ShopServer,
    catalogue: dict[str, Any],
    redis_url: str,
    redis_client: redis.Redis,
    keyspace: KeySpace,
) -> None:
    """Seeded with ``redis-cli lpush schemaorg:start_urls <shop>``; stock scheduler."""
    start_urls = keyspace.settings["REDIS_START_URLS_KEY"] % {"name": "schemaorg"}
    redis_client.lpush(start_urls, fresh_shop.url("/"))
    settings = {
        "REDIS_URL": redis_url,
        "REDIS_START_URLS_KEY": keyspace.settings["REDIS_START_URLS_KEY"],
        "MAX_IDLE_TIME_BEFORE_CLOSE": 1,
    }
    crawler, items = _crawl(SchemaOrgProductsSpider, settings)

    assert redis_client.llen(start_urls) == 0, "the seed was taken"
    assert all(isinstance(item, ProductItem) for item in items)
    by_url = {item.canonical_url: item for item in items}
    assert len(by_url) == len(items), "a product linked under several URLs is yielded once"
    with_data = [p for p in catalogue["products"] if p["kind"] != "js"]
    assert set(by_url) == {fresh_shop.url(p["url"]) for p in with_data}
    for product in with_data:
        item = by_url[fresh_shop.url(product["url"])]
        assert urlsplit(item.url).path == product["url"]
        assert (item.name, item.sku, item.currency, item.description) == (
            product["name"],
            product["sku"],
            product["currency"],
            product["description"],
        )
        assert item.price == (product["page_price"] or None)  # a malformed page's garbage too
        assert item.availability == _SCHEMA_AVAILABILITY[product["availability"]]
        assert item.image_urls == [fresh_shop.url(src) for src in product["images"]]
        assert item.breadcrumb == product["breadcrumb"]
    hits = fresh_shop.stats()["hits"]
    assert set(fresh_shop.stats()["product_hits"]) == {str(p["id"]) for p in catalogue["products"]}
    assert not [path for path in hits if "utm_" in path], "tracking parameters are left out"
    assert not [path for path in hits if path.startswith("/img/")], "images are not fetched"
    assert crawler.stats.get_value("schemaorg/bad_data") is None


def _html(url: str, body: str) -> HtmlResponse:
    return HtmlResponse(url, body=body.encode(), encoding="utf-8", request=Request(url))


def _ld(*blocks: object) -> str:
    scripts = "".join(
        f'<script type="application/ld+json">{b if isinstance(b, str) else json.dumps(b)}</script>'
        for b in blocks
    )
    return f"<html><head>{scripts}</head><body><a href='/next'>next</a></body></html>"


@pytest.mark.parametrize(
    "body",
    [
        _ld('{"@type": "Product", "name": '),
        _ld("[" * 5000 + "]" * 5000),
        _ld('{"@type": "Product", "sku": 1' + "0" * 5000 + "}"),
        _ld(""),
        "",
    ],
    ids=["truncated", "deep", "long-number", "empty-script", "empty-page"],
)
def test_schemaorg_bad_data_costs_only_its_page(body: str) -> None:
    spider = _spider(SchemaOrgProductsSpider)
    response = _html("http://shop.test/p", body)
    output = list(spider.parse(response))
    assert not [o for o in output if isinstance(o, ProductItem)]
    assert spider.crawler.stats.get_value("schemaorg/bad_data") == 1
    if body:
        assert [o.url for o in output] == ["http://shop.test/next"], "its links are followed"


def test_schemaorg_reads_graphs_offer_lists_and_microdata() -> None:
    spider = _spider(SchemaOrgProductsSpider)
    graph = {
        "@context": "https://schema.org",
        "@graph": [
            {"@type": "WebPage", "name": "Page"},
            {
                "@type": ["Product", "Thing"],
                "name": " Lamp ",
                "sku": 42,
                "image": [{"@type": "ImageObject", "url": "/a.jpg"}, "b.jpg"],
                "offers": [
                    {
                        "@type": "AggregateOffer",
                        "lowPrice": 9.5,
                        "priceCurrency": "EUR",
                        "availability": "http://schema.org/InStock",
                    }
                ],
            },
        ],
    }
    item = spider.parse_product(_html("http://shop.test/lamp?x=1", _ld(graph)))
    assert item == ProductItem(
        url="http://shop.test/lamp?x=1",
        canonical_url="http://shop.test/lamp?x=1",
        name="Lamp",
        price="9.5",
        currency="EUR",
        sku="42",
        availability="http://schema.org/InStock",
        image_urls=["http://shop.test/a.jpg", "http://shop.test/b.jpg"],
    )
    microdata = """<html><head><link rel="canonical" href="/chair"></head><body>
      <div itemscope itemtype="https://schema.org/Product"><h1 itemprop="name">Chair</h1>
        <span itemprop="sku">C-1</span><img itemprop="image" src="/c.jpg">
        <div itemprop="offers" itemscope itemtype="https://schema.org/Offer">
          <span itemprop="priceSpecification" itemscope
                itemtype="https://schema.org/UnitPriceSpecification">
            <meta itemprop="price" content="12.00"><meta itemprop="priceCurrency" content="USD">
          </span>
          <link itemprop="availability" href="https://schema.org/OutOfStock"></div></div>
      <ol itemscope itemtype="https://schema.org/BreadcrumbList">
        <li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">
          <meta itemprop="position" content="2"><span itemprop="name">Chairs</span></li>
        <li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">
          <meta itemprop="position" content="1"><span itemprop="name">Home</span></li></ol>
    </body></html>"""
    item = spider.parse_product(_html("http://shop.test/chair?ref=1", microdata))
    assert item == ProductItem(
        url="http://shop.test/chair?ref=1",
        canonical_url="http://shop.test/chair",
        name="Chair",
        price="12.00",
        currency="USD",
        sku="C-1",
        availability="https://schema.org/OutOfStock",
        breadcrumb=["Home", "Chairs"],
        image_urls=["http://shop.test/c.jpg"],
    )


def test_schemaorg_takes_no_product_from_a_listing_of_several() -> None:
    spider = _spider(SchemaOrgProductsSpider)
    cards = [{"@type": "Product", "name": n, "url": f"/p/{n}"} for n in "abc"]
    assert spider.parse_product(_html("http://shop.test/list", _ld(*cards))) is None
    item = spider.parse_product(_html("http://shop.test/p/b", _ld(*cards)))
    assert item is not None
    assert item.name == "b", "unless one of them is the page's own"


def test_schemaorg_follows_only_html_links_of_the_seeds_site(
    make_shop: Callable[..., ShopServer],
) -> None:
    hostile = make_shop(products=10, hostile=True, hostile_ports=[6379, 9])
    category = hostile.catalogue()["categories"][0]
    page = hostile.fetch(category["url"])
    url = hostile.url(category["url"])
    response = HtmlResponse(url, body=page.body, request=Request(url))
    spider = _spider(SchemaOrgProductsSpider)
    site = urlsplit(url).netloc
    requests = [r for r in spider.parse(response, site=site) if isinstance(r, Request)]
    assert requests
    for request in requests:
        parts = urlsplit(request.url)
        assert (parts.scheme, parts.netloc, parts.fragment) == ("http", site, ""), request.url
        assert "utm_" not in parts.query
        assert request.cb_kwargs == {"site": site}
    assert not [r for r in requests if r.url.endswith("/nohost")], "http:///nohost is no link"
    assert spider.crawler.stats.get_value("schemaorg/bad_links") >= 2
    # Images and other files linked from a page are not fetched.
    files = _html(url, "<a href='/manual.pdf'>pdf</a><a href='/x.JPG'>jpg</a><a href='/p'>p</a>")
    assert [r.url for r in spider.parse(files, site=site)] == [hostile.url("/p")]


def test_schemaorg_ignores_what_is_not_html() -> None:
    spider = _spider(SchemaOrgProductsSpider)
    response = TextResponse("http://shop.test/a.json", body=b'{"@type": "Product"}')
    assert list(spider.parse(response)) == []


# -- catalogue_api: a plain Spider with start() -------------------------------------------------


def test_catalogue_api_spider_pages_every_category(
    fresh_shop: ShopServer, catalogue: dict[str, Any]
) -> None:
    crawler, items = _crawl(CatalogueApiSpider, api=fresh_shop.base_url)

    assert all(isinstance(item, ProductItem) for item in items)
    by_url = {item.url: item for item in items}
    assert len(by_url) == len(items), "each product once, though categories share some"
    assert set(by_url) == {fresh_shop.url(p["url"]) for p in catalogue["products"]}
    for product in catalogue["products"]:
        item = by_url[fresh_shop.url(product["url"])]
        assert item.canonical_url == item.url
        assert (item.name, item.price, item.currency, item.sku, item.availability) == (
            product["name"],
            product["price"],
            product["currency"],
            product["sku"],
            product["availability"],
        )
    api_hits = fresh_shop.stats()["api_hits"]
    pages = {f"{c['slug']}/{n}" for c in catalogue["categories"] for n in range(1, c["pages"] + 1)}
    assert api_hits == {"categories": 1, **dict.fromkeys(pages, 1)}
    memberships = sum(len(c["product_ids"]) for c in catalogue["categories"])
    assert crawler.stats.get_value("catalogue_api/duplicates") == memberships - len(items)
    assert fresh_shop.stats()["product_hits"] == {}, "no HTML page was fetched"


def test_catalogue_api_start_yields_the_categories_request() -> None:
    spider = _spider(CatalogueApiSpider, api="http://api.test:8000/")

    async def first() -> list[Any]:
        return [request async for request in spider.start()]

    (request,) = asyncio.run(first())
    assert isinstance(request, JsonRequest)
    assert (request.method, request.url) == ("GET", "http://api.test:8000/api/categories")


@pytest.mark.parametrize("api", [None, "", "api.test", "ftp://api.test", "http://"])
def test_catalogue_api_needs_an_api_url(api: str | None) -> None:
    with pytest.raises(ValueError, match="-a api="):
        CatalogueApiSpider(api=api)


def _json(url: str, body: bytes) -> TextResponse:
    return TextResponse(url, body=body, encoding="utf-8", request=Request(url))


def test_catalogue_api_requests_carry_the_category() -> None:
    spider = _spider(CatalogueApiSpider, api="http://api.test")
    body = {"categories": [{"slug": "lamps", "url": "/api/products"}]}
    answer = _json("http://api.test/api/categories", json.dumps(body).encode())
    (request,) = spider.parse_categories(answer)
    assert (request.method, request.url) == ("POST", "http://api.test/api/products")
    assert json.loads(request.body) == {"category": "lamps", "page": 1}
    assert request.cb_kwargs == {"category": "lamps"}
    page = {"products": [], "page": 1, "pages": 2, "next": {"category": "lamps", "page": 2}}
    answer = _json(request.url, json.dumps(page).encode())
    (following,) = spider.parse_products(answer, category="lamps")
    assert json.loads(following.body) == {"category": "lamps", "page": 2}
    assert following.cb_kwargs == {"category": "lamps"}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[" * 5000 + b"]" * 5000,
        b"[]",
        b'{"products": "none"}',
        b'{"products": [7, {"id": 1}, {"url": 3}]}',
        b'{"products": [{"id": 1, "url": "/p/1", "price": [1]}], "next": "page 2"}',
    ],
    ids=["garbage", "deep", "list", "not-a-list", "bad-products", "odd-values"],
)
def test_catalogue_api_bad_answers_cost_only_themselves(body: bytes) -> None:
    spider = _spider(CatalogueApiSpider, api="http://api.test")
    output = list(spider.parse_products(_json("http://api.test/api/products", body), category="x"))
    stats = spider.crawler.stats
    bad = (stats.get_value("catalogue_api/bad_payload") or 0) + (
        stats.get_value("catalogue_api/bad_products") or 0
    )
    if output:
        url = "http://api.test/p/1"
        assert output == [ProductItem(url=url, canonical_url=url)]
    else:
        assert bad >= 1
    assert list(spider.parse_categories(_json("http://api.test/api/categories", body))) == []


# -- articles: a CrawlSpider and a SitemapSpider ------------------------------------------------


def _expected_articles(shop: ShopServer, catalogue: dict[str, Any]) -> dict[str, ArticleItem]:
    return {
        shop.url(a["url"]): ArticleItem(
            url=shop.url(a["url"]),
            title=a["title"],
            author=a["author"],
            published=a["published"],
            tags=a["tags"],
            body=a["body"],
        )
        for a in catalogue["articles"]
    }


def test_articles_crawl_spider_follows_listings_and_tags_to_every_article(
    fresh_shop: ShopServer, catalogue: dict[str, Any]
) -> None:
    _, items = _crawl(ArticlesSpider, site=fresh_shop.base_url)

    assert all(isinstance(item, ArticleItem) for item in items)
    assert len(items) == len(catalogue["articles"]) == 35
    assert {item.url: item for item in items} == _expected_articles(fresh_shop, catalogue)
    stats = fresh_shop.stats()
    assert set(stats["article_hits"]) == {a["url"] for a in catalogue["articles"]}
    assert max(stats["hits"].values()) == 1, "no page fetched twice"
    assert {f"/articles/tag/{t['slug']}/" for t in catalogue["tags"]} <= set(stats["hits"])
    assert not [p for p in stats["hits"] if not p.startswith("/articles/")], "the site only"


def test_article_sitemap_spider_reads_robots_txt_and_both_sitemaps(
    fresh_shop: ShopServer, catalogue: dict[str, Any]
) -> None:
    _, items = _crawl(ArticleSitemapSpider, site=fresh_shop.base_url)

    assert len(items) == len(catalogue["articles"])
    assert {item.url: item for item in items} == _expected_articles(fresh_shop, catalogue)
    hits = fresh_shop.stats()["hits"]
    pages = {path for path in hits if not path.startswith("/articles/20")}
    assert pages == {
        "/robots.txt",
        "/sitemap.xml",
        "/sitemaps/articles-1.xml.gz",
        "/sitemaps/articles-2.xml",
    }, "no listing page, and not the books' sitemap"
    assert max(hits.values()) == 1


@pytest.mark.parametrize("spidercls", [ArticlesSpider, ArticleSitemapSpider])
@pytest.mark.parametrize("site", [None, "", "example.com", "file:///etc", "http://"])
def test_article_spiders_need_a_site(spidercls: type[Spider], site: str | None) -> None:
    with pytest.raises(ValueError, match="-a site="):
        spidercls(site=site)


@pytest.mark.parametrize("spidercls", [ArticlesSpider, ArticleSitemapSpider])
def test_article_spiders_take_the_site_argument(spidercls: type[Spider]) -> None:
    spider = _spider(spidercls, site="http://blog.test:8080/ignored/path")
    assert spider.allowed_domains == ["blog.test"]
    urls = getattr(spider, "start_urls", None) or spider.sitemap_urls
    expected = "/articles/" if spidercls is ArticlesSpider else "/robots.txt"
    assert urls == ["http://blog.test:8080" + expected]
