"""JSON wire format for requests in the shared frontier.

Requests travel through Redis as JSON, never pickle: whoever can write to
Redis must not be able to run code on every node. Callbacks and errbacks
travel by name, request classes only from an allow-list, and ``meta`` /
``cb_kwargs`` must be JSON-safe; anything else fails loudly at enqueue time,
naming the field.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from project.frontier.meta import (
    NODE_LOCAL_META_KEYS,
    SESSION_META_KEY,
    SESSION_OWNED_HEADERS,
    SESSION_OWNED_META,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Spider

__all__ = [
    "NODE_LOCAL_META",
    "RefusedValueError",
    "UnserializableRequestError",
    "check_meta",
    "decode_request",
    "encode_request",
    "loads",
    "register_meta_filter",
]

#: Meta keys that only make sense inside one process and are not sent.
NODE_LOCAL_META = frozenset({"download_latency", "download_timeout"}) | NODE_LOCAL_META_KEYS

_ALLOWED_CLASSES: dict[str, type[Request]] = {
    cls.__module__ + "." + cls.__name__: cls for cls in (Request, FormRequest, JsonRequest)
}

# Extension point for meta values that are not plain JSON (the Playwright
# integration registers PageMethod here): type -> (tag, to_json, from_json).
_CODECS: dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {}


# Meta keys that make a node import, call or write something: whoever can
# write to Redis must not reach them (scrapy-playwright imports a string
# page_init_callback; context kwargs can name files to read or write).
_UNSAFE_META = frozenset(
    {"playwright_page_init_callback", "playwright_page_event_handlers", "playwright_page"}
)
_UNSAFE_CONTEXT_KWARGS = frozenset(
    {"storage_state", "record_har_path", "record_video_dir", "user_data_dir", "downloads_path"}
)


# Checks of a request's meta against its URL, from the integrations (rendering):
# each returns the meta to send or use, or raises UnserializableRequestError.
_META_FILTERS: list[Callable[[dict[str, Any], str], dict[str, Any]]] = []


def register_meta_filter(check: Callable[[dict[str, Any], str], dict[str, Any]]) -> None:
    """Run ``check(meta, url)`` on the meta of every request sent, read back or seeded."""
    _META_FILTERS.append(check)


def check_meta(meta: dict[str, Any], url: str) -> dict[str, Any]:
    """Refuse meta that would let a Redis writer run code or touch files on a node."""
    unsafe = sorted(_UNSAFE_META & set(meta))
    context = meta.get("playwright_context_kwargs")
    if isinstance(context, dict):
        unsafe += [
            f"playwright_context_kwargs[{key!r}]"
            for key in sorted(_UNSAFE_CONTEXT_KWARGS & set(context))
        ]
    if unsafe:
        raise UnserializableRequestError(
            f"meta {', '.join(unsafe)} cannot travel through the frontier (it would let"
            " a Redis writer run code or touch files on every node)"
        )
    for check in _META_FILTERS:
        meta = check(meta, url)
    return meta


class UnserializableRequestError(ValueError):
    """A request cannot be written to the shared frontier."""


class RefusedValueError(UnserializableRequestError):
    """A tagged value (a page method) in a payload or seed that its codec refuses."""


def register_codec(
    cls: type, tag: str, to_json: Callable[[Any], Any], from_json: Callable[[Any], Any]
) -> None:
    """Allow values of *cls* in meta/cb_kwargs, stored as ``{"__tag__": to_json(v)}``."""
    _CODECS[cls] = (tag, to_json, from_json)


def allow_request_class(cls: type[Request]) -> None:
    """Allow a Request subclass to travel through the frontier."""
    _ALLOWED_CLASSES[cls.__module__ + "." + cls.__name__] = cls


# Modules of the spider base classes (Scrapy's, scrapy-redis', the fleet's): their
# methods are machinery (close, _set_crawler, start, ...), not callbacks, except
# these: parse, the two CrawlSpider sends its rules' requests to, and the one
# SitemapSpider reads robots.txt and sitemaps with.
_FRAMEWORK_MODULES = ("scrapy.", "scrapy_redis.", "project.")
_FRAMEWORK_CALLBACKS = frozenset({"parse", "_callback", "_errback", "_parse_sitemap"})


def _is_callback(spider: Spider, name: str) -> bool:
    """Whether a payload may name *name* as a callback or errback of *spider*.

    A plain function defined on the spider's class (not a staticmethod, class or
    attribute), not a dunder; a method of the spider's own code unless private,
    and of the framework's base classes only the callbacks they are made to be.
    """
    if not name.isidentifier() or name.startswith("__"):
        return False
    for owner in type(spider).__mro__:
        if name in vars(owner):
            if not inspect.isfunction(vars(owner)[name]):
                return False
            if owner.__module__.startswith(_FRAMEWORK_MODULES):
                return name in _FRAMEWORK_CALLBACKS
            return not name.startswith("_")
    return False


def _method_name(spider: Spider, func: Any, field: str, request: Request) -> str | None:
    if func is None or isinstance(func, str):
        return func
    name = getattr(func, "__name__", "")
    if getattr(func, "__self__", None) is spider and _is_callback(spider, name):
        return str(name)
    raise UnserializableRequestError(
        f"{request!r}: {field} {func!r} is not a public method of spider {spider.name!r}:"
        " make it a method of the spider class (a callback travels by name, so a lambda, a"
        " function, another object's method or Scrapy's own methods cannot be sent)"
    )


def _default(value: Any) -> Any:
    codec = _CODECS.get(type(value))
    if codec is None:
        raise TypeError(type(value).__name__)
    tag, to_json, _ = codec
    return {f"__{tag}__": to_json(value)}


def _find_unserializable(value: Any, path: str) -> str:
    """Return the path and type of the first value json cannot encode."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} key {key!r} ({type(key).__name__})"
            found = _find_unserializable(item, f"{path}[{key!r}]")
            if found:
                return found
        return ""
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _find_unserializable(item, f"{path}[{index}]")
            if found:
                return found
        return ""
    if value is None or isinstance(value, (str, int, float, bool)):
        return ""
    if type(value) in _CODECS:
        return ""
    return f"{path} ({type(value).__name__})"


def _object_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        (key,) = obj
        if key.startswith("__") and key.endswith("__"):
            tag = key[2:-2]
            for codec_tag, _, from_json in _CODECS.values():
                if codec_tag == tag:
                    try:
                        return from_json(obj[key])
                    except (TypeError, ValueError) as exc:
                        raise RefusedValueError(f"{key}: {exc}") from exc
    return obj


def loads(payload: bytes | str) -> Any:
    """JSON of a payload or a seed, registered values (page methods) rebuilt.

    Raises UnserializableRequestError for anything that is not such JSON: invalid
    text, a tagged value its codec refuses, a number or nesting too large to read.
    """
    try:
        return json.loads(payload, object_hook=_object_hook)
    except UnserializableRequestError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError too
        raise UnserializableRequestError(f"not a JSON payload: {str(exc)[:100]}") from exc


def _headers_to_json(headers: Iterable[tuple[bytes, list[bytes]]]) -> dict[str, list[str]]:
    return {
        key.decode("latin-1"): [value.decode("latin-1") for value in values]
        for key, values in headers
    }


def encode_request(request: Request, spider: Spider, **extra: Any) -> bytes:
    """Serialize *request* to compact JSON bytes; defaults are left out.

    *extra* adds frontier bookkeeping fields (``id``, ``attempts``). The URL comes first and
    *extra* last: a site's queue holds a payload without the ``{"url":"https://<site>`` it
    opens with and the ``,"id":"<12 hex digits>"}`` it closes with (lua/lib/site_queues.lua
    packs them into a few bytes, and gives the payload back as it was).
    """
    data: dict[str, Any] = {"url": request.url}
    callback = _method_name(spider, request.callback, "callback", request)
    if callback is not None and callback != "parse":
        data["callback"] = callback
    errback = _method_name(spider, request.errback, "errback", request)
    if errback is not None:
        data["errback"] = errback
    if request.method != "GET":
        data["method"] = request.method
    # a session's proxy, cookies and user agent stay with it (a retry gets its own), and a
    # proxy's credentials never reach Redis, whoever set them
    sessioned = bool(request.meta.get(SESSION_META_KEY))
    headers = [
        (name, values)
        for name, values in request.headers.items()
        if name.lower() != b"proxy-authorization"
        and not (sessioned and name.lower() in SESSION_OWNED_HEADERS)
    ]
    if headers:
        data["headers"] = _headers_to_json(headers)
    if request.body:
        try:
            data["body"] = request.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_b64"] = base64.b64encode(request.body).decode("ascii")
    if request.cookies:
        data["cookies"] = request.cookies
    meta = {
        k: v
        for k, v in request.meta.items()
        if k not in NODE_LOCAL_META and not (sessioned and k in SESSION_OWNED_META)
    }
    meta = check_meta(meta, request.url)
    if meta:
        data["meta"] = meta
    if request.encoding != "utf-8":
        data["encoding"] = request.encoding
    if request.priority:
        data["priority"] = request.priority
    if request.dont_filter:
        data["dont_filter"] = True
    if request.flags:
        data["flags"] = request.flags
    if request.cb_kwargs:
        data["cb_kwargs"] = request.cb_kwargs
    cls_path = type(request).__module__ + "." + type(request).__name__
    if type(request) is not Request:
        if cls_path not in _ALLOWED_CLASSES:
            raise UnserializableRequestError(
                f"{request!r}: request class {cls_path} is not allowed on the wire"
                " (see project.frontier.wire.allow_request_class)"
            )
        data["class"] = cls_path
    data.update(extra)
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=_default).encode(
            "utf-8"
        )
    except (TypeError, ValueError) as exc:
        where = _find_unserializable(data, "request") or str(exc)
        raise UnserializableRequestError(
            f"{request!r} cannot be sent through the frontier: {where} is not JSON-serializable"
            " (meta and cb_kwargs travel as JSON: keep to text, numbers, booleans, lists and"
            " dicts with text keys)"
        ) from exc


def _callback(spider: Spider, name: Any, field: str) -> Any:
    """The spider method a payload names; anything else is refused."""
    if name is None:
        return None
    if not isinstance(name, str) or not _is_callback(spider, name):
        raise UnserializableRequestError(
            f"{field} {str(name)[:80]!r} is not a public method of the spider"
        )
    return getattr(spider, name)


def _headers(value: Any) -> dict[str, list[bytes]] | None:
    """Headers as :func:`_headers_to_json` wrote them: text back to the bytes it was."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise UnserializableRequestError("headers must be an object")
    headers: dict[str, list[bytes]] = {}
    for key, values in value.items():
        items = [values] if isinstance(values, str) else values
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise UnserializableRequestError(f"header {key[:40]!r} must be text or a list of text")
        # latin-1 as written; text a person wrote may hold more, and goes out as UTF-8
        headers[key] = [_latin1_or_utf8(item) for item in items]
    return headers


def _latin1_or_utf8(text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


def _encoding(data: dict[str, Any]) -> str:
    encoding = _typed(data, "encoding", str, "utf-8")
    try:
        "x".encode(encoding)  # a text encoding Python has (not rot13, not base64)
    except (LookupError, ValueError) as exc:
        raise UnserializableRequestError(f"encoding {encoding[:40]!r}: {exc}") from exc
    return str(encoding)


def _typed(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = data.get(name, default)
    if value is default:
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UnserializableRequestError(f"{name} must be {getattr(kind, '__name__', kind)}")
    return value


def decode_request(payload: bytes | str, spider: Spider) -> tuple[Request, dict[str, Any]]:
    """Rebuild a request from :func:`encode_request` output.

    A payload is read back from Redis, where anyone with access may have written it:
    every field is checked, node-local meta is dropped, and a callback must name a
    method of the spider. Returns the request and the whole decoded document (for
    bookkeeping fields); raises UnserializableRequestError for a payload that does not fit.
    """
    data = loads(payload)
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise UnserializableRequestError("a payload is a JSON object with a url")
    class_path = data.get("class", "scrapy.http.request.Request")
    if not isinstance(class_path, str) or class_path not in _ALLOWED_CLASSES:
        raise UnserializableRequestError(f"request class {str(class_path)[:80]!r} is not allowed")
    cls = _ALLOWED_CLASSES[class_path]
    meta = _typed(data, "meta", dict, None)
    if meta is not None:
        meta = check_meta(meta, data["url"])
        meta = {k: v for k, v in meta.items() if k not in NODE_LOCAL_META}
    body: bytes | str = _typed(data, "body", str, b"")
    if "body_b64" in data:
        try:
            body = base64.b64decode(_typed(data, "body_b64", str, ""), validate=True)
        except binascii.Error as exc:
            raise UnserializableRequestError(f"body_b64: {exc}") from exc
    try:
        request = cls(
            url=data["url"],
            callback=_callback(spider, data.get("callback"), "callback"),
            errback=_callback(spider, data.get("errback"), "errback"),
            method=_typed(data, "method", str, "GET"),
            headers=_headers(data.get("headers")),
            body=body,
            cookies=_typed(data, "cookies", (dict, list), None),
            meta=meta,
            encoding=_encoding(data),
            priority=_typed(data, "priority", int, 0),
            dont_filter=_typed(data, "dont_filter", bool, False),
            flags=_typed(data, "flags", list, None),
            cb_kwargs=_typed(data, "cb_kwargs", dict, None),
        )
    except UnserializableRequestError:
        raise
    except (TypeError, ValueError, LookupError) as exc:  # what Request itself refuses
        raise UnserializableRequestError(f"not a request: {str(exc)[:200]}") from exc
    return request, data
