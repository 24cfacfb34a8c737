"""What adaptive rendering compares: a URL's pattern, and what a callback yielded from a page.

A pattern is (site, path template, callback): ``https://shop/product/123?x=1`` parsed by
``parse_product`` is ``shop``, ``/product/{n}``, ``parse_product``. What a callback
yielded is summed up small enough to travel in a request's meta through Redis: each item
as its fields, each value normalised (whitespace collapsed, numbers read as numbers) and
hashed, and the links it followed, hashed. Two summaries agree when they hold the same
items and the same links to within a few (:func:`agree`).
"""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from itemadapter import ItemAdapter, is_item
from scrapy import Request

from project.frontier.sites import site_of

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Summary", "agree", "callback_name", "path_template", "pattern_key", "summarize"]

#: Items and links a summary keeps: enough to compare a page, small enough for a meta.
_MOST_ITEMS = 20
_MOST_LINKS = 300
#: Links two summaries may differ by and still agree: a few, or this share of the larger.
_LINKS_SLACK = 3
_LINKS_SLACK_SHARE = 0.1
#: Path segments a template keeps; a longer path is cut (``/{...}``).
_MOST_SEGMENTS = 6
_LONG_SEGMENT = 40
#: How deep, how wide and how long a field's value is looked at.
_DEEPEST = 8
_WIDEST = 100
_LONGEST = 20_000
_DIGITS = re.compile(r"\d+")
_WORDS = re.compile(r"[-_+. ]+|%20")
_SLUG_WORDS = 3
_HEXLIKE = re.compile(r"^(?=.*\d)[0-9a-fA-F-]{16,}$")
_NUMBER = re.compile(r"\d[\d,.\u00a0 ]*\d|\d")
_SPACE = re.compile(r"\s+")

#: {"i": [[hash of "field=value", ...] per item], "f": [[field, ...] per item], "l": [link
#: hash, ...], "n": links yielded}: JSON, for a request's meta.
Summary = dict[str, Any]


def callback_name(request: Request) -> str:
    """The name of the callback that will parse *request*'s response (``parse`` by default)."""
    callback = request.callback
    if callback is None:
        return "parse"
    return str(getattr(callback, "__name__", "parse"))


def path_template(url: str) -> str:
    """*url*'s path with what varies page to page left out: digit runs become ``{n}``, ids
    and very long segments ``{id}``, slugs of three words or more ``{slug}``; the query is
    not part of it."""
    try:
        path = urlsplit(url).path or "/"
    except ValueError:
        return "/"
    segments = path.split("/")
    out = []
    for segment in segments[1 : _MOST_SEGMENTS + 1]:
        if _HEXLIKE.match(segment) or len(segment) > _LONG_SEGMENT:
            out.append("{id}")
        elif len(_WORDS.split(segment)) >= _SLUG_WORDS:
            out.append("{slug}")  # /product/blue-cotton-shirt: one template, not one a page
        else:
            out.append(_DIGITS.sub("{n}", segment))
    if len(segments) > _MOST_SEGMENTS + 1:
        out.append("{...}")
    return "/" + "/".join(out)


def pattern_key(url: str, callback: str) -> str:
    """``<site>\\t<path template>\\t<callback>``: the unit adaptive rendering decides for."""
    template = path_template(url).replace("\t", " ").replace("\n", " ")
    return f"{site_of(url)}\t{template}\t{callback}"


def _number(text: str) -> str:
    digits = text.replace("\u00a0", "").replace(" ", "")
    if "," in digits and "." in digits:
        # the last separator is the decimal one: 1,299.50 and 1.299,50
        digits = digits.replace("," if digits.rfind(".") > digits.rfind(",") else ".", "")
    digits = digits.replace(",", ".") if digits.count(",") == 1 else digits.replace(",", "")
    try:
        return format(Decimal(digits).normalize(), "f")
    except InvalidOperation:
        return digits


def _normal(value: Any, depth: int = 0) -> str | None:
    """A value as compared: None, empty text and empty lists are no value. Values deeper
    than _DEEPEST, or longer than _LONGEST, are compared by what fits."""
    if value is None:
        return None
    if depth >= _DEEPEST:
        return "..."
    if isinstance(value, (list, tuple)):
        parts = [n for n in (_normal(v, depth + 1) for v in value[:_WIDEST]) if n is not None]
        return "[" + "|".join(parts) + "]" if parts else None
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))[:_WIDEST]
        parts = [f"{k}:{n}" for k, v in items if (n := _normal(v, depth + 1)) is not None]
        return "{" + "|".join(parts) + "}" if parts else None
    text = _SPACE.sub(" ", str(value)[:_LONGEST]).strip()
    if not text:
        return None
    return _NUMBER.sub(lambda m: _number(m.group()), text)


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def summarize(url: str, output: Iterable[Any], ignore_fields: frozenset[str]) -> Summary:
    """The summary of what a callback yielded for the page at *url*.

    A request for the page itself (a spider asking for a render of it) is no link.
    """
    items: list[list[str]] = []
    fields: list[list[str]] = []
    links: set[str] = set()
    n_links = 0
    for thing in output:
        if isinstance(thing, Request):
            if thing.url != url:
                n_links += 1
                if len(links) < _MOST_LINKS:
                    links.add(_hash(thing.url))
        elif is_item(thing) and len(items) < _MOST_ITEMS:
            present = {}
            for name, value in ItemAdapter(thing).items():
                if name not in ignore_fields and (normal := _normal(value)) is not None:
                    present[name] = normal
            items.append(sorted(_hash(f"{k}={v}") for k, v in present.items()))
            fields.append(sorted(present))
    return {"i": sorted(items), "f": fields, "l": sorted(links), "n": n_links}


def agree(plain: Summary, browser: Summary) -> bool:
    """Whether the plain fetch found what the browser found: the same items (the same fields,
    equal after normalising), and the same links to within a few."""
    if plain.get("i") != browser.get("i"):
        return False
    ours, theirs = set(plain.get("l") or ()), set(browser.get("l") or ())
    slack = max(_LINKS_SLACK, _LINKS_SLACK_SHARE * max(len(ours), len(theirs)))
    return len(ours ^ theirs) <= slack


def fields_of(summary: Summary) -> list[str]:
    """The fields every item of *summary* has."""
    per_item = [set(f) for f in summary.get("f") or ()]
    return sorted(set.intersection(*per_item)) if per_item else []
