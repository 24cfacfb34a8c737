"""The browser side: Playwright started with the first render (Chromium is found at start by
project/rendering/launch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy_playwright.provider import PlaywrightBrowserProvider

from project.rendering.launch import chromium_sandboxed
from project.utils import child_processes

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page
    from playwright.async_api import Request as PlaywrightRequest
    from scrapy_playwright.handler import Config as PlaywrightConfig

__all__ = [
    "LazyBrowserProvider",
    "abort_heavy_request",
    "abort_types",
    "browser_memory",
]

logger = logging.getLogger(__name__)

#: The resource types each page aborts, set by the handler for each render (a render
#: rule's own, else PLAYWRIGHT_ABORT_RESOURCES).
abort_types: WeakKeyDictionary[Page, frozenset[str]] = WeakKeyDictionary()


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
        if self._local_chromium() and not chromium_sandboxed(self.config.launch_options):
            logger.warning(
                "Chromium runs without its sandbox (--no-sandbox) because %s: a page that"
                " exploits a bug of its renderer gets this node's rights. Run the node as a"
                " user other than root (the units in deploy/systemd do).",
                "this node runs as root, where the sandbox cannot start"
                if os.geteuid() == 0
                else "PLAYWRIGHT_LAUNCH_OPTIONS turn it off",
            )
        browser: Browser = await super().launch_browser()
        return browser

    async def launch_persistent_context(self, context_kwargs: dict[str, Any]) -> BrowserContext:
        """Start Playwright if needed, then launch a persistent context."""
        await self._start_playwright()
        context: BrowserContext = await super().launch_persistent_context(context_kwargs)
        return context

    def _local_chromium(self) -> bool:
        cfg = self.config
        return cfg.browser_type_name == "chromium" and not (cfg.cdp_url or cfg.connect_url)


def abort_heavy_request(request: PlaywrightRequest) -> bool:
    """PLAYWRIGHT_ABORT_REQUEST: the resource types of the page's render are not downloaded
    (images, fonts and media by default: they are never needed to build the DOM)."""
    try:
        types = abort_types.get(request.frame.page, frozenset())
    except Exception:  # noqa: BLE001 - a service worker's request has no frame
        return False
    return request.resource_type in types


def browser_memory(root: int | None = None) -> int:
    """Bytes of memory of the browsers under process *root* (this one): the proportional
    set size (shared pages counted once) of every descendant but Playwright's driver."""
    todo, total, seen = child_processes(str(root or os.getpid())), 0, set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += child_processes(pid)
        with contextlib.suppress(OSError, ValueError, IndexError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "node":
                continue  # Playwright's driver: it stays when the browser goes
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total
