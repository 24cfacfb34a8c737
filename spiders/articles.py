"""Crawl a blog-shaped article site two ways: by its links, and by its sitemaps.

``ArticlesSpider`` is a stock ``CrawlSpider``: ``Rule``s follow the listing and tag pages under
``/articles/`` and hand each article page to ``parse_article``. ``ArticleSitemapSpider`` is a
stock ``SitemapSpider``: it reads the ``Sitemap:`` lines of the site's robots.txt, the sitemap
index they name and its ``/articles/`` children (``.xml.gz`` ones too). Both yield the same
:class:`ArticleItem`; the site's address is a spider argument::

    scrapy crawl articles -a site=http://127.0.0.1:8000          # on every node
    scrapy crawl article_sitemap -a site=http://127.0.0.1:8000   # or this one

On the fleet, whichever node starts first runs ``start()`` for all (the others wait for it),
and the articles go to MongoDB's ``articles`` collection. ``-s ADDONS={} -O articles.jsonl``
runs either alone on Scrapy's own scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.http import Response

__all__ = ["ArticleItem", "ArticleSitemapSpider", "ArticlesSpider"]

#: An article page: ``/articles/<yyyy>/<mm>/<slug>/``.
ARTICLE_URL = r"/articles/\d{4}/\d{2}/[a-z0-9-]+/$"
#: Pages that only list articles: the newest, the older ones, a tag's.
LISTING_URLS = (r"/articles/$", r"/articles/page/\d+/$", r"/articles/tag/[a-z0-9-]+/(page/\d+/)?$")


@dataclass
class ArticleItem:
    """An article as its page shows it; ``published`` is the ISO 8601 ``datetime`` attribute."""

    url: str
    title: str | None = None
    author: str | None = None
    published: str | None = None
    tags: list[str] = field(default_factory=list)
    body: str | None = None


def parse_article(response: Response) -> ArticleItem:
    """The article of an article page; the body is its paragraphs, separated by blank lines."""
    post = response.css("article.post")
    paragraphs = (
        " ".join(p.xpath("string()").get("").split()) for p in post.css(".entry-content p")
    )
    return ArticleItem(
        url=response.url,
        title=_strip(post.css("h1.entry-title::text").get()),
        author=_strip(post.css(".byline .author::text").get()),
        published=post.css("time.published::attr(datetime)").get(),
        tags=[t.strip() for t in post.css("ul.tags a[rel=tag]::text").getall()],
        body="\n\n".join(p for p in paragraphs if p) or None,
    )


def _strip(text: str | None) -> str | None:
    return text.strip() if text is not None else None


def _site(site: str | None, spider: str) -> str:
    """The site's base URL from ``-a site=...``, without a trailing slash."""
    parts = urlsplit(site or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{spider} needs the site's URL, -a site=http://host:port (got {site!r})")
    return f"{parts.scheme}://{parts.netloc}"


class ArticlesSpider(CrawlSpider):
    """Listing and tag pages to article pages, by ``Rule``s."""

    name = "articles"
    rules = (
        Rule(LinkExtractor(allow=ARTICLE_URL), callback="parse_article"),
        Rule(LinkExtractor(allow=LISTING_URLS)),
    )

    def __init__(self, site: str | None = None, *args: Any, **kwargs: Any) -> None:
        base = _site(site, self.name)
        self.start_urls = [f"{base}/articles/"]
        self.allowed_domains = [urlsplit(base).hostname or ""]
        super().__init__(*args, **kwargs)

    async def start(self) -> AsyncIterator[Request]:
        """The first listing page, through the dupefilter: every page links it again."""
        for url in self.start_urls:
            yield Request(url)

    def parse_article(self, response: Response) -> ArticleItem:
        """An article page."""
        return parse_article(response)


class ArticleSitemapSpider(SitemapSpider):
    """The site's robots.txt to its sitemaps to its article pages."""

    name = "article_sitemap"
    sitemap_rules = [(ARTICLE_URL, "parse_article")]
    #: Children of the sitemap index that list articles; the others are not fetched.
    sitemap_follow = [r"/articles[^/]*\.xml(\.gz)?$"]

    def __init__(self, site: str | None = None, *args: Any, **kwargs: Any) -> None:
        base = _site(site, self.name)
        self.sitemap_urls = [f"{base}/robots.txt"]
        self.allowed_domains = [urlsplit(base).hostname or ""]
        super().__init__(*args, **kwargs)

    def parse_article(self, response: Response) -> ArticleItem:
        """An article page."""
        return parse_article(response)
