"""scrapy-playwright's download handler, with a bound on every render, pages reused, and the
browser recycled when it grows. The fleet's handler (project/rendering/download.py) builds it
at the first render: importing this module imports Playwright.

The bound and the page reuse override scrapy-playwright's private
``_create_page``, ``_download_request_with_page`` and ``_apply_page_methods``:
``tests/test_rendering_contract.py`` fails with what to do when a release changes it,
and pyproject.toml admits only the releases that test passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from playwright.async_api import Error as PlaywrightError
from scrapy.exceptions import DownloadTimeoutError
from scrapy_playwright.handler import DEFAULT_CONTEXT_NAME, ScrapyPlaywrightDownloadHandler
from scrapy_playwright.page import PageMethod

from project.rendering.browser import abort_types, browser_memory
from project.rendering.config import RenderingConfig
from project.rendering.wire import ABORT_META_KEY, WAIT_FOR_META_KEY

if TYPE_CHECKING:
    from playwright.async_api import Page, Route
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["BoundedPlaywrightHandler", "RenderTimeoutError"]

logger = logging.getLogger(__name__)
_PLAYWRIGHT_LOGGER = logging.getLogger("scrapy-playwright")

#: Renders a page serves before it is closed (a page's leaks end with it).
_PAGE_USES = 100
#: Seconds between two looks at the browser's memory (PLAYWRIGHT_MAX_RSS).
_MEMORY_EVERY = 10.0
#: Seconds a recycled browser runs at least: one whose baseline is past the bound (a
#: persistent context it does not close) is not recycled over and over.
_RECYCLE_EVERY = 60.0
#: Page methods whose effect outlives the render: their page is closed after it.
_STATEFUL_METHODS = frozenset(
    {"set_extra_http_headers", "set_viewport_size", "emulate_media", "go_back", "go_forward"}
)
#: Meta of a request whose page scrapy-playwright hands out or dresses: never reused.
_OWN_PAGE_META = (
    "playwright_include_page",
    "playwright_page",
    "playwright_page_event_handlers",
    "playwright_page_init_callback",
)


async def _abort_route(route: Route) -> None:
    with contextlib.suppress(PlaywrightError):
        await route.abort()


class RenderTimeoutError(DownloadTimeoutError):
    """A render took longer than its bound; retried like Scrapy's own download timeout."""


class BoundedPlaywrightHandler(ScrapyPlaywrightDownloadHandler):  # type: ignore[misc]
    """Renders end within PLAYWRIGHT_RENDER_TIMEOUT or the request's ``download_timeout``.

    Playwright bounds each navigation and page method, but not their sum, and
    a payload may ask for ``wait_for_timeout`` of a day or a timeout of 0. The
    bound runs from the page's creation to its response; the page is closed
    when it is exceeded, so its slot is free for the next render.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        config = RenderingConfig.from_settings(crawler.settings)
        if logging.getLevelName(crawler.settings.get("LOG_LEVEL")) != logging.DEBUG:
            # scrapy-playwright logs each request of each page when its logger says DEBUG
            # (Scrapy's LOG_LEVEL leaves it NOTSET): a round trip to the browser for each
            _PLAYWRIGHT_LOGGER.setLevel(logging.INFO)
        self.render_timeout = config.render_timeout
        self.abort_resources = config.abort_resources
        self.max_memory = config.max_rss * 1024 * 1024
        #: Pages done with their render, by context: the next render of the context
        #: navigates one of them instead of opening a page (half the work of a render).
        self._idle: dict[str, list[Page]] = {}
        self._uses: WeakKeyDictionary[Page, int] = WeakKeyDictionary()
        self._rendering = 0
        self._memory_checked = 0.0
        self._recycled_at = -_RECYCLE_EVERY
        self._watch_task: asyncio.Task[None] | None = None
        self._page_locks: dict[str, asyncio.Lock] = {}
        #: Set when a page is parked or closed: a request waiting for one looks again.
        self._page_freed = asyncio.Event()
        #: Cleared while the browser is recycled: no render starts until it is back.
        self._browser_ready = asyncio.Event()
        self._browser_ready.set()

    @staticmethod
    def _reusable(request: Request) -> bool:
        """A page a render leaves as it found it: none of its own, and no page method that
        changes the page for the next render (headers, viewport, media, history)."""
        if any(request.meta.get(key) for key in _OWN_PAGE_META):
            return False
        methods = request.meta.get("playwright_page_methods") or ()
        if isinstance(methods, dict):
            methods = methods.values()
        return not any(getattr(m, "method", None) in _STATEFUL_METHODS for m in methods)

    async def _create_page(self, request: Request, spider: Spider) -> Page:
        """An idle page of the request's context, else a new one (scrapy-playwright's).

        Idle pages hold their context's page permits: a request that finds none idle and
        the context full waits for a page to be parked or closed, and one that wants a
        page of its own (``playwright_include_page``) closes an idle one to make room.
        """
        await self._browser_ready.wait()
        name = request.meta.setdefault("playwright_context", DEFAULT_CONTEXT_NAME)
        reusable = self._reusable(request)
        async with self._page_locks.setdefault(name, asyncio.Lock()):
            while True:
                idle = [
                    p for p in self._idle.get(name, ()) if p in self._uses and not p.is_closed()
                ]
                self._idle[name] = idle
                if reusable and idle:
                    parked = idle.pop()
                    self._count_idle()
                    try:
                        await parked.unroute("**")  # the parked page's; this render routes anew
                    except PlaywrightError:
                        await self._close_page(parked)
                        continue
                    self.stats.inc_value("playwright/page_reused")
                    return parked
                wrapper = self.context_wrappers.get(name)
                if wrapper is None or not wrapper.semaphore.locked():
                    break
                self._page_freed.clear()
                if idle:
                    await self._close_page(idle.pop())  # its permit goes to this request
                    self._count_idle()
                    continue
                await self._page_freed.wait()
            page: Page = await super()._create_page(request, spider)
        page.on("crash", self._crashed)
        page.on("close", self._closed)
        self._uses[page] = 0
        return page

    async def _close_page(self, page: Page) -> None:
        self._uses.pop(page, None)
        with contextlib.suppress(PlaywrightError):
            await page.close()
            self.stats.inc_value("playwright/page_count/closed")

    def _count_idle(self) -> None:
        # pages open at the end are the idle ones, closed with their context after the stats
        idle = sum(len(pages) for pages in self._idle.values())
        self.stats.set_value("playwright/page_count/idle", idle)

    def _crashed(self, page: Page) -> None:
        self._uses.pop(page, None)  # never parked or handed out again

    def _closed(self, page: Page) -> None:
        self._page_freed.set()  # its permit is free

    async def _download_request_with_page(
        self, request: Request, page: Page, spider: Spider
    ) -> Response:
        # scrapy-playwright closes the page of a render that raises (unless the
        # request keeps its page), so a timeout frees the page like any failure.
        bound = min(self.render_timeout, float(request.meta.get("download_timeout") or "inf"))
        timer = asyncio.timeout(bound)
        reuse = self._reusable(request) and page in self._uses
        if reuse:
            request.meta["playwright_include_page"] = True  # kept open, for the next render
        aborted = request.meta.get(ABORT_META_KEY)
        abort_types[page] = frozenset(aborted) if aborted is not None else self.abort_resources
        self._rendering += 1
        self.stats.inc_value("playwright/renders")
        try:
            async with timer:
                response: Response = await super()._download_request_with_page(
                    request, page, spider
                )
        except TimeoutError as exc:
            if not timer.expired():
                raise
            raise RenderTimeoutError(
                f"Rendering {request.url} took longer than {bound:g} seconds."
            ) from exc
        except Exception:
            # a browser that grows until its renders fail is recycled all the same
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_memory())
            raise
        except asyncio.CancelledError:
            # cut by the node's stop: scrapy-playwright closes pages on errors, not on a
            # cancellation, and a page left open would keep its context's permit
            if not request.meta.get("playwright_include_page") or reuse:
                self._uses.pop(page, None)
                await asyncio.shield(self._close_page(page))
            raise
        finally:
            self._rendering -= 1
            if reuse:
                # a failed render's page is closed by scrapy-playwright once this is gone
                request.meta.pop("playwright_include_page", None)
                request.meta.pop("playwright_page", None)
        if reuse:
            await self._park(request, page)
        await self._watch_memory()
        return response

    async def _park(self, request: Request, page: Page) -> None:
        """Keep *page* for the next render of its context, or close it when it served enough."""
        uses = self._uses.get(page)
        if uses is None or page.is_closed():
            return
        if uses + 1 >= _PAGE_USES or not self._browser_ready.is_set():
            await self._close_page(page)
            return
        try:
            # what the last document still asks for (timers, polls) goes nowhere while parked
            await page.unroute("**")
            await page.route("**", _abort_route)
        except PlaywrightError:
            await self._close_page(page)
            return
        self._uses[page] = uses + 1
        name = request.meta.get("playwright_context", DEFAULT_CONTEXT_NAME)
        self._idle.setdefault(name, []).append(page)
        self._count_idle()
        self._page_freed.set()

    async def _watch_memory(self) -> None:
        """Past PLAYWRIGHT_MAX_RSS, the browser closes once its renders end, and the next
        render launches it again; its pages' requests wait meanwhile, none is lost."""
        now = time.monotonic()
        if (
            not self.max_memory
            or now - self._memory_checked < _MEMORY_EVERY
            or now - self._recycled_at < _RECYCLE_EVERY
        ):
            return
        self._memory_checked = now
        if (
            not self._browser_ready.is_set()
            or not hasattr(self, "browser")
            or not self.config.restart_disconnected_browser
        ):
            return
        used = await asyncio.to_thread(browser_memory)
        if used <= self.max_memory:
            return
        self._browser_ready.clear()
        try:
            while self._rendering:
                await asyncio.sleep(0.05)
            logger.info(
                "The browser uses %d MiB (PLAYWRIGHT_MAX_RSS: %d): closed, the next render"
                " launches it again",
                used // 2**20,
                self.max_memory // 2**20,
            )
            self._idle.clear()
            self._count_idle()
            self._uses.clear()
            self.stats.inc_value("playwright/browser_recycled")
            self._recycled_at = time.monotonic()
            with contextlib.suppress(PlaywrightError):
                await self.browser.close()
            while hasattr(self, "browser"):  # scrapy-playwright's disconnect callback
                await asyncio.sleep(0.01)
            # the contexts of PLAYWRIGHT_CONTEXTS come back as configured
            for name, kwargs in (self.config.startup_context_kwargs or {}).items():
                with contextlib.suppress(PlaywrightError):
                    await self._create_browser_context(name=name, context_kwargs=kwargs)
        finally:
            self._browser_ready.set()

    async def _apply_page_methods(self, page: Page, request: Request, spider: Spider) -> None:
        """A render rule's ``wait_for``: its methods run without waiting for ``load`` after
        each (scrapy-playwright's does; the rule's selector is what the page needs)."""
        if not request.meta.get(WAIT_FOR_META_KEY):
            await super()._apply_page_methods(page, request, spider)
            return
        for method in request.meta.get("playwright_page_methods") or ():
            if isinstance(method, PageMethod) and isinstance(method.method, str):
                result: Any = getattr(page, method.method)(*method.args, **method.kwargs)
                method.result = await result if asyncio.iscoroutine(result) else result
