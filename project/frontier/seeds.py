"""Validation of seeds pushed with ``redis-cli lpush <spider>:start_urls``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from project.frontier.sites import MAX_URL_LENGTH, url_refusal
from project.frontier.wire import (
    NODE_LOCAL_META,
    RefusedValueError,
    UnserializableRequestError,
    check_meta,
    loads,
)

__all__ = ["MAX_PRIORITY", "InvalidSeed", "Seed", "parse_seed", "preview"]

_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
#: Queue scores keep priorities within this, so a seed's must be too.
MAX_PRIORITY = 100_000
_FIELDS = frozenset({"url", "priority", "meta", "method", "headers", "body"})


class InvalidSeed(ValueError):
    """A seed that cannot become a request; ``code`` names the reason for stats."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Seed:
    """A validated seed."""

    url: str
    priority: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    method: str = "GET"
    headers: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    #: scrapy-redis' seeds: the fields it does not know are form data (a ``FormRequest``).
    formdata: dict[str, str | list[str]] = field(default_factory=dict)


def preview(raw: bytes, limit: int = 200) -> str:
    """A short, printable excerpt of a raw seed for logs and dead letters."""
    text = raw[:limit].decode("utf-8", errors="backslashreplace")
    return text + (f"... ({len(raw)} bytes)" if len(raw) > limit else "")


#: What a seed's URL is told, by the frontier's reason to refuse it (sites.url_refusal).
_URL_REFUSALS = {
    "too_long": f"url longer than {MAX_URL_LENGTH} characters",
    "invalid": "url does not parse as a URL with a host (and a port in range, if any)",
    "scheme": "url must be an absolute http(s) URL",
}


def _check_url(url: Any) -> str:
    if not isinstance(url, str):
        raise InvalidSeed("url_type", f"url must be a string, not {type(url).__name__}")
    text: str = url.strip()
    # The same rule as for every request the scheduler queues.
    refusal = url_refusal(text)
    if refusal is not None:
        raise InvalidSeed("url", _URL_REFUSALS[refusal])
    return text


def _from_json(text: str, formdata: bool) -> Seed:
    try:
        # as the node reads payloads: page methods in meta are rebuilt, and checked, here
        doc = loads(text)
    except RefusedValueError as exc:  # a page method the rendering wire refuses
        raise InvalidSeed("meta", str(exc)) from exc
    except UnserializableRequestError as exc:
        cause = exc.__cause__
        if isinstance(cause, json.JSONDecodeError):
            raise InvalidSeed("json", f"invalid JSON: {cause.msg} at char {cause.pos}") from exc
        # a number of thousands of digits, objects nested thousands deep, a bad page method
        raise InvalidSeed("json", str(exc)) from exc
    if not isinstance(doc, dict):
        raise InvalidSeed("json", "a JSON seed must be an object")
    unknown = [name for name in doc if name not in _FIELDS]  # form fields keep their order
    form: dict[str, str | list[str]] = {}
    if unknown and not formdata:
        raise InvalidSeed("field", f"unknown field(s) {', '.join(sorted(unknown))}")
    for name in unknown:
        value = doc[name]
        if not isinstance(value, str) and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise InvalidSeed(
                "field", f"form field {name[:40]!r} must be a string or a list of strings"
            )
        form[name] = value
    priority = doc.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidSeed("priority", "priority must be an integer")
    if abs(priority) > MAX_PRIORITY:
        raise InvalidSeed(
            "priority", f"priority must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"
        )
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise InvalidSeed("meta", "meta must be an object")
    url = _check_url(doc.get("url"))
    try:
        meta = check_meta(meta, url)
    except UnserializableRequestError as exc:
        raise InvalidSeed("meta", str(exc)) from exc
    reserved = sorted(NODE_LOCAL_META & set(meta))
    if reserved:
        raise InvalidSeed("meta", f"meta {', '.join(reserved)} is set by the node, not by a seed")
    method = doc.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise InvalidSeed("method", f"method must be one of {', '.join(sorted(_METHODS))}")
    headers = doc.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
        for v in headers.values()
    ):
        raise InvalidSeed("headers", "headers must map names to strings or lists of strings")
    body = doc.get("body", "")
    if not isinstance(body, str):
        raise InvalidSeed("body", "body must be a string")
    return Seed(
        url=url,
        priority=priority,
        meta=meta,
        method=method.upper(),
        headers=headers,
        body=body,
        formdata=form,
    )


def parse_seed(
    raw: bytes, max_bytes: int, *, encoding: str = "utf-8", formdata: bool = False
) -> Seed:
    """Validate one raw seed: a plain URL or a JSON object.

    *encoding* decodes it (scrapy-redis' ``REDIS_ENCODING``); with *formdata*, the fields
    of a JSON seed that are not a request's are form data, as scrapy-redis reads them.
    """
    if len(raw) > max_bytes:
        raise InvalidSeed("too_large", f"seed of {len(raw)} bytes exceeds {max_bytes}")
    try:
        text = raw.decode(encoding).strip()
    except UnicodeDecodeError as exc:
        raise InvalidSeed("encoding", f"seed is not valid {encoding} ({exc.reason})") from exc
    except LookupError as exc:
        raise InvalidSeed("encoding", f"unknown REDIS_ENCODING {encoding!r}") from exc
    if not text:
        raise InvalidSeed("empty", "empty seed")
    if text.startswith("{"):
        return _from_json(text, formdata)
    if any(ch.isspace() for ch in text):
        raise InvalidSeed("url", "a plain seed must be one URL without spaces")
    return Seed(url=_check_url(text))
