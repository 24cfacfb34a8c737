"""The site's sitemaps: ``/sitemap.xml``, an index named by robots.txt, and its children.

The children together list every article and every book, each with ``<lastmod>``:
``/sitemaps/articles-1.xml.gz`` (the older half of the articles, a gzip file),
``/sitemaps/articles-2.xml`` (the newer half) and ``/sitemaps/books.xml``. URLs are absolute,
on the host the client asked for. The shop's products are in none of them.
"""

from __future__ import annotations

import gzip
from html import escape
from typing import TYPE_CHECKING

from tests.site.reply import GZIP, XML

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tests.site.articles import Journal
    from tests.site.books import Library

__all__ = ["INDEX_PATH", "Sitemaps"]

INDEX_PATH = "/sitemap.xml"
_NAMESPACE = "http://www.sitemaps.org/schemas/sitemap/0.9"
_HEADER = '<?xml version="1.0" encoding="UTF-8"?>\n'


class Sitemaps:
    """Renders the sitemap index and its children for a base URL."""

    def __init__(self, journal: Journal, library: Library) -> None:
        articles = [(a.url, a.published.isoformat()) for a in journal.articles]
        half = (len(articles) + 1) // 2
        # path -> (url, lastmod) entries; the first child is served gzip-compressed.
        self._children: dict[str, list[tuple[str, str]]] = {
            "/sitemaps/articles-1.xml.gz": articles[:half],
            "/sitemaps/articles-2.xml": articles[half:],
            "/sitemaps/books.xml": [(b.url, b.lastmod) for b in library.books],
        }
        self._lastmod = {
            path: max((lastmod for _, lastmod in entries), default=None)
            for path, entries in self._children.items()
        }

    @property
    def paths(self) -> list[str]:
        """Paths of the index and every child."""
        return [INDEX_PATH, *self._children]

    def render(self, path: str, base_url: str) -> tuple[bytes, bytes] | None:
        """``(body, content type)`` of the sitemap at *path*, or ``None`` (a 404)."""
        if path == INDEX_PATH:
            entries = ((base_url + p, self._lastmod[p]) for p in self._children)
            return _xml("sitemapindex", "sitemap", entries), XML
        if path not in self._children:
            return None
        entries = ((base_url + url, lastmod) for url, lastmod in self._children[path])
        body = _xml("urlset", "url", entries)
        if path.endswith(".gz"):
            return gzip.compress(body, mtime=0), GZIP
        return body, XML


def _xml(root: str, element: str, entries: Iterable[tuple[str, str | None]]) -> bytes:
    parts = [_HEADER, f'<{root} xmlns="{_NAMESPACE}">\n']
    for loc, lastmod in entries:
        modified = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
        parts.append(f"<{element}><loc>{escape(loc)}</loc>{modified}</{element}>\n")
    parts.append(f"</{root}>\n")
    return "".join(parts).encode()
