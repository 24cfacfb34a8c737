"""The article site of the test shop: listings with next links, tag pages, article pages."""

from __future__ import annotations

import re
from html import unescape
from typing import TYPE_CHECKING, Any

import pytest
from parsel import Selector

from tests.site.articles import ARTICLES_PER_PAGE, generate_journal
from tests.site.config import parse_args
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(20, seed=4, articles=45) as server:
        yield server


@pytest.fixture(scope="module")
def articles(shop: ShopServer) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = shop.catalogue()["articles"]
    return result


def _page(shop: ShopServer, path: str) -> Selector:
    page = shop.fetch(path)
    assert (page.status, page.headers["content-type"]) == (200, "text/html; charset=utf-8"), path
    return Selector(text=page.text)


def _walk(shop: ShopServer, start: str) -> tuple[list[str], list[str]]:
    """Article links of a listing and its following pages, and the listing pages seen."""
    found: list[str] = []
    listings: list[str] = []
    path: str | None = start
    while path is not None:
        listings.append(path)
        page = _page(shop, path)
        found += page.css("article.post-summary h2 a::attr(href)").getall()
        path = page.css("nav.pagination a.next::attr(href)").get()
    return found, listings


def test_listing_pages_link_every_article_newest_first(
    shop: ShopServer, articles: list[dict[str, Any]]
) -> None:
    found, listings = _walk(shop, "/articles/")
    assert found == [a["url"] for a in reversed(articles)]
    assert listings == ["/articles/", *(f"/articles/page/{n}/" for n in range(2, 6))]
    last = _page(shop, listings[-1])
    assert last.css("a.prev::attr(href)").get() == "/articles/page/4/"
    assert last.css(".current::text").get() == "Page 5 of 5"
    assert len(last.css("article.post-summary")) == 45 - 4 * ARTICLES_PER_PAGE


def test_tag_pages_list_their_articles(shop: ShopServer, articles: list[dict[str, Any]]) -> None:
    tags = shop.catalogue()["tags"]
    assert len(tags) >= 5
    cloud = _page(shop, "/articles/").css("aside.tags a[rel=tag]::attr(href)").getall()
    assert cloud == [t["url"] for t in tags]
    by_id = {a["id"]: a for a in articles}
    for tag in tags:
        found, listings = _walk(shop, tag["url"])
        assert found == [by_id[i]["url"] for i in tag["article_ids"]]
        assert all(tag["name"] in by_id[i]["tags"] for i in tag["article_ids"])
        assert len(listings) == -(-len(found) // ARTICLES_PER_PAGE)
    tagged = {i for t in tags for i in t["article_ids"]}
    assert tagged == set(by_id), "every article has a tag"


def test_article_pages_show_title_author_date_body_and_tags(
    shop: ShopServer, articles: list[dict[str, Any]]
) -> None:
    for article in articles:
        page = _page(shop, article["url"])
        post = page.css("article.post")
        assert post.attrib["data-article-id"] == str(article["id"])
        assert post.css("h1.entry-title::text").get() == article["title"]
        assert post.css(".byline .author::text").get() == article["author"]
        assert post.css("time.published::attr(datetime)").get() == article["published"]
        paragraphs = post.css(".entry-content p::text").getall()
        assert "\n\n".join(paragraphs) == article["body"]
        assert post.css("ul.tags a[rel=tag]::text").getall() == article["tags"]
        assert page.css("link[rel=canonical]::attr(href)").get() == article["url"]
    assert re.fullmatch(r"/articles/\d{4}/\d{2}/[a-z0-9-]+/", articles[0]["url"])
    assert len({a["url"] for a in articles}) == len(articles)


def test_articles_are_counted_by_path(shop: ShopServer, articles: list[dict[str, Any]]) -> None:
    shop.reset()
    shop.fetch(articles[0]["url"])
    shop.fetch(articles[0]["url"] + "?ref=x")
    shop.fetch("/articles/")
    stats = shop.stats()
    assert stats["article_hits"] == {articles[0]["url"]: 2}
    url = articles[0]["url"]
    assert stats["hits"] == {url: 1, url + "?ref=x": 1, "/articles/": 1}
    assert shop.article_urls() == {shop.url(a["url"]) for a in articles}


@pytest.mark.parametrize(
    "path",
    [
        "/articles",
        "/articles/page/1/",
        "/articles/page/01/",
        "/articles/page/6/",
        "/articles/page/x/",
        "/articles/tag/nope/",
        "/articles/tag/redis/page/99/",
        "/articles/2024/01/nope/",
    ],
)
def test_unknown_article_paths_are_404(shop: ShopServer, path: str) -> None:
    assert shop.fetch(path).status == 404


def test_the_shop_does_not_link_the_article_site(shop: ShopServer) -> None:
    for path in ["/", shop.catalogue()["categories"][0]["url"], "/product/1"]:
        assert "/articles/" not in shop.fetch(path).text


@pytest.mark.parametrize("count", [0, 1, 10, 11, 500])
def test_journal_shape(count: int) -> None:
    journal = generate_journal(count, seed=9)
    assert journal == generate_journal(count, seed=9)
    assert [a.id for a in journal.articles] == list(range(1, count + 1))
    times = [a.published for a in journal.articles]
    assert times == sorted(times)
    assert len({a.url for a in journal.articles}) == count
    for article in journal.articles:
        html = journal.render(article.url)
        assert html is not None
        assert unescape(article.title) in unescape(html)
    assert journal.render("/articles/") is not None, "an empty site still has its first page"


def test_article_count_option() -> None:
    assert parse_args([]).articles == 60
    assert parse_args(["--articles", "5"]).articles == 5
    with pytest.raises(SystemExit):
        parse_args(["--articles", "-1"])
