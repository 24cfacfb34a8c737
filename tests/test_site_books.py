"""The book site of the test shop, shaped like books.toscrape.com: genres, pages, books."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import pytest
from parsel import Selector

from tests.site.books import BOOKS_PER_PAGE, generate_library
from tests.site.config import parse_args
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(20, seed=6) as server:  # the default 300 books
        yield server


@pytest.fixture(scope="module")
def catalogue(shop: ShopServer) -> dict[str, Any]:
    return shop.catalogue()


def _page(shop: ShopServer, url: str) -> Selector:
    page = shop.fetch(url.removeprefix(shop.base_url))
    assert (page.status, page.headers["content-type"]) == (200, "text/html; charset=utf-8"), url
    return Selector(text=page.text)


def test_a_walk_of_the_index_genres_and_next_links_fetches_every_book_once(
    shop: ShopServer, catalogue: dict[str, Any]
) -> None:
    """What a books.toscrape.com spider does: index, each genre, ``li.next a``, each book."""
    shop.reset()
    index = shop.url("/books/")
    hrefs = _page(shop, index).css(".side_categories ul ul a::attr(href)").getall()
    genres = [urljoin(index, href) for href in hrefs]
    assert [g.removeprefix(shop.base_url) for g in genres] == [
        g["url"] for g in catalogue["genres"]
    ]
    books: list[str] = []
    for genre in genres:
        url: str | None = genre
        while url is not None:
            page = _page(shop, url)
            pods = page.css("article.product_pod")
            assert 1 <= len(pods) <= BOOKS_PER_PAGE
            books += [urljoin(url, h) for h in pods.css("h3 a::attr(href)").getall()]
            following = page.css("li.next a::attr(href)").get()
            url = urljoin(url, following) if following else None
    for book in books:
        _page(shop, book)
    assert len(catalogue["books"]) == 300
    assert sorted(books) == sorted(shop.book_urls())
    stats = shop.stats()
    assert max(stats["hits"].values()) == 1, "no page was fetched twice"
    assert set(stats["book_hits"]) == {b["url"] for b in catalogue["books"]}
    assert sum(g["pages"] for g in catalogue["genres"]) + 1 + 300 == stats["total"]


def test_genre_pages_have_20_books_and_pagers(shop: ShopServer, catalogue: dict[str, Any]) -> None:
    books = {b["id"]: b for b in catalogue["books"]}
    genre = next(g for g in catalogue["genres"] if g["pages"] >= 2)
    first = _page(shop, genre["url"])
    assert first.css("h1::text").get() == genre["name"]
    assert first.css("li.next a::attr(href)").get() == "page-2.html"
    assert first.css("li.previous") == []
    assert first.css("li.current::text").get() == f"Page 1 of {genre['pages']}"
    pods = first.css("article.product_pod")
    assert len(pods) == BOOKS_PER_PAGE
    for pod, book_id in zip(pods, genre["book_ids"], strict=False):
        book = books[book_id]
        link = pod.css("h3 a")
        assert link.attrib["title"] == book["title"]
        assert link.attrib["href"] == "../../book/" + book["url"].rsplit("/", 1)[1]
        assert pod.css("p.price_color::text").get() == book["price_text"]
    last = _page(shop, genre["url"].replace("page-1", f"page-{genre['pages']}"))
    assert last.css("li.next") == []
    assert last.css("li.previous a::attr(href)").get() == f"page-{genre['pages'] - 1}.html"


def test_book_pages_show_title_price_availability_and_upc(
    shop: ShopServer, catalogue: dict[str, Any]
) -> None:
    assert any(b["stock"] == 0 for b in catalogue["books"])
    assert any(not b["title"].isascii() for b in catalogue["books"])
    for book in catalogue["books"][:60]:
        page = _page(shop, book["url"])
        assert re.fullmatch(r"/books/book/[a-z0-9-]+_\d+\.html", book["url"])
        assert page.css(".product_main h1::text").get() == book["title"]
        assert page.css(".product_main p.price_color::text").get() == book["price_text"]
        assert re.fullmatch(r"£\d+\.\d\d", book["price_text"])
        availability = "".join(page.css(".product_main p.availability::text").getall()).strip()
        assert availability == book["availability"]
        rows = page.css("table tr")
        table = {row.css("th::text").get(): row.css("td::text").get() for row in rows}
        assert table["UPC"] == book["upc"]
        assert re.fullmatch(r"[0-9a-f]{16}", book["upc"])
        assert table["Availability"] == book["availability"]
        assert page.css("#product_description + p::text").get() == book["description"]
        crumbs = page.css("ul.breadcrumb a::attr(href)").getall()
        genre = urljoin(shop.url(book["url"]), crumbs[1])
        assert genre == shop.url(f"/books/genre/{book['genre']}/page-1.html")


@pytest.mark.parametrize(
    "path",
    [
        "/books",
        "/books/index.html",
        "/books/genre/nope/page-1.html",
        "/books/genre/GENRE/page-0.html",
        "/books/genre/GENRE/page-01.html",
        "/books/genre/GENRE/page-99.html",
        "/books/book/nope_1.html",
        "/books/book/BOOK_99999.html",
    ],
)
def test_unknown_book_paths_are_404(shop: ShopServer, catalogue: dict[str, Any], path: str) -> None:
    genre = catalogue["genres"][0]["slug"]
    book = catalogue["books"][0]["url"].rsplit("/", 1)[1].rsplit("_", 1)[0]
    assert shop.fetch(path.replace("GENRE", genre).replace("BOOK", book)).status == 404


def test_the_shop_does_not_link_the_book_site(shop: ShopServer, catalogue: dict[str, Any]) -> None:
    for path in ["/", catalogue["categories"][0]["url"], "/product/1"]:
        assert "/books/" not in shop.fetch(path).text


@pytest.mark.parametrize("count", [0, 1, 20, 21, 5000])
def test_library_shape(count: int) -> None:
    library = generate_library(count, seed=3)
    assert library == generate_library(count, seed=3)
    assert [b.id for b in library.books] == list(range(1, count + 1))
    listed = sorted(i for g in library.genres for i in g.book_ids)
    assert listed == list(range(1, count + 1)), "every book in exactly one genre"
    assert all(g.book_ids for g in library.genres) or count == 0
    assert len({b.url for b in library.books}) == count
    assert library.render("/books/") is not None


def test_book_count_option() -> None:
    assert parse_args([]).books == 300
    assert parse_args(["--books", "7"]).books == 7
