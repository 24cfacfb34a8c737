"""JavaScript rendering with scrapy-playwright and Debian's Chromium.

Chromium renders a request only when its ``meta["playwright"]`` is true, when
a URL rule matches it (:class:`RenderingMiddleware`), or when a spider asks
for a second, rendered fetch (``FALLBACK_META_KEY``). Everything else goes
through Scrapy's own HTTP handler, and a node that never renders never starts
Playwright or Chromium (:class:`LazyBrowserProvider`).

Importing this module registers :class:`~scrapy_playwright.page.PageMethod`
with the frontier's JSON wire format.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_playwright.page import PageMethod
from scrapy_playwright.provider import PlaywrightBrowserProvider

from project.wire import register_codec

if TYPE_CHECKING:
    from typing import Self

    from playwright.async_api import Browser, BrowserContext
    from playwright.async_api import Request as PlaywrightRequest
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from scrapy_playwright.handler import Config as PlaywrightConfig

__all__ = [
    "DEFAULT_CHROMIUM_PATH",
    "FALLBACK_META_KEY",
    "ChromiumAddon",
    "LazyBrowserProvider",
    "RenderRule",
    "RenderingConfig",
    "RenderingConfigError",
    "RenderingMiddleware",
    "abort_heavy_request",
    "allow_page_method",
    "page_method_from_json",
    "page_method_to_json",
    "parse_render_rules",
]

DEFAULT_CHROMIUM_PATH = "/usr/bin/chromium"

#: request.meta key of a spider's rendered second fetch; such a page is never rendered again.
FALLBACK_META_KEY = "render_fallback"

#: Contexts named by the middleware; any other ``playwright_context`` is the spider's own.
_CONTEXT_PREFIX = "fleet-"

_HEAVY_RESOURCES = frozenset({"image", "font", "media"})

# Page methods that may travel through Redis. None of them touches the node's
# files (no path=, no set_input_files), so writing to Redis cannot read or
# write files on every node.
_WIRE_PAGE_METHODS: set[str] = {
    "bring_to_front",
    "check",
    "click",
    "dblclick",
    "dispatch_event",
    "emulate_media",
    "evaluate",
    "fill",
    "focus",
    "go_back",
    "go_forward",
    "goto",
    "hover",
    "press",
    "reload",
    "screenshot",
    "select_option",
    "set_checked",
    "set_extra_http_headers",
    "set_viewport_size",
    "tap",
    "type",
    "uncheck",
    "wait_for_function",
    "wait_for_load_state",
    "wait_for_selector",
    "wait_for_timeout",
    "wait_for_url",
}
_FILE_KWARGS = frozenset({"path"})


class RenderingConfigError(RuntimeError):
    """Rendering is misconfigured, so the node must not start.

    Not ``NotConfigured``: Scrapy answers that by disabling the component and
    crawling on, which would silently lose every JavaScript-only page.
    """


# -- PageMethod on the wire ------------------------------------------------


def allow_page_method(name: str) -> None:
    """Allow ``PageMethod(name, ...)`` in requests that travel through the frontier."""
    _WIRE_PAGE_METHODS.add(name)


def page_method_to_json(method: PageMethod) -> dict[str, Any]:
    """``{"method", "args", "kwargs"}`` of a PageMethod; its ``result`` is not sent."""
    name = method.method
    if not isinstance(name, str):
        raise TypeError(
            f"PageMethod({name!r}) cannot travel through the frontier: name a Page method instead"
        )
    _check_page_method(name, method.kwargs)
    data: dict[str, Any] = {"method": name}
    if method.args:
        data["args"] = list(method.args)
    if method.kwargs:
        data["kwargs"] = dict(method.kwargs)
    return data


def page_method_from_json(data: Any) -> PageMethod:
    """Rebuild a PageMethod from :func:`page_method_to_json` output; TypeError if not allowed."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("method"), str)
        or not isinstance(data.get("args", []), list)
        or not isinstance(data.get("kwargs", {}), dict)
        or set(data) - {"method", "args", "kwargs"}
    ):
        raise TypeError(f"not a page method: {data!r}")
    kwargs = data.get("kwargs", {})
    _check_page_method(data["method"], kwargs)
    return PageMethod(data["method"], *data.get("args", []), **kwargs)


def _check_page_method(name: str, kwargs: dict[str, Any]) -> None:
    if name not in _WIRE_PAGE_METHODS:
        raise TypeError(
            f"PageMethod {name!r} is not allowed on the wire"
            " (see project.rendering.allow_page_method)"
        )
    if _FILE_KWARGS & set(kwargs):
        raise TypeError(f"PageMethod {name!r} must not write files on the node (path=)")


register_codec(PageMethod, "page_method", page_method_to_json, page_method_from_json)


# -- settings --------------------------------------------------------------


@dataclass(frozen=True)
class RenderRule:
    """Render requests whose URL matches ``pattern``, then run ``page_methods``."""

    pattern: re.Pattern[str]
    page_methods: tuple[PageMethod, ...] = ()


def parse_render_rules(value: Any, name: str = "PLAYWRIGHT_RENDER_URLS") -> tuple[RenderRule, ...]:
    """Rules from a list of URL regexes, or a dict of regex -> page methods.

    A string is a JSON list or dict (command line), or else a single regex.
    Page methods are ``PageMethod`` objects or their JSON form
    ``{"method": ..., "args": [...], "kwargs": {...}}``.
    """
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("[", "{"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise RenderingConfigError(f"{name} is not valid JSON: {exc}") from exc
        else:
            value = [text] if text else []
    if not value:
        return ()
    items = value.items() if isinstance(value, dict) else ((pattern, ()) for pattern in value)
    rules = []
    for pattern, methods in items:
        try:
            regex = re.compile(pattern)
            page_methods = tuple(_page_method(m) for m in methods or ())
        except (re.error, TypeError, ValueError) as exc:
            raise RenderingConfigError(f"{name}: bad rule {pattern!r}: {exc}") from exc
        rules.append(RenderRule(regex, page_methods))
    return tuple(rules)


def _page_method(value: Any) -> PageMethod:
    if isinstance(value, PageMethod):
        # Rules are applied after the frontier: still hold them to its allow-list,
        # or a retried request could not be sent back.
        page_method_to_json(value)
        return value
    return page_method_from_json(value)


@dataclass(frozen=True)
class RenderingConfig:
    """The rendering settings; see docs/fragments/rendering.md."""

    chromium_path: str = DEFAULT_CHROMIUM_PATH
    browser_type: str = "chromium"
    remote: bool = False
    max_contexts: int = 1
    max_pages_per_context: int = 4
    rules: tuple[RenderRule, ...] = ()

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Read and check the settings; raise RenderingConfigError when they cannot work."""
        launch_options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
        config = cls(
            chromium_path=launch_options.get("executable_path")
            or settings.get("PLAYWRIGHT_CHROMIUM_PATH")
            or os.environ.get("FLEETCRAWL_CHROMIUM")
            or DEFAULT_CHROMIUM_PATH,
            browser_type=settings.get("PLAYWRIGHT_BROWSER_TYPE") or cls.browser_type,
            remote=bool(
                settings.get("PLAYWRIGHT_CDP_URL") or settings.get("PLAYWRIGHT_CONNECT_URL")
            ),
            max_contexts=settings.getint("PLAYWRIGHT_MAX_CONTEXTS", cls.max_contexts),
            max_pages_per_context=settings.getint(
                "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT", cls.max_pages_per_context
            ),
            rules=parse_render_rules(settings.get("PLAYWRIGHT_RENDER_URLS")),
        )
        if config.max_contexts < 1 or config.max_pages_per_context < 1:
            raise RenderingConfigError(
                "PLAYWRIGHT_MAX_CONTEXTS and PLAYWRIGHT_MAX_PAGES_PER_CONTEXT must be at least 1"
                " (unbounded browsers take all the memory of a node)"
            )
        return config

    def find_chromium(self) -> str:
        """Absolute path of the Chromium binary; RenderingConfigError if there is none."""
        found = shutil.which(self.chromium_path)
        if found is None:
            raise RenderingConfigError(
                f"Chromium not found at {self.chromium_path!r}: JavaScript pages cannot be"
                " rendered. Install it with `apt-get install chromium` (Debian), or set"
                " PLAYWRIGHT_CHROMIUM_PATH or FLEETCRAWL_CHROMIUM to a Chromium binary."
            )
        return found


# -- components ------------------------------------------------------------


class ChromiumAddon:
    """Add-on that checks the settings and points Playwright at the system's Chromium.

    It runs before the settings are frozen, so ``-s PLAYWRIGHT_CHROMIUM_PATH=...``
    reaches the launch options, and a missing binary stops the node at start.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        """Set ``executable_path`` in PLAYWRIGHT_LAUNCH_OPTIONS; raise if Chromium is missing."""
        config = RenderingConfig.from_settings(settings)
        if config.remote or config.browser_type != "chromium":
            return
        options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
        options["executable_path"] = config.find_chromium()
        priority = settings.getpriority("PLAYWRIGHT_LAUNCH_OPTIONS") or "addon"
        settings.set("PLAYWRIGHT_LAUNCH_OPTIONS", options, priority=priority)


class LazyBrowserProvider(PlaywrightBrowserProvider):  # type: ignore[misc]
    """scrapy-playwright's provider, started with the first browser instead of the engine.

    Playwright's driver alone is a Node.js process of about 190 MiB PSS; a node
    that never renders should not pay for it.
    """

    def __init__(self, config: PlaywrightConfig) -> None:
        super().__init__(config)
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        """Nothing to do until a page is rendered."""

    async def _start_playwright(self) -> None:
        async with self._start_lock:
            if self.playwright is None:
                await super().start()

    async def launch_browser(self) -> Browser:
        """Start Playwright if needed, then launch the browser."""
        await self._start_playwright()
        browser: Browser = await super().launch_browser()
        return browser

    async def launch_persistent_context(self, context_kwargs: dict[str, Any]) -> BrowserContext:
        """Start Playwright if needed, then launch a persistent context."""
        await self._start_playwright()
        context: BrowserContext = await super().launch_persistent_context(context_kwargs)
        return context


def abort_heavy_request(request: PlaywrightRequest) -> bool:
    """PLAYWRIGHT_ABORT_REQUEST: images, fonts and media are never needed to build the DOM."""
    return request.resource_type in _HEAVY_RESOURCES


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
