"""Spider middleware of adaptive rendering: a page fetched both ways, and what it taught.

A sample is a plain fetch first: what its callback yielded is summed up
(:mod:`~project.rendering.evidence`) and held back, and the page is asked again through
the browser (its *twin*, through the frontier like any request, so the site's limits hold
and no lease is lost). The twin's callback output is what the crawl keeps; compared with
the plain summary it tells the fleet whether the pattern needs the browser. A plain page
of a pattern settled on HTTP that yields less than the browser always found is sampled
the same way (a *rescue*: the site may have turned to JavaScript), so no item is stored
empty meanwhile. A failed fetch (an error status) is no evidence either way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.spidermiddlewares.httperror import HttpError

from project.frontier.meta import (
    NODE_LOCAL_META_KEYS,
    REVISIT_META_KEY,
    SESSION_META_KEY,
    SESSION_OWNED_HEADERS,
    SESSION_OWNED_META,
)
from project.rendering.evidence import agree, summarize
from project.rendering.plan import ROLE_HTTP, ROLE_SAMPLE, plan_of
from project.rendering.wire import ADAPTIVE_META_KEY, RULE_META_KEY, TWIN_META_KEY

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from project.rendering.plan import RenderPlan

__all__ = ["AdaptiveSamples"]

logger = logging.getLogger(__name__)

#: Meta of the plain fetch a twin does not take: the download's own, and the validators
#: of a revisit (a browser asked conditionally would render a 304's empty page).
_NOT_COPIED = NODE_LOCAL_META_KEYS | {
    REVISIT_META_KEY,
    RULE_META_KEY,
    "download_latency",
    "download_slot",
    "retry_times",
    "redirect_times",
    "redirect_ttl",
    "redirect_urls",
    "redirect_reasons",
}
_CONDITIONAL = (b"If-None-Match", b"If-Modified-Since")
#: What a twin adds to its page's priority.
_TWIN_PRIORITY = 1000


class AdaptiveSamples:
    """Turns samples into browser twins, and twins into evidence for the render plan."""

    def __init__(self, plan: RenderPlan, ignore_fields: frozenset[str]) -> None:
        self.plan = plan
        self.ignore_fields = ignore_fields

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Off unless PLAYWRIGHT_ADAPTIVE; the spider's ``render_ignore_fields`` are not
        compared (a field that says how the page was fetched)."""
        plan = plan_of(crawler)
        if plan is None:
            raise NotConfigured  # PLAYWRIGHT_ADAPTIVE is off (no args: Scrapy logs no WARNING)
        spider: Spider | type[Spider] = crawler.spider or crawler.spidercls
        ignored = getattr(spider, "render_ignore_fields", ()) or ()
        return cls(plan, frozenset(str(name) for name in ignored))

    def process_spider_output(
        self, response: Response, result: Iterable[Any], spider: Spider | None = None
    ) -> Iterator[Any]:
        """Sync callbacks: see :meth:`process_spider_output_async`."""
        if not self._held(response):
            yield from result
            return
        yield from self._settle(response, list(result))

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        """A sample's output is held back for its twin; a twin's is compared, then kept."""
        if not self._held(response):
            async for thing in result:
                yield thing
            return
        output = [thing async for thing in result]
        for thing in self._settle(response, output):
            yield thing

    def process_spider_exception(
        self, response: Response, exception: Exception, spider: Spider | None = None
    ) -> list[Any] | None:
        """A twin the browser answered with an error (HttpErrorMiddleware's HttpError): its
        page is fetched plainly once more, and that fetch's output is kept."""
        if (
            isinstance(exception, HttpError)
            and self._held(response)
            and TWIN_META_KEY in response.meta
            and response.request is not None
        ):
            self.plan.stats.inc_value("render/adaptive/twin_failed")
            return [self._plain_again(response.request)]
        return None

    @staticmethod
    def _held(response: Response) -> bool:
        meta = response.meta
        twin = meta.get(TWIN_META_KEY)
        if twin is not None:
            # a twin, not a request that copied its page's meta (meta=response.meta)
            request = response.request
            return (
                isinstance(twin, dict)
                and request is not None
                and twin.get("u") == request.url
                and "playwright" in response.flags
            )
        adaptive = meta.get(ADAPTIVE_META_KEY)
        return (
            isinstance(adaptive, dict)
            and adaptive.get("r") in (ROLE_SAMPLE, ROLE_HTTP)
            and "playwright" not in response.flags
        )

    def _settle(self, response: Response, output: list[Any]) -> list[Any]:
        stats = self.plan.stats
        meta = response.meta
        twin = meta.get(TWIN_META_KEY)
        if not 200 <= response.status < 300:
            stats.inc_value("render/adaptive/no_evidence")
            if twin is not None and response.request is not None:
                # the browser failed where the plain fetch answered: that one is kept
                stats.inc_value("render/adaptive/twin_failed")
                return [*output, self._plain_again(response.request)]
            return output  # an error page tells nothing of what the page needs
        if twin is not None:
            if isinstance(twin.get("p"), dict):
                browser = summarize(response.url, output, self.ignore_fields)
                self.plan.told(str(twin.get("k")), agree(twin["p"], browser), browser)
            return output
        key, role = meta[ADAPTIVE_META_KEY]["k"], meta[ADAPTIVE_META_KEY]["r"]
        plain = summarize(response.url, output, self.ignore_fields)
        if not isinstance(response, HtmlResponse):
            # JSON, XML, text: no browser builds them; what it yielded is the page
            self.plan.told(key, True, plain)
            return output
        why = "sample"
        if role == ROLE_HTTP:
            if not self.plan.looks_short(key, plain):
                return output
            why = "rescue"
            logger.debug("%s yielded less than its pattern renders: fetched again", response)
        stats.inc_value(f"render/adaptive/{why}s")
        return [self._twin(response.request, key, plain, why)]

    @staticmethod
    def _copy_meta(request: Request) -> dict[str, Any]:
        """The page's meta for another fetch of it: not the download's own, nor what a
        session put on it (the other fetch gets a session of its own)."""
        meta = request.meta
        listed = meta.get(RULE_META_KEY)
        dropped = _NOT_COPIED | set(listed if isinstance(listed, list) else ())
        if meta.get(SESSION_META_KEY):
            dropped |= SESSION_OWNED_META
        return {k: v for k, v in meta.items() if k not in dropped}

    def _plain_again(self, request: Request) -> Request:
        """The page of a failed twin, fetched plainly once more; its output is kept."""
        meta = self._copy_meta(request)
        meta.pop(TWIN_META_KEY, None)
        meta["playwright"] = False
        again = request.replace(meta=meta, dont_filter=True)
        self._strip_headers(request, again)
        return again

    @staticmethod
    def _strip_headers(request: Request, copy: Request) -> None:
        owned = SESSION_OWNED_HEADERS if request.meta.get(SESSION_META_KEY) else frozenset()
        for header in (*_CONDITIONAL, *owned):
            copy.headers.pop(header, None)

    def _twin(self, request: Request | None, key: str, plain: dict[str, Any], why: str) -> Request:
        assert request is not None
        twin_meta = self._copy_meta(request)
        twin_meta["playwright"] = True
        twin_meta[TWIN_META_KEY] = {"k": key, "p": plain, "w": why, "u": request.url}
        # ahead of the queue: the pattern's other pages wait for its verdict (in the browser)
        twin = request.replace(
            meta=twin_meta, dont_filter=True, priority=request.priority + _TWIN_PRIORITY
        )
        self._strip_headers(request, twin)
        return twin
