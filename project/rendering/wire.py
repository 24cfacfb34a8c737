"""Playwright page methods on the frontier's JSON wire, limited to an allow-list.

Importing this module registers :class:`~scrapy_playwright.page.PageMethod`
with :mod:`project.frontier.wire`.
"""

from __future__ import annotations

from typing import Any

from scrapy_playwright.page import PageMethod

from project.frontier.wire import register_codec

__all__ = ["allow_page_method", "page_method_from_json", "page_method_to_json"]

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
