"""The fleet's download handler for http and https: every download passes the permit gate
and the node's stop; a rendered one goes to Chromium through
:class:`~project.rendering.handler.BoundedPlaywrightHandler`, built at the first render.

scrapy-playwright's handler imports Playwright, and Scrapy imports every class of
``DOWNLOAD_HANDLERS`` when a node starts: a node that renders nothing, and every node until
its first render, imported Playwright for nothing (about 70 ms of each start). This handler
downloads plain requests with Scrapy's own HTTP/1.1 handler, as scrapy-playwright's does,
and imports Playwright with the first request that asks for the browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from scrapy import signals
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler

from project.frontier.gate import DownloadGate
from project.frontier.stopping import cut, downloads_cut
from project.rendering.launch import RenderingUnavailable
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response

    from project.rendering.handler import BoundedPlaywrightHandler

__all__ = ["FleetDownloadHandler"]

logger = logging.getLogger(__name__)

#: Seconds a download cut by the node's stop gets to clean up (a render closes its page).
_CUT_CLEANUP_SECONDS = 5.0
#: Seconds after a failed start of scrapy-playwright before a render tries it again.
_BUILD_AGAIN_AFTER = 60.0


class _Renderer:
    """The node's one BoundedPlaywrightHandler, shared by its http and https handlers (Scrapy
    builds a handler per scheme: two would run two browsers), built once."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.handler: BoundedPlaywrightHandler | None = None
        #: why the last build failed, and when
        self.failed: tuple[str, float] | None = None
        self.closed = False
        self._building: asyncio.Future[BoundedPlaywrightHandler] | None = None

    async def get(self) -> BoundedPlaywrightHandler:
        if self.handler is not None:
            return self.handler
        if self.closed:
            raise RenderingUnavailable("the node's download handlers are closed")
        if self.failed is not None:
            why, when = self.failed
            if time.monotonic() - when < _BUILD_AGAIN_AFTER:
                raise RenderingUnavailable(why)
            self.failed, self._building = None, None
        if self._building is None:
            self._building = asyncio.ensure_future(self._build())
        # shielded: one download cut by the node's stop does not cancel the build the other
        # renders wait for
        handler: BoundedPlaywrightHandler = await asyncio.shield(self._building)
        return handler

    async def _build(self) -> BoundedPlaywrightHandler:
        from project.rendering.handler import BoundedPlaywrightHandler

        handler: BoundedPlaywrightHandler = BoundedPlaywrightHandler.from_crawler(self.crawler)
        # built after engine_started: what scrapy-playwright connects to it is called here
        self.crawler.signals.disconnect(
            handler._maybe_launch_in_thread, signal=signals.engine_started
        )
        try:
            await handler._maybe_launch_in_thread()
        except Exception as exc:
            # whatever it started (Playwright's driver, a browser for PLAYWRIGHT_CONTEXTS) ends
            with contextlib.suppress(Exception):
                await asyncio.shield(handler.close())
            why = f"starting scrapy-playwright failed: {type(exc).__name__}: {exc}"[:500]
            self.failed = why, time.monotonic()
            self.crawler.stats.inc_value("playwright/start_failed")  # type: ignore[union-attr]
            logger.error(
                "Rendering is unavailable on this node for %g s (%s): rendered requests go"
                " back to the fleet as retries, plain ones are downloaded",
                _BUILD_AGAIN_AFTER,
                why,
            )
            raise RenderingUnavailable(why) from exc
        self.handler = handler
        return handler

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._building is not None:
            await asyncio.wait((self._building,))  # a build under way ends first (or fails)
        if self.handler is not None:
            await self.handler.close()


_RENDERERS: WeakKeyDictionary[Crawler, _Renderer] = WeakKeyDictionary()


class FleetDownloadHandler(HTTP11DownloadHandler):
    """Plain or rendered, a leased request goes on the wire only while its node holds a
    permit for it: a stall can end with it in Scrapy's download slot, past the middleware's
    gate (project/frontier/gate.py). A download still running when the node's stop grace
    ends is cut: its lease goes back to the fleet."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._crawler = crawler
        self._gate = DownloadGate(crawler)
        #: Done when the node's stop grace is over (project/frontier/stopping.py).
        self._cut: asyncio.Future[float] | None = None
        crawler.signals.connect(self._downloads_cut, signal=downloads_cut)
        self._renderer = _RENDERERS.setdefault(crawler, _Renderer(crawler))

    def _stop_cut(self) -> asyncio.Future[float]:
        """Done, with the grace, once the node's stop grace is over."""
        if self._cut is None:
            self._cut = asyncio.get_running_loop().create_future()
        return self._cut

    def _downloads_cut(self, grace: float) -> None:
        stop = self._stop_cut()
        if not stop.done():
            stop.set_result(grace)

    async def download_request(self, request: Request) -> Response:
        """Download *request* once its node may, unless the node's stop cuts it."""
        await self._gate.wait(request)
        if logger.isEnabledFor(logging.DEBUG):
            # the last gate: what comes after it goes on the wire, even across a stall
            logger.debug("Download passes the permit gate: %s", mask_url(request.url))
        stop = self._stop_cut()
        if stop.done():
            raise cut(request, stop.result())
        download = asyncio.ensure_future(self._download(request))
        try:
            await asyncio.wait((download, stop), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            download.cancel()  # this download itself was cancelled: not left running
            raise
        if not download.done():
            download.cancel()
            # its clean-up (a render's page closed) runs before the node closes on
            await asyncio.wait((download,), timeout=_CUT_CLEANUP_SECONDS)
            self._crawler.stats.inc_value("fleet/stop/cut")  # type: ignore[union-attr]
            logger.info(
                "Download cut by the node's stop: %s goes back to the fleet", mask_url(request.url)
            )
            raise cut(request, stop.result())
        response: Response = download.result()
        return response

    async def _download(self, request: Request) -> Response:
        if request.meta.get("playwright"):
            renderer = await self.renderer()
            rendered: Response = await renderer.download_request(request)
            return rendered
        return await super().download_request(request)

    async def renderer(self) -> BoundedPlaywrightHandler:
        """The node's scrapy-playwright handler (the fleet's), built and started at the first
        call of any of its handlers; RenderingUnavailable for a minute after a build failed."""
        return await self._renderer.get()

    async def close(self) -> None:
        """Close the HTTP/1.1 connection pool, and the browser when one was started."""
        try:
            await super().close()
        finally:
            await self._renderer.close()
