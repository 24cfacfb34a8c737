"""BlockPolicy: whether a response is the site's page or the site refusing one, and why.

A project changes what counts as a block with settings (BLOCK_STATUSES, BLOCK_MARKERS,
BLOCK_MARKER_CSS, BLOCK_CHALLENGE_URLS, BLOCK_REQUIRED_CSS, BLOCK_SOFT_RATIO) or with a
subclass named by ``BLOCK_POLICY``: each signal is a method of its own, and :meth:`blocked`
asks them in turn.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy.http import TextResponse

from project.blocking.config import BlockConfig, css_selector_ok
from project.frontier.retry import retry_after

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["SIGNALS", "BlockPolicy"]

logger = logging.getLogger(__name__)

#: The signals of the default policy (a subclass may name more): ``status_<code>`` for each
#: of BLOCK_STATUSES, and these.
SIGNALS = ("challenge", "challenge_url", "soft_short", "soft_missing")
#: Good pages of a site its running median of HTML lengths is taken over.
_WINDOW = 101
#: Kinds of page (of all sites) whose running medians a node keeps: a broad crawl's sites
#: are strangers' to grow.
_SHAPES = 10_000


class BlockPolicy:
    """The default block policy. :meth:`blocked` returns the signal of a block or None;
    :meth:`passed` hears of every response it let through (the running medians)."""

    def __init__(self, config: BlockConfig) -> None:
        self.config = config
        self._markers = _any_of(config.markers, re.IGNORECASE)
        self._challenge_urls = _any_of(config.challenge_urls, re.IGNORECASE)
        self._lengths: dict[str, deque[int]] = {}
        self._checked: dict[str, bool] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        return cls(BlockConfig.from_settings(settings))

    def blocked(
        self, request: Request, response: Response, site: str, spider: Spider
    ) -> str | None:
        """The signal that *response* (to *request*, of *site*) is a block, or None."""
        return (
            self.status_signal(response)
            or self.redirect_signal(request, response)
            or self.content_signal(request, response, site, spider)
        )

    def status_signal(self, response: Response) -> str | None:
        """``status_<code>`` for a blocking status; a 429 or 503 that says when to come back
        (a Retry-After that parses) is no block: the retries pause the site for the fleet,
        or dead-letter the request at once when it is longer than
        FRONTIER_RETRY_AFTER_MAX_WAIT."""
        status = response.status
        if status not in self.config.statuses:
            return None
        if status in (429, 503) and retry_after(response) > 0:
            return None
        return f"status_{status}"

    def redirect_signal(self, request: Request, response: Response) -> str | None:
        """``challenge_url``: redirected to where challenge pages live, or a redirect there
        that was not followed."""
        if self._challenge_urls is None:
            return None
        if 300 <= response.status < 400:
            location = (response.headers.get(b"Location") or b"")[:2048].decode("latin-1")
            return "challenge_url" if self._challenge_urls.search(location) else None
        if request.meta.get("redirect_urls") and self._challenge_urls.search(response.url):
            return "challenge_url"
        return None

    def content_signal(
        self, request: Request, response: Response, site: str, spider: Spider
    ) -> str | None:
        """``challenge`` (a marker or a marker selector), ``soft_missing`` (no element the
        site's good pages have), ``soft_short`` (much shorter than the site's good pages of
        its kind: the same first path segment and depth): only of an HTML answer of status
        2xx."""
        if not (200 <= response.status < 300 and _is_html(response)):
            return None
        assert isinstance(response, TextResponse)
        if self._markers is not None:
            head = response.body[: self.config.scan_bytes].decode(response.encoding, "replace")
            if self._markers.search(head):
                return "challenge"
        if any(response.css(selector) for selector in self.config.marker_css):
            return "challenge"
        required = self.required_css(site, spider)
        if required and not response.css(required):
            return "soft_missing"
        lengths = self._lengths.get(_shape(site, response.url))
        if (
            self.config.soft_ratio > 0
            and lengths is not None
            and len(lengths) >= self.config.soft_min_samples
            and len(response.body) < self.config.soft_ratio * statistics.median(lengths)
        ):
            return "soft_short"
        return None

    def required_css(self, site: str, spider: Spider) -> str | None:
        """The selector every good HTML page of *site* has: BLOCK_REQUIRED_CSS's entry of the
        site (or ``"*"``), else the spider's ``block_required_css`` (one that is no selector
        is left out, said once)."""
        given = self.config.required_css
        selector = given.get(site) or given.get("*")
        if selector is None:
            selector = getattr(spider, "block_required_css", None)
            if selector is not None and not self._spiders_selector_ok(selector):
                return None
        return selector if isinstance(selector, str) and selector.strip() else None

    def _spiders_selector_ok(self, selector: object) -> bool:
        known = self._checked.get(selector) if isinstance(selector, str) else False
        if known is None:
            known = self._checked[selector] = css_selector_ok(selector)  # type: ignore[index]
            if not known:
                logger.error("block_required_css %r is not a CSS selector: left out", selector)
        return bool(known)

    def passed(self, response: Response, site: str) -> None:
        """*response* of *site* was no block: an HTML 2xx joins the site's running median
        (the medians of the _SHAPES kinds of page seen last are kept)."""
        if 200 <= response.status < 300 and _is_html(response):
            shape = _shape(site, response.url)
            lengths = self._lengths.pop(shape, None) or deque(maxlen=_WINDOW)
            self._lengths[shape] = lengths  # the newest last
            if len(self._lengths) > _SHAPES:
                del self._lengths[next(iter(self._lengths))]
            lengths.append(len(response.body))


def _shape(site: str, url: str) -> str:
    """The kind of page *url* is on its site, for the running medians: its first path segment
    and how deep it goes (``/product/12`` and ``/product/13`` are one kind, ``/category/a``
    another, ``/books/book/x.html`` and ``/books/category/y/z.html`` two more)."""
    segments = urlsplit(url).path.strip("/").split("/")
    return f"{site} /{segments[0]}/{len(segments)}" if segments != [""] else f"{site} /"


def _any_of(patterns: list[str], flags: int) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns), flags) if patterns else None


def _is_html(response: Response) -> bool:
    if not isinstance(response, TextResponse):
        return False
    kind = (response.headers.get(b"Content-Type") or b"text/html")[:200].lower()
    return b"html" in kind
