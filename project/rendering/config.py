"""The rendering settings: render rules, the browser's bounds, where Chromium is."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.rendering.wire import check_rule_page_method

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings
    from scrapy_playwright.page import PageMethod

__all__ = [
    "DEFAULT_CHROMIUM_PATH",
    "HEADLESS_SHELL_PATH",
    "RenderRule",
    "RenderingConfig",
    "RenderingConfigError",
    "parse_render_rules",
]

DEFAULT_CHROMIUM_PATH = "/usr/bin/chromium"
#: Debian's chromium-headless-shell: Chromium's old headless mode, the default of a headless
#: browser when it is installed: a fifth less memory and CPU than ``chromium --headless``
#: (docs/benchmarks.md, rendering).
HEADLESS_SHELL_PATH = "/usr/bin/chromium-headless-shell"


class RenderingConfigError(RuntimeError):
    """Rendering is misconfigured, so the node must not start.

    Not ``NotConfigured``: Scrapy answers that by disabling the component and
    crawling on, which would silently lose every JavaScript-only page.
    """


@dataclass(frozen=True)
class RenderRule:
    """Render requests whose URL matches ``pattern``, then run ``page_methods``.

    ``wait_for``: a CSS selector the render waits for instead of the page's ``load`` event;
    ``abort``: the resource types aborted instead of PLAYWRIGHT_ABORT_RESOURCES.
    """

    pattern: re.Pattern[str]
    page_methods: tuple[PageMethod, ...] = ()
    wait_for: str | None = None
    abort: frozenset[str] | None = None


#: What a rule given as a dict may say (``{"page_methods": [...], "wait_for": ...}``).
_RULE_KEYS = frozenset({"page_methods", "wait_for", "abort"})
#: Playwright's resource types (``Request.resource_type``).
RESOURCE_TYPES = frozenset(
    {
        "document", "stylesheet", "image", "media", "font", "script", "texttrack", "xhr",
        "fetch", "eventsource", "websocket", "manifest", "other",
    }
)  # fmt: skip


def _abort_types(value: Any, name: str) -> frozenset[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    types = frozenset(value)
    unknown = types - RESOURCE_TYPES
    if unknown or "document" in types:
        raise RenderingConfigError(
            f"{name}: {sorted(unknown) or ['document']} cannot be aborted; name resource types"
            f" of {', '.join(sorted(RESOURCE_TYPES - {'document'}))}"
        )
    return types


def _rule(pattern: str, spec: Any, name: str) -> RenderRule:
    wait_for = abort = None
    methods = spec
    if isinstance(spec, dict):
        unknown = set(spec) - _RULE_KEYS
        if unknown:
            raise TypeError(f"unknown keys {sorted(unknown)}; a rule takes {sorted(_RULE_KEYS)}")
        methods = spec.get("page_methods")
        wait_for = spec.get("wait_for")
        if wait_for is not None and not (isinstance(wait_for, str) and wait_for.strip()):
            raise TypeError("wait_for must be a CSS selector")
        if spec.get("abort") is not None:
            abort = _abort_types(spec["abort"], name)
    regex = re.compile(pattern)
    page_methods = tuple(check_rule_page_method(m) for m in methods or ())
    return RenderRule(regex, page_methods, wait_for, abort)


def parse_render_rules(value: Any, name: str = "PLAYWRIGHT_RENDER_URLS") -> tuple[RenderRule, ...]:
    """Rules from a list of URL regexes, or a dict of regex -> page methods.

    A string is a JSON list or dict (command line), or else a single regex.
    Page methods are ``PageMethod`` objects or their JSON form
    ``{"method": ..., "args": [...], "kwargs": {...}}``; a rule's value may also be a dict
    of ``page_methods``, ``wait_for`` (a CSS selector) and ``abort`` (resource types). Being code on the
    node, rules may run JavaScript (``evaluate``), which requests may not.
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
    for pattern, spec in items:
        try:
            rules.append(_rule(pattern, spec, name))
        except (re.error, TypeError, ValueError) as exc:
            raise RenderingConfigError(f"{name}: bad rule {pattern!r}: {exc}") from exc
    return tuple(rules)


def _default_chromium(launch_options: dict[str, Any]) -> str:
    """The headless shell for a headless browser when Debian's package is installed, else
    the full Chromium (which also renders headless, at more cost)."""
    headless = launch_options.get("headless", _LAUNCH_OPTIONS["headless"])
    if headless and shutil.which(HEADLESS_SHELL_PATH):
        return HEADLESS_SHELL_PATH
    return DEFAULT_CHROMIUM_PATH


#: Chromium's features on: the network service in the browser's process, then those Playwright
#: enables (Chromium reads the last --enable-features).
_ENABLED_FEATURES = (
    "--enable-features=NetworkServiceInProcess2,CDPScreenshotNewSurface,"
    "SkipListAccountsWithoutGaiaCookies"
)

_LAUNCH_OPTIONS = {
    "headless": True,
    "args": [
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        # Without these Chromium calls Google services, which closed networks refuse.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # The GPU process (software compositing with --disable-gpu) and the network service
        # run inside the browser's process: two processes fewer, and a tenth less CPU per
        # render without their messages (docs/benchmarks.md, rendering).
        "--in-process-gpu",
        _ENABLED_FEATURES,
    ],
}


def _check_playwright_settings(settings: BaseSettings) -> None:
    """What scrapy-playwright's handler would refuse, refused at start: the handler is built
    at the node's first render (project/rendering/download.py), not with the node."""
    if settings.get("PLAYWRIGHT_CDP_URL") and settings.get("PLAYWRIGHT_CONNECT_URL"):
        raise RenderingConfigError(
            "Set PLAYWRIGHT_CDP_URL or PLAYWRIGHT_CONNECT_URL, not both (scrapy-playwright"
            " connects to one browser)"
        )
    for name in (
        "PLAYWRIGHT_BROWSER_PROVIDER",
        "PLAYWRIGHT_ABORT_REQUEST",
        "PLAYWRIGHT_PROCESS_REQUEST_HEADERS",
    ):
        path = settings.get(name)
        if not isinstance(path, str) or not path:
            continue  # unset, None, or an object given as such
        module, _, attribute = path.rpartition(".")
        try:
            found = bool(module and attribute) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise RenderingConfigError(
                f"{name} = {path!r}: no module {module!r} to import it from (a dotted path"
                " to an object is expected)"
            )


@dataclass(frozen=True)
class RenderingConfig:
    """The rendering settings; docs/settings.md explains each.

    The ``export`` ones are scrapy-playwright's own settings: the add-on writes
    these fleet defaults (one browser per node, six pages, lazy start, heavy
    resources aborted) unless the project sets them.
    """

    chromium_path: str = setting(
        "PLAYWRIGHT_CHROMIUM_PATH",
        DEFAULT_CHROMIUM_PATH,
        shown="$FLEETCRAWL_CHROMIUM, else /usr/bin/chromium-headless-shell (headless, when"
        " installed) or /usr/bin/chromium",
    )
    rules: tuple[RenderRule, ...] = setting("PLAYWRIGHT_RENDER_URLS", (), shown="[]")
    browser_type: str = setting("PLAYWRIGHT_BROWSER_TYPE", "chromium", export=True)
    browser_provider: str = setting(
        "PLAYWRIGHT_BROWSER_PROVIDER", "project.rendering.browser.LazyBrowserProvider", export=True
    )
    launch_options: dict[str, Any] = setting(
        "PLAYWRIGHT_LAUNCH_OPTIONS", _LAUNCH_OPTIONS, export=True, shown="headless, flags below"
    )
    # One browser per node; pages share contexts (a context per page costs
    # twice the memory for less throughput: docs/benchmarks.md).
    max_contexts: int = setting("PLAYWRIGHT_MAX_CONTEXTS", 1, export=True)
    max_pages_per_context: int = setting("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT", 6, export=True)
    abort_request: str = setting(
        "PLAYWRIGHT_ABORT_REQUEST", "project.rendering.browser.abort_heavy_request", export=True
    )
    #: Milliseconds, as scrapy-playwright reads it: page.goto and each page method's load wait.
    navigation_timeout: float = setting(
        "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT", 30000.0, export=True
    )
    #: Seconds from a page's creation to its response, page methods included.
    render_timeout: float = setting("PLAYWRIGHT_RENDER_TIMEOUT", 60.0)
    #: Learn, per (site, URL path template, callback), whether pages need the browser.
    adaptive: bool = setting("PLAYWRIGHT_ADAPTIVE", False)
    #: Resource types no render downloads (a rule's ``abort`` replaces them for its pages).
    abort_resources: frozenset[str] = setting(
        "PLAYWRIGHT_ABORT_RESOURCES",
        frozenset({"image", "font", "media"}),
        shown="image, font, media",
    )
    #: MiB of resident memory past which the browser is closed, once its renders end, and
    #: launched again (0: never).
    max_rss: int = setting("PLAYWRIGHT_MAX_RSS", 1024)
    #: The keys of scrapy-playwright's PLAYWRIGHT_CONTEXTS, created at the node's first render.
    named_contexts: tuple[str, ...] = ()
    #: PLAYWRIGHT_CDP_URL or PLAYWRIGHT_CONNECT_URL is set: the browser runs elsewhere.
    remote: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Read and check the settings; raise RenderingConfigError when they cannot work."""
        launch_options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
        chromium = (
            launch_options.get("executable_path")
            or settings.get("PLAYWRIGHT_CHROMIUM_PATH")
            or os.environ.get("FLEETCRAWL_CHROMIUM")
            or _default_chromium(launch_options)
        )
        try:
            values = read_settings(
                cls,
                settings,
                chromium_path=chromium,
                rules=parse_render_rules(settings.get("PLAYWRIGHT_RENDER_URLS")),
                named_contexts=tuple(settings.getdict("PLAYWRIGHT_CONTEXTS")),
                remote=bool(
                    settings.get("PLAYWRIGHT_CDP_URL") or settings.get("PLAYWRIGHT_CONNECT_URL")
                ),
            )
        except NotConfigured as exc:
            raise RenderingConfigError(str(exc)) from exc
        config = cls(**values)
        _abort_types(config.abort_resources, "PLAYWRIGHT_ABORT_RESOURCES")
        if config.max_rss < 0:
            raise RenderingConfigError("PLAYWRIGHT_MAX_RSS must be 0 (off) or more MiB")
        if config.max_contexts < 1 or config.max_pages_per_context < 1:
            raise RenderingConfigError(
                "PLAYWRIGHT_MAX_CONTEXTS and PLAYWRIGHT_MAX_PAGES_PER_CONTEXT must be at least 1"
                " (unbounded browsers take all the memory of a node)"
            )
        if config.max_contexts <= len(config.named_contexts):
            raise RenderingConfigError(
                f"PLAYWRIGHT_MAX_CONTEXTS ({config.max_contexts}) must be more than the"
                f" {len(config.named_contexts)} contexts of PLAYWRIGHT_CONTEXTS: each holds a"
                " context for good, and the fleet's own renders need at least one more"
            )
        if config.render_timeout <= 0 or config.navigation_timeout <= 0:
            raise RenderingConfigError(
                "PLAYWRIGHT_RENDER_TIMEOUT and PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT must be"
                " above 0 (a render without a bound holds its page and its lease for ever)"
            )
        _check_playwright_settings(settings)
        return config

    @property
    def fleet_contexts(self) -> int:
        """How many contexts the fleet's renders are spread over (``fleet-0``, ...)."""
        return self.max_contexts - len(self.named_contexts)

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
