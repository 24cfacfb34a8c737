"""The article site under ``/articles/``: listings, tag pages and articles.

``/articles/`` is the newest :data:`ARTICLES_PER_PAGE` articles, ``/articles/page/<n>/`` the
older ones (``a.next`` links them); ``/articles/tag/<tag>/`` (and ``.../page/<n>/``) lists one
tag's articles; ``/articles/<yyyy>/<mm>/<slug>/`` is an article: ``h1`` title, author,
published date, body and tags.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

from tests.site.words import paragraph, slug

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ARTICLES_PER_PAGE", "Article", "Journal", "Tag", "generate_journal"]

ARTICLES_PER_PAGE = 10
_LISTING = re.compile(r"/articles/(?:tag/([a-z0-9-]+)/)?(?:page/(\d+)/)?")
_LATEST = dt.datetime(2024, 12, 20, 9, 30, tzinfo=dt.UTC)
_AUTHORS: tuple[str, ...] = (
    "Ada Okafor", "Bruno Lefèvre", "Chen Wei", "Dana O'Neil", "Émile Durand", "Farah Haddad",
    "Gustav Lind", "Hana Kobayashi",
)  # fmt: skip
_TAGS: tuple[str, ...] = (
    "Scrapy", "Redis", "Politeness", "Python", "Data quality", "JavaScript", "Operations",
    "Sitemaps", "Testing", "MongoDB",
)  # fmt: skip
_TITLE_PATTERNS: tuple[str, ...] = (
    "How to {verb} {thing}", "Why {thing} fail", "{n} lessons from {thing}", "Notes on {thing}",
    "{thing}: a field guide", "What we learned from {thing}", "Stop {verb_ing} {thing}",
)  # fmt: skip
_VERBS: tuple[tuple[str, str], ...] = (
    ("debug", "debugging"), ("measure", "measuring"), ("scale", "scaling"),
    ("test", "testing"), ("throttle", "throttling"), ("rewrite", "rewriting"),
)  # fmt: skip
_THINGS: tuple[str, ...] = (
    "crawlers", "retry storms", "sitemaps", "rate limits", "dead letters", "headless browsers",
    "price parsers", "robots.txt", "distributed queues", "canonical URLs", "flaky sites",
)  # fmt: skip
_SENTENCES: tuple[str, ...] = (
    "Most crawls fail quietly, long before anyone reads the logs.",
    "A queue that never loses work is worth more than a fast one.",
    "We measured twice & shipped once.",
    "The site's robots.txt said one thing; its rate limiter said another.",
    "Nobody reads the retry budget until the night it runs out.",
    'Our first version was "good enough" for a week.',
    "Every page should cost at most itself.",
    "Sitemaps list what a site wants found, not everything it has.",
    "The fix was three lines; finding it took three days.",
    "Politeness is a property of the fleet, not of one process.",
    "Canonical links lie more often than you would think.",
    "A dashboard nobody looks at is a log file with colours.",
)


@dataclass(frozen=True)
class Tag:
    """A tag and the ids of its articles, newest first."""

    slug: str
    name: str
    article_ids: tuple[int, ...]


@dataclass(frozen=True)
class Article:
    """Ground truth for one article page."""

    id: int
    title: str
    url: str
    author: str
    published: dt.datetime
    tags: tuple[str, ...]
    paragraphs: tuple[str, ...]

    @property
    def body(self) -> str:
        """The text of the body: its paragraphs separated by blank lines."""
        return "\n\n".join(self.paragraphs)

    def as_dict(self, tag_names: dict[str, str]) -> dict[str, object]:
        """JSON-ready ground truth, as in ``/_catalogue``; tags by name, as the page shows them."""
        return {
            "id": self.id,
            "url": self.url,
            "title": self.title,
            "author": self.author,
            "published": self.published.isoformat(),
            "tags": [tag_names[t] for t in self.tags],
            "tag_slugs": list(self.tags),
            "body": self.body,
        }


@dataclass(frozen=True)
class Journal:
    """The articles (oldest first, ids from 1) and tags of the article site."""

    articles: tuple[Article, ...]
    tags: tuple[Tag, ...]
    _by_url: dict[str, Article] = field(init=False, repr=False, compare=False)
    _by_slug: dict[str, Tag] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_url", {a.url: a for a in self.articles})
        object.__setattr__(self, "_by_slug", {t.slug: t for t in self.tags})

    def article_at(self, path: str) -> Article | None:
        """The article whose page is *path*, or ``None``."""
        return self._by_url.get(path)

    def render(self, path: str) -> str | None:
        """HTML of the article site's page at *path*, or ``None`` (a 404)."""
        if (article := self._by_url.get(path)) is not None:
            return self._article(article)
        match = _LISTING.fullmatch(path)
        if match is None:
            return None
        tag_slug, page_text = match.groups()
        tag = self._by_slug.get(tag_slug) if tag_slug else None
        if tag_slug and tag is None:
            return None
        ids = tag.article_ids if tag else tuple(a.id for a in reversed(self.articles))
        page = int(page_text) if page_text else 1
        # Page 1 has one URL only: /articles/page/1/ is not a second name for /articles/.
        if page_text is not None and (page < 2 or str(page) != page_text):
            return None
        pages = max(1, math.ceil(len(ids) / ARTICLES_PER_PAGE))
        if page > pages:
            return None
        return self._listing(tag, ids, page, pages)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready ground truth, as in ``/_catalogue``."""
        names = {t.slug: t.name for t in self.tags}
        tags = [
            {
                "slug": t.slug,
                "name": t.name,
                "url": _listing_url(t, 1),
                "article_ids": list(t.article_ids),
            }
            for t in self.tags
        ]
        return {"articles": [a.as_dict(names) for a in self.articles], "tags": tags}

    def _tag_links(self, slugs: Sequence[str], css_class: str) -> str:
        items = "".join(
            f'<li><a rel="tag" href="{_listing_url(tag, 1)}">{escape(tag.name)}</a></li>'
            for tag in (self._by_slug[s] for s in slugs)
        )
        return f'<ul class="{css_class}">{items}</ul>'

    def _listing(self, tag: Tag | None, ids: Sequence[int], page: int, pages: int) -> str:
        shown = ids[(page - 1) * ARTICLES_PER_PAGE : page * ARTICLES_PER_PAGE]
        summaries = "".join(_summary(self.articles[i - 1]) for i in shown) or (
            '<p class="empty">No articles yet.</p>\n'
        )
        nav = []
        if page > 1:
            nav.append(f'<a rel="prev" class="prev" href="{_listing_url(tag, page - 1)}">Newer</a>')
        nav.append(f'<span class="current">Page {page} of {pages}</span>')
        if page < pages:
            nav.append(f'<a rel="next" class="next" href="{_listing_url(tag, page + 1)}">Older</a>')
        heading = f"Articles tagged “{escape(tag.name)}”" if tag else "Latest articles"
        cloud = self._tag_links([t.slug for t in self.tags], "tag-cloud")
        body = (
            f'<main>\n<h1 class="page-title">{heading}</h1>\n{summaries}'
            f'<nav class="pagination">{" ".join(nav)}</nav>\n</main>\n'
            f'<aside class="tags"><h2>Tags</h2>{cloud}</aside>'
        )
        return _document(heading if page == 1 else f"{heading}, page {page}", body)

    def _article(self, article: Article) -> str:
        index = article.id - 1
        neighbours = []
        if index > 0:
            older = self.articles[index - 1]
            neighbours.append(f'<a rel="prev" href="{older.url}">{escape(older.title)}</a>')
        if index + 1 < len(self.articles):
            newer = self.articles[index + 1]
            neighbours.append(f'<a rel="next" href="{newer.url}">{escape(newer.title)}</a>')
        paragraphs = "".join(f"<p>{escape(p)}</p>\n" for p in article.paragraphs)
        body = (
            f'<article class="post" data-article-id="{article.id}">\n'
            f'<h1 class="entry-title">{escape(article.title)}</h1>\n'
            f'<p class="byline">By <span class="author">{escape(article.author)}</span> on '
            f'<time class="published" datetime="{article.published.isoformat()}">'
            f"{_human_date(article.published)}</time></p>\n"
            f'<div class="entry-content">\n{paragraphs}</div>\n'
            f"<footer>{self._tag_links(article.tags, 'tags')}</footer>\n</article>\n"
            f'<nav class="post-nav">{" ".join(neighbours)}</nav>'
        )
        head = f'<link rel="canonical" href="{article.url}">\n'
        return _document(article.title, body, head)


def _listing_url(tag: Tag | None, page: int) -> str:
    base = f"/articles/tag/{tag.slug}/" if tag else "/articles/"
    return base if page == 1 else f"{base}page/{page}/"


def _summary(article: Article) -> str:
    return (
        f'<article class="post-summary"><h2 class="entry-title"><a href="{article.url}">'
        f"{escape(article.title)}</a></h2>\n"
        f'<p class="meta">By {escape(article.author)} · <time datetime="'
        f'{article.published.isoformat()}">{_human_date(article.published)}</time></p>\n'
        f'<p class="excerpt">{escape(article.paragraphs[0])}</p></article>\n'
    )


def _human_date(when: dt.datetime) -> str:
    return f"{when.day} {when:%B %Y}"


def _document(title: str, body: str, head: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)} | Fleet Journal</title>\n{head}</head>\n<body>\n"
        f'<header><a class="home" href="/articles/">Fleet Journal</a></header>\n{body}\n'
        "</body>\n</html>\n"
    )


def generate_journal(n_articles: int, seed: int = 0) -> Journal:
    """Build the article site; the same arguments always give the same articles."""
    if n_articles < 0:
        raise ValueError(f"n_articles must be >= 0, got {n_articles!r}")
    rng = random.Random(f"{seed}:articles")
    # Publication times go back from _LATEST, so the newest article is the last one.
    times: list[dt.datetime] = []
    when = _LATEST
    for _ in range(n_articles):
        times.append(when)
        when -= dt.timedelta(hours=rng.randint(6, 90), minutes=rng.randrange(60))
    times.reverse()
    tag_slugs = {name: slug(name) for name in _TAGS}
    urls: set[str] = set()
    articles = []
    for article_id, published in enumerate(times, start=1):
        verb, verb_ing = rng.choice(_VERBS)
        title = rng.choice(_TITLE_PATTERNS).format(
            verb=verb, verb_ing=verb_ing, thing=rng.choice(_THINGS), n=rng.randint(3, 12)
        )
        title = title[0].upper() + title[1:]
        base = f"/articles/{published:%Y/%m}/{slug(title)}"
        url, suffix = f"{base}/", 2
        while url in urls:  # two articles of a month with one title: WordPress adds -2, -3
            url, suffix = f"{base}-{suffix}/", suffix + 1
        urls.add(url)
        articles.append(
            Article(
                id=article_id,
                title=title,
                url=url,
                author=rng.choice(_AUTHORS),
                published=published,
                tags=tuple(tag_slugs[t] for t in rng.sample(_TAGS, rng.randint(1, 3))),
                paragraphs=tuple(
                    paragraph(rng, _SENTENCES, 2, 4) for _ in range(rng.randint(2, 5))
                ),
            )
        )
    tags = tuple(
        Tag(
            tag_slugs[name],
            name,
            tuple(a.id for a in reversed(articles) if tag_slugs[name] in a.tags),
        )
        for name in _TAGS
    )
    return Journal(articles=tuple(articles), tags=tuple(t for t in tags if t.article_ids))
