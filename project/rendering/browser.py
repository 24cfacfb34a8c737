"""The browser side: Chromium found at start, Playwright started with the first render."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy_playwright.provider import PlaywrightBrowserProvider

from project.rendering.config import RenderingConfig

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page
    from playwright.async_api import Request as PlaywrightRequest
    from scrapy.settings import BaseSettings
    from scrapy_playwright.handler import Config as PlaywrightConfig

#: Chromium's renderer does not load images (PLAYWRIGHT_ABORT_RESOURCES with ``image``).
#: Playwright's own blink settings are repeated: Chromium reads the last --blink-settings.
_NO_IMAGES = (
    "--blink-settings=imagesEnabled=false,primaryHoverType=2,availableHoverTypes=2,"
    "primaryPointerType=4,availablePointerTypes=4"
)

__all__ = [
    "LazyBrowserProvider",
    "abort_heavy_request",
    "abort_types",
    "browser_memory",
    "child_processes",
    "chromium_sandboxed",
    "use_system_chromium",
]

logger = logging.getLogger(__name__)

#: The resource types each page aborts, set by the handler for each render (a render
#: rule's own, else PLAYWRIGHT_ABORT_RESOURCES).
abort_types: WeakKeyDictionary[Page, frozenset[str]] = WeakKeyDictionary()


def use_system_chromium(settings: BaseSettings) -> None:
    """Point Playwright at the system's Chromium (``executable_path``); raise if it is missing.

    Called by the add-on before the settings are frozen, so ``-s
    PLAYWRIGHT_CHROMIUM_PATH=...`` reaches the launch options, and a node
    without Chromium stops at start instead of crawling on without JavaScript.
    Chromium's sandbox is on (Playwright's ``chromium_sandbox``) unless the
    node runs as root, where it cannot start, or the launch options say otherwise.
    Images are off in the renderer when PLAYWRIGHT_ABORT_RESOURCES names them and no
    render rule of the settings lets them through.
    """
    config = RenderingConfig.from_settings(settings)
    if config.remote or config.browser_type != "chromium":
        return
    options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    options["executable_path"] = config.find_chromium()
    options.setdefault("chromium_sandbox", os.geteuid() != 0)
    if "image" in config.abort_resources and not any(
        rule.abort is not None and "image" not in rule.abort for rule in config.rules
    ):
        # images never asked for at all: an aborted one costs a round trip through Python
        args = list(options.get("args") or ())
        if not any(str(arg).startswith("--blink-settings") for arg in args):
            options["args"] = [*args, _NO_IMAGES]
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


def chromium_sandboxed(launch_options: dict[str, Any]) -> bool:
    """Whether Chromium launched with *launch_options* runs in its sandbox.

    Playwright passes ``--no-sandbox`` unless ``chromium_sandbox`` is true.
    """
    return bool(launch_options.get("chromium_sandbox")) and "--no-sandbox" not in (
        launch_options.get("args") or ()
    )


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


def child_processes(pid: str) -> list[str]:
    """The ids of *pid*'s child processes, from /proc (none when it is gone)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += (task / "children").read_text().split()
    return found
