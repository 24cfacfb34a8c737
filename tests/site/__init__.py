"""Deterministic synthetic web shop that every test, benchmark and demo crawl targets.

Run it with ``python -m tests.site --help``; tests use :class:`tests.site.server.ShopServer`.
Beside the shop (``/``, ``/category/``, ``/product/``, whose pages also carry schema.org
JSON-LD), the same server has sections that nothing of the shop links to: a JSON API of the
catalogue (``/api/``, :mod:`tests.site.api`), an article site (``/articles/``,
:mod:`tests.site.articles`), a book site (``/books/``, :mod:`tests.site.books`) and the
sitemaps that list the last two (``/sitemap.xml``, named by robots.txt,
:mod:`tests.site.sitemaps`), and with ``--mixed N`` a shop whose product pages need a browser
or not by URL pattern, and count the browsers that rendered them (``/mixed/``,
:mod:`tests.site.mixed`).

The catalogue is that of one epoch (``--epoch``, or ``/_epoch?set=N`` while it runs): each
epoch reprices, restocks, removes and adds a few products of the one before
(:mod:`tests.site.epochs`), and the shop's pages carry ETag and Last-Modified and answer
conditional requests with a 304 (:mod:`tests.site.conditional`), so a test can crawl the shop
twice and know exactly what changed in between.
"""

from __future__ import annotations

__all__: list[str] = []
