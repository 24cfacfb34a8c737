"""Which requests Chromium renders, and in which browser context."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_playwright.page import PageMethod

from project.rendering import wire as _wire  # noqa: F401  (registers PageMethod on the wire)
from project.rendering.config import RenderingConfig, parse_render_rules

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.rendering.config import RenderRule

__all__ = ["FALLBACK_META_KEY", "RenderingMiddleware"]

#: request.meta key of a spider's rendered second fetch; such a page is never rendered again.
FALLBACK_META_KEY = "render_fallback"

#: Contexts named by the middleware; any other ``playwright_context`` is the spider's own.
_CONTEXT_PREFIX = "fleet-"


class RenderingMiddleware:
    """Marks requests that match a render rule and spreads renders over the browser contexts.

    Rules come from the spider's ``render_urls`` attribute if it has one, else
    from PLAYWRIGHT_RENDER_URLS. ``meta["playwright"] = False`` opts a request out.
    """

    def __init__(self, rules: tuple[RenderRule, ...], max_contexts: int, stats: StatsCollector):
        self.rules = rules
        self.max_contexts = max_contexts
        self.stats = stats
        self._renders = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Rules of the spider, else of the settings; RenderingConfigError if one is bad."""
        config = RenderingConfig.from_settings(crawler.settings)
        spider: Spider | type[Spider] = crawler.spider or crawler.spidercls
        spider_rules = getattr(spider, "render_urls", None)
        rules = config.rules
        if spider_rules is not None:
            rules = parse_render_rules(spider_rules, f"{spider.name}.render_urls")
        assert crawler.stats is not None
        return cls(rules, config.max_contexts, crawler.stats)

    def process_request(self, request: Request) -> None:
        """Set ``playwright`` (and page methods) from a rule; pick a context for a render."""
        render = request.meta.get("playwright")
        if render is None:
            rule = self.match(request.url)
            if rule is None:
                return
            request.meta["playwright"] = True
            if rule.page_methods and "playwright_page_methods" not in request.meta:
                # Fresh objects: the handler stores each method's result on them.
                request.meta["playwright_page_methods"] = [
                    PageMethod(m.method, *m.args, **m.kwargs) for m in rule.page_methods
                ]
            self.stats.inc_value("playwright/rule")
        elif not render:
            return
        context = request.meta.get("playwright_context")
        # Names from another node (a retried request) are reassigned: its limit may differ.
        if context is None or str(context).startswith(_CONTEXT_PREFIX):
            request.meta["playwright_context"] = (
                f"{_CONTEXT_PREFIX}{self._renders % self.max_contexts}"
            )
            self._renders += 1

    def match(self, url: str) -> RenderRule | None:
        """The first rule whose pattern is found in *url*."""
        for rule in self.rules:
            if rule.pattern.search(url):
                return rule
        return None
