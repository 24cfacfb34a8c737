"""Playwright meta on the frontier's JSON wire: what a Redis writer may ask of Chromium.

Importing this module registers :class:`~scrapy_playwright.page.PageMethod`
with :mod:`project.frontier.wire`, and :func:`meta_for_wire` as a check of
every request's meta against its URL. The rules:

- page methods come from an allow-list; none of them touches the node's files;
- ``goto`` only to an http(s) URL on the request's own site (``reload``,
  ``go_back`` and ``go_forward`` take no URL; ``wait_for_url`` waits, it does
  not navigate);
- methods that run JavaScript (``evaluate``, ``wait_for_function``) never
  travel: a payload in Redis cannot be told from one a stranger wrote. They
  come from render rules, code on the node, which the rendering middleware
  applies after the frontier; what a rule added is left out when the request
  is sent again (a retry), and the rule applies again there;
- process-local meta (``playwright_include_page``, a page object) is refused.
"""

from __future__ import annotations

import reprlib
from typing import Any
from urllib.parse import urlsplit

from scrapy_playwright.page import PageMethod

from project.frontier.sites import site_of
from project.frontier.wire import UnserializableRequestError, register_codec, register_meta_filter

__all__ = [
    "ABORT_META_KEY",
    "ADAPTIVE_META_KEY",
    "JAVASCRIPT_PAGE_METHODS",
    "PROCESS_LOCAL_META",
    "RULE_META_KEY",
    "TWIN_META_KEY",
    "WAITS_META_KEY",
    "WAIT_FOR_META_KEY",
    "allow_page_method",
    "check_rule_page_method",
    "meta_for_wire",
    "page_method_from_json",
    "page_method_to_json",
]

# Page methods that may travel through Redis. None of them touches the node's
# files (no path=, no set_input_files) or runs JavaScript of the payload's.
_WIRE_PAGE_METHODS: set[str] = {
    "bring_to_front",
    "check",
    "click",
    "dblclick",
    "dispatch_event",
    "emulate_media",
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
    "wait_for_load_state",
    "wait_for_selector",
    "wait_for_timeout",
    "wait_for_url",
}
#: Page methods whose argument is JavaScript: only in render rules, never on the wire.
JAVASCRIPT_PAGE_METHODS = frozenset({"evaluate", "wait_for_function"})
_FILE_KWARGS = frozenset({"path"})
#: What scrapy-playwright passes on to the page.goto of the request's own URL.
_GOTO_KWARGS = frozenset({"timeout", "wait_until", "referer"})
_SCHEMES = frozenset({"http", "https"})

#: Meta that only means something in the process that set it; never sent or read back.
PROCESS_LOCAL_META = frozenset({"playwright_include_page", "playwright_page"})

#: request.meta key where the rendering middleware lists the meta keys it set (a render
#: rule's ``playwright`` and page methods, a fleet context): left out on the wire.
RULE_META_KEY = "_render_rule_keys"
#: A render rule's resource types to abort, and the CSS selector its render waits for.
ABORT_META_KEY = "_render_abort"
WAIT_FOR_META_KEY = "_render_wait_for"
#: The adaptive role of a fetch, ``{"k": pattern, "r": role}`` (project/rendering/plan.py).
ADAPTIVE_META_KEY = "_render_adaptive"
#: A sample's browser twin: ``{"k": pattern, "p": the plain fetch's summary, "w": why}``;
#: it travels through Redis (another node may render it).
TWIN_META_KEY = "render_twin"
#: Times a request went back to the fleet to wait for its pattern's answer (it travels).
WAITS_META_KEY = "render_waits"

_PAGE_METHODS_KEY = "playwright_page_methods"
_CODEC_TAG = "page_method"


def allow_page_method(name: str) -> None:
    """Allow ``PageMethod(name, ...)`` in requests that travel through the frontier."""
    if name in JAVASCRIPT_PAGE_METHODS:
        raise ValueError(f"{name!r} runs JavaScript: put it in a render rule instead")
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
    name, args, kwargs = _parts(data)
    _check_page_method(name, kwargs)
    return PageMethod(name, *args, **kwargs)


def check_rule_page_method(value: Any) -> PageMethod:
    """A render rule's page method: a PageMethod or its JSON form, JavaScript allowed.

    Rules are code on the node, so they may run JavaScript; they still name a
    Page method of the allow-list and write no files.
    """
    if isinstance(value, PageMethod):
        if not isinstance(value.method, str):
            raise TypeError(f"PageMethod({value.method!r}): name a Page method")
        name, kwargs = value.method, value.kwargs
    else:
        name, args, kwargs = _parts(value)
        value = PageMethod(name, *args, **kwargs)
    _check_page_method(name, kwargs, javascript=True)
    return value


def meta_for_wire(meta: dict[str, Any], url: str) -> dict[str, Any]:
    """The Playwright meta of a request to *url* that may be sent or read back.

    Leaves out what the rendering middleware set (it sets it again after the
    frontier); raises UnserializableRequestError for process-local meta, a
    page method off the allow-list, a ``goto`` that leaves the request's site
    and ``playwright_page_goto_kwargs`` other than its timeout, wait and referer.
    """
    local = sorted(PROCESS_LOCAL_META & set(meta))
    if local:
        raise UnserializableRequestError(
            f"meta {', '.join(local)} cannot travel through the frontier (it holds a page"
            " that only exists in one process, which no one would ever close)"
        )
    if RULE_META_KEY in meta:
        added, dropped = meta[RULE_META_KEY], {RULE_META_KEY}
        if isinstance(added, list):
            dropped.update(key for key in added if isinstance(key, str))
        meta = {key: value for key, value in meta.items() if key not in dropped}
    goto_kwargs = meta.get("playwright_page_goto_kwargs")
    if goto_kwargs is not None and not (
        isinstance(goto_kwargs, dict) and set(goto_kwargs) <= _GOTO_KWARGS
    ):
        raise UnserializableRequestError(
            f"meta playwright_page_goto_kwargs takes only {', '.join(sorted(_GOTO_KWARGS))}"
        )
    methods = meta.get(_PAGE_METHODS_KEY)
    if isinstance(methods, dict):
        methods = list(methods.values())
    if methods is not None and not isinstance(methods, list):
        raise UnserializableRequestError(f"meta {_PAGE_METHODS_KEY} must be a list")
    for method in methods or ():
        _check_wire_method(method, url)
    return meta


def _parts(data: Any) -> tuple[str, list[Any], dict[str, Any]]:
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("method"), str)
        or not isinstance(data.get("args", []), list)
        or not isinstance(data.get("kwargs", {}), dict)
        or set(data) - {"method", "args", "kwargs"}
    ):
        raise TypeError(f"not a page method: {reprlib.repr(data)}")
    return data["method"], data.get("args", []), data.get("kwargs", {})


def _check_page_method(name: str, kwargs: dict[str, Any], *, javascript: bool = False) -> None:
    if name in JAVASCRIPT_PAGE_METHODS:
        if not javascript:
            raise TypeError(
                f"PageMethod {name!r} runs JavaScript, which never travels through the frontier:"
                " put it in a render rule (PLAYWRIGHT_RENDER_URLS or the spider's render_urls)"
            )
    elif name not in _WIRE_PAGE_METHODS:
        raise TypeError(
            f"PageMethod {name[:80]!r} is not allowed on the wire"
            " (see project.rendering.wire.allow_page_method)"
        )
    if _FILE_KWARGS & set(kwargs):
        raise TypeError(f"PageMethod {name!r} must not write files on the node (path=)")


def _check_wire_method(method: Any, url: str) -> None:
    """A page method of a request to *url* is allowed on the wire; a ``goto`` stays on its site."""
    try:
        if isinstance(method, PageMethod):
            if not isinstance(method.method, str):
                return  # a callable: the codec refuses it, naming it
            name, args, kwargs = method.method, list(method.args), method.kwargs
        elif isinstance(method, dict) and set(method) == {f"__{_CODEC_TAG}__"}:
            # a seed's meta, not decoded yet
            name, args, kwargs = _parts(method[f"__{_CODEC_TAG}__"])
        else:
            return  # scrapy-playwright ignores anything that is not a PageMethod
        _check_page_method(name, kwargs)
    except TypeError as exc:
        raise UnserializableRequestError(str(exc)) from exc
    if name == "goto":
        _check_goto(args[0] if args else kwargs.get("url"), url)


def _check_goto(target: Any, url: str) -> None:
    if not isinstance(target, str):
        raise UnserializableRequestError("PageMethod 'goto' needs a URL string")
    try:
        scheme = urlsplit(target).scheme
    except ValueError as exc:
        raise UnserializableRequestError(f"PageMethod 'goto': {exc}") from exc
    site = site_of(target)
    if scheme not in _SCHEMES or site == "_" or site != site_of(url):
        raise UnserializableRequestError(
            f"PageMethod 'goto' to {target[:200]!r} leaves the request's site"
            f" ({site_of(url)}): only http(s) URLs on that site may be opened"
        )


register_codec(PageMethod, _CODEC_TAG, page_method_to_json, page_method_from_json)
register_meta_filter(meta_for_wire)
