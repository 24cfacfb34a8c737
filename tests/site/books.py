"""The book site under ``/books/``, shaped like books.toscrape.com: genres, pages, books.

``/books/`` links every genre; ``/books/genre/<slug>/page-<n>.html`` shows
:data:`BOOKS_PER_PAGE` books with an ``li.next a`` link; ``/books/book/<slug>_<id>.html`` is a
book (``h1``, ``p.price_color``, availability, UPC in a table). Links are relative, as there.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from dataclasses import dataclass, field
from html import escape

from tests.site.words import paragraph, slug

__all__ = ["BOOKS_PER_PAGE", "Book", "Genre", "Library", "generate_library"]

BOOKS_PER_PAGE = 20
#: Titles longer than this are cut in genre listings (the ``title`` attribute has them whole).
_SHORT_TITLE = 30
_GENRE_PAGE = re.compile(r"/books/genre/([a-z0-9_-]+)/page-(\d+)\.html")
_RATINGS: tuple[str, ...] = ("One", "Two", "Three", "Four", "Five")
_GENRE_NAMES: tuple[str, ...] = (
    "Travel", "Mystery", "Historical Fiction", "Sequential Art", "Classics", "Philosophy",
    "Romance", "Womens Fiction", "Fiction", "Childrens", "Religion", "Nonfiction", "Music",
    "Science Fiction", "Sports and Games", "Fantasy", "Poetry", "Horror", "Humor", "Self Help",
)  # fmt: skip
_TITLE_PATTERNS: tuple[str, ...] = (
    "The {adj} {noun}", "{noun} of {place}", "A {noun} in {place}", "The {noun}'s Daughter",
    "{adj} {noun}s", "Letters from {place}", "The {noun} & the {other}", "Notes on a {adj} {noun}",
)  # fmt: skip
_TITLE_ADJECTIVES: tuple[str, ...] = (
    "Silent", "Velvet", "Midnight", "Hidden", "Last", "Crimson", "Wandering", "Forgotten",
    "Golden", "Quiet", "Broken", "Secret", "Paper", "Electric",
)  # fmt: skip
_TITLE_NOUNS: tuple[str, ...] = (
    "Attic", "Garden", "River", "Orchard", "Lighthouse", "Cartographer", "Clockmaker", "Harbour",
    "Library", "Stranger", "Winter", "Compass", "Beekeeper", "Archive",
)  # fmt: skip
_PLACES: tuple[str, ...] = (
    "Lisbon", "the North", "Kyoto", "Zürich", "São Paulo", "the Sea", "Montréal", "the Moors",
)  # fmt: skip
_BLURBS: tuple[str, ...] = (
    "A sweeping story of love & loss across three generations.",
    'Critics called it "impossible to put down".',
    "The author's most personal book yet.",
    "Funny, sharp and surprisingly tender.",
    "A quiet masterpiece about memory and place.",
    "Now a major television series.",
    "Part mystery, part love letter to a vanished city.",
    "Winner of the Fleet Prize for debut fiction.",
)
_FIRST_LASTMOD = dt.date(2023, 1, 2)


@dataclass(frozen=True)
class Book:
    """Ground truth for one book page."""

    id: int
    title: str
    genre: str
    price: str
    stock: int
    rating: str
    upc: str
    description: str
    lastmod: str

    @property
    def url(self) -> str:
        """Relative URL of the book page."""
        return f"/books/book/{slug(self.title)}_{self.id}.html"

    @property
    def price_text(self) -> str:
        """The price as the page shows it."""
        return f"£{self.price}"

    @property
    def availability(self) -> str:
        """Stock text of the book page."""
        return f"In stock ({self.stock} available)" if self.stock else "Out of stock"

    def as_dict(self) -> dict[str, object]:
        """JSON-ready ground truth, as in ``/_catalogue``."""
        return {
            "id": self.id,
            "url": self.url,
            "title": self.title,
            "genre": self.genre,
            "price": self.price,
            "price_text": self.price_text,
            "currency": "GBP",
            "availability": self.availability,
            "stock": self.stock,
            "rating": self.rating,
            "upc": self.upc,
            "description": self.description,
            "lastmod": self.lastmod,
        }


@dataclass(frozen=True)
class Genre:
    """A genre: its pages list ``book_ids`` in ascending order."""

    slug: str
    name: str
    book_ids: tuple[int, ...]

    @property
    def pages(self) -> int:
        """Number of genre pages (an empty genre still has page 1)."""
        return max(1, math.ceil(len(self.book_ids) / BOOKS_PER_PAGE))

    def page_url(self, page: int) -> str:
        """Relative URL of one of its pages."""
        return f"/books/genre/{self.slug}/page-{page}.html"


@dataclass(frozen=True)
class Library:
    """The books and genres of the book site."""

    books: tuple[Book, ...]
    genres: tuple[Genre, ...]
    _by_url: dict[str, Book] = field(init=False, repr=False, compare=False)
    _by_slug: dict[str, Genre] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_url", {b.url: b for b in self.books})
        object.__setattr__(self, "_by_slug", {g.slug: g for g in self.genres})

    def book_at(self, path: str) -> Book | None:
        """The book whose page is *path*, or ``None``."""
        return self._by_url.get(path)

    def render(self, path: str) -> str | None:
        """HTML of the book site's page at *path*, or ``None`` (a 404)."""
        if path == "/books/":
            return self._index()
        if (book := self._by_url.get(path)) is not None:
            return self._book(book)
        match = _GENRE_PAGE.fullmatch(path)
        genre = self._by_slug.get(match.group(1)) if match else None
        if match and genre is not None and str(page := int(match.group(2))) == match.group(2):
            return self._genre(genre, page) if 1 <= page <= genre.pages else None
        return None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready ground truth, as in ``/_catalogue``."""
        genres = [
            {
                "slug": g.slug,
                "name": g.name,
                "url": g.page_url(1),
                "pages": g.pages,
                "book_ids": list(g.book_ids),
            }
            for g in self.genres
        ]
        return {"books": [b.as_dict() for b in self.books], "genres": genres}

    def _sidebar(self, prefix: str) -> str:
        items = "".join(
            f'<li><a href="{prefix}genre/{g.slug}/page-1.html">{escape(g.name)}</a></li>\n'
            for g in self.genres
        )
        return (
            '<aside class="sidebar"><div class="side_categories"><ul class="nav nav-list">\n'
            f'<li><a href="{prefix or "./"}">Books</a>\n<ul>\n{items}</ul></li></ul>'
            "</div></aside>\n"
        )

    def _index(self) -> str:
        body = (
            '<ul class="breadcrumb"><li class="active">Home</li></ul>\n'
            + self._sidebar("")
            + '<section><div class="alert alert-warning">A demo book shop for crawlers.</div>\n'
            f"<p><strong>{len(self.books)}</strong> results.</p></section>"
        )
        return _document("All products", body, home="./")

    def _genre(self, genre: Genre, page: int) -> str:
        ids = genre.book_ids[(page - 1) * BOOKS_PER_PAGE : page * BOOKS_PER_PAGE]
        pods = "".join(_pod(self.books[book_id - 1]) for book_id in ids)
        pager = []
        if page > 1:
            pager.append(f'<li class="previous"><a href="page-{page - 1}.html">previous</a></li>')
        pager.append(f'<li class="current">Page {page} of {genre.pages}</li>')
        if page < genre.pages:
            pager.append(f'<li class="next"><a href="page-{page + 1}.html">next</a></li>')
        first = (page - 1) * BOOKS_PER_PAGE + 1 if ids else 0
        body = (
            '<ul class="breadcrumb"><li><a href="../../">Home</a></li>'
            f'<li class="active">{escape(genre.name)}</li></ul>\n'
            + self._sidebar("../../")
            + f'<section><div class="page-header action"><h1>{escape(genre.name)}</h1></div>\n'
            f"<p><strong>{len(genre.book_ids)}</strong> results - showing <strong>{first}"
            f"</strong> to <strong>{first + len(ids) - 1 if ids else 0}</strong>.</p>\n"
            f'<ol class="row">\n{pods}</ol>\n<ul class="pager">{"".join(pager)}</ul></section>'
        )
        return _document(f"{genre.name}, page {page}", body, home="../../")

    def _book(self, book: Book) -> str:
        genre = self._by_slug[book.genre]
        stock_class = "instock" if book.stock else "outofstock"
        rows = (
            ("UPC", book.upc),
            ("Product Type", "Books"),
            ("Price (excl. tax)", book.price_text),
            ("Price (incl. tax)", book.price_text),
            ("Tax", "£0.00"),
            ("Availability", book.availability),
            ("Number of reviews", "0"),
        )
        table = "".join(f"<tr><th>{name}</th><td>{escape(value)}</td></tr>" for name, value in rows)
        body = (
            '<ul class="breadcrumb"><li><a href="../">Home</a></li>'
            f'<li><a href="../genre/{genre.slug}/page-1.html">{escape(genre.name)}</a></li>'
            f'<li class="active">{escape(book.title)}</li></ul>\n'
            '<article class="product_page"><div class="row"><div class="col-sm-6 product_main">\n'
            f"<h1>{escape(book.title)}</h1>\n"
            f'<p class="price_color">{book.price_text}</p>\n'
            f'<p class="{stock_class} availability"><i class="icon-ok"></i> '
            f"{escape(book.availability)}</p>\n"
            f'<p class="star-rating {book.rating}"></p>\n</div></div>\n'
            '<div id="product_description" class="sub-header"><h2>Product Description</h2></div>\n'
            f"<p>{escape(book.description)}</p>\n"
            '<div class="sub-header"><h2>Product Information</h2></div>\n'
            f'<table class="table table-striped">{table}</table>\n</article>'
        )
        return _document(book.title, body, home="../")


def _pod(book: Book) -> str:
    title = book.title
    short = title if len(title) <= _SHORT_TITLE else title[: _SHORT_TITLE - 4].rstrip() + " ..."
    href = f"../../book/{book.url.rsplit('/', 1)[1]}"
    stock = '<p class="instock availability">In stock</p>' if book.stock else (
        '<p class="outofstock availability">Out of stock</p>'
    )  # fmt: skip
    return (
        '<li class="col-xs-6 col-sm-4 col-md-3 col-lg-3"><article class="product_pod">\n'
        f'<p class="star-rating {book.rating}"></p>\n'
        f'<h3><a href="{href}" title="{escape(title)}">{escape(short)}</a></h3>\n'
        f'<div class="product_price"><p class="price_color">{book.price_text}</p>{stock}</div>\n'
        "</article></li>\n"
    )


def _document(title: str, body: str, home: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en-us">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)} | Fleet Books</title>\n</head>\n<body>\n"
        f'<header class="page_inner"><div class="h1"><a href="{home}">Fleet Books</a></div>'
        f"</header>\n{body}\n</body>\n</html>\n"
    )


def generate_library(n_books: int, seed: int = 0) -> Library:
    """Build the book site; the same arguments always give the same books."""
    if n_books < 0:
        raise ValueError(f"n_books must be >= 0, got {n_books!r}")
    rng = random.Random(f"{seed}:books")
    count = min(len(_GENRE_NAMES), max(1, math.ceil(n_books / 25)))
    names = rng.sample(_GENRE_NAMES, count)
    slugs = [f"{slug(name)}_{index}" for index, name in enumerate(names, start=1)]
    # The first books go one to each genre, so none is empty; the rest anywhere.
    order = list(range(1, n_books + 1))
    rng.shuffle(order)
    genre_of = {
        book_id: i if i < count else rng.randrange(count) for i, book_id in enumerate(order)
    }
    books = []
    for book_id in range(1, n_books + 1):
        pattern = rng.choice(_TITLE_PATTERNS)
        title = pattern.format(
            adj=rng.choice(_TITLE_ADJECTIVES),
            noun=rng.choice(_TITLE_NOUNS),
            other=rng.choice(_TITLE_NOUNS),
            place=rng.choice(_PLACES),
        )
        books.append(
            Book(
                id=book_id,
                title=title,
                genre=slugs[genre_of[book_id]],
                price=f"{rng.randint(1000, 5999) / 100:.2f}",
                stock=0 if rng.random() < 0.1 else rng.randint(1, 22),
                rating=rng.choice(_RATINGS),
                upc=f"{rng.getrandbits(64):016x}",
                description=paragraph(rng, _BLURBS, 2, 4),
                lastmod=(_FIRST_LASTMOD + dt.timedelta(days=rng.randrange(700))).isoformat(),
            )
        )
    genres = tuple(
        Genre(slugs[i], names[i], tuple(b for b in range(1, n_books + 1) if genre_of[b] == i))
        for i in range(count)
    )
    return Library(books=tuple(books), genres=genres)
