"""Deterministic synthetic web shop that every test, benchmark and demo crawl targets.

Run it with ``python -m tests.site --help``; tests use :class:`tests.site.server.ShopServer`.
Beside the shop (``/``, ``/category/``, ``/product/``, whose pages also carry schema.org
JSON-LD), the same server has sections that nothing of the shop links to: a JSON API of the
catalogue (``/api/``, :mod:`tests.site.api`), an article site (``/articles/``,
:mod:`tests.site.articles`), a book site (``/books/``, :mod:`tests.site.books`) and the
sitemaps that list the last two (``/sitemap.xml``, named by robots.txt,
:mod:`tests.site.sitemaps`).
"""

from __future__ import annotations

__all__: list[str] = []
