"""Chromium found and its launch options set when the node starts: no Playwright imported.

The add-on calls :func:`use_system_chromium` while it sets the node up; Playwright itself
(project/rendering/handler.py, browser.py) is imported with the first render
(project/rendering/download.py).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from project.rendering.config import RenderingConfig

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "RENDER_RETRY_EXCEPTIONS",
    "PlaywrightFailure",
    "RenderingUnavailable",
    "chromium_sandboxed",
    "use_system_chromium",
]


class _PlaywrightErrorCheck(type):
    def __instancecheck__(cls, instance: object) -> bool:
        # Playwright is imported before any of its errors can exist: none while it is not
        errors = sys.modules.get("playwright._impl._errors")
        return errors is not None and isinstance(instance, errors.Error)

    def __subclasscheck__(cls, subclass: type) -> bool:
        errors = sys.modules.get("playwright._impl._errors")
        return errors is not None and issubclass(subclass, errors.Error)


class PlaywrightFailure(Exception, metaclass=_PlaywrightErrorCheck):
    """Never raised: ``isinstance(exc, PlaywrightFailure)`` is whether *exc* is Playwright's
    ``Error`` (``playwright.async_api.Error``, also the class of its TimeoutError and
    TargetClosedError), without importing Playwright to ask. Only ``isinstance`` and
    ``issubclass`` ask it: an ``except PlaywrightFailure`` clause catches nothing, and
    Twisted's ``Failure.check`` matches by name."""


class RenderingUnavailable(Exception):
    """scrapy-playwright could not start on this node: the render is retried through the
    fleet, where another node (or this one, later) may render it."""


#: What a failed render raises besides RenderTimeoutError, for RETRY_EXCEPTIONS: Scrapy's
#: retry middleware loads every name it lists at start, and ``playwright.async_api.Error``
#: would import Playwright on every node (about 70 ms of each start, with the handler's).
RENDER_RETRY_EXCEPTIONS = (
    "project.rendering.launch.PlaywrightFailure",
    "project.rendering.launch.RenderingUnavailable",
)

#: Chromium's renderer does not load images (PLAYWRIGHT_ABORT_RESOURCES with ``image``).
#: Playwright's own blink settings are repeated: Chromium reads the last --blink-settings.
_NO_IMAGES = (
    "--blink-settings=imagesEnabled=false,primaryHoverType=2,availableHoverTypes=2,"
    "primaryPointerType=4,availablePointerTypes=4"
)


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


def chromium_sandboxed(launch_options: dict[str, Any]) -> bool:
    """Whether Chromium launched with *launch_options* runs in its sandbox.

    Playwright passes ``--no-sandbox`` unless ``chromium_sandbox`` is true.
    """
    return bool(launch_options.get("chromium_sandbox")) and "--no-sandbox" not in (
        launch_options.get("args") or ()
    )
