"""scrapy-playwright's download handler, with a bound on every render.

The bound overrides scrapy-playwright's private ``_download_request_with_page``:
``tests/test_rendering_contract.py`` fails with what to do when a release changes it,
and pyproject.toml admits only the releases that test passed on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from scrapy.exceptions import DownloadTimeoutError
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

from project.rendering.config import RenderingConfig

if TYPE_CHECKING:
    from playwright.async_api import Page
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["RENDER_RETRY_EXCEPTIONS", "BoundedPlaywrightHandler", "RenderTimeoutError"]

#: What a failed render raises besides RenderTimeoutError, for RETRY_EXCEPTIONS:
#: Playwright's Error is also the class of its TimeoutError and TargetClosedError.
RENDER_RETRY_EXCEPTIONS = ("playwright.async_api.Error",)


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
        self.render_timeout = RenderingConfig.from_settings(crawler.settings).render_timeout

    async def _download_request_with_page(
        self, request: Request, page: Page, spider: Spider
    ) -> Response:
        # scrapy-playwright closes the page of a render that raises (unless the
        # request keeps its page), so a timeout frees the page like any failure.
        bound = min(self.render_timeout, float(request.meta.get("download_timeout") or "inf"))
        timer = asyncio.timeout(bound)
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
        return response
