"""Records as MongoDB documents: bounded copies of raw items, the encoding check, times in ms."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from bson.errors import BSONError

__all__ = [
    "MAX_BSON_SIZE",
    "bounded",
    "content_hash",
    "escape_key",
    "from_ms",
    "safe_text",
    "stored_ms",
    "to_ms",
    "unencodable",
]

#: MongoDB's (and FerretDB's) largest document, unless the server's ``hello`` says otherwise.
MAX_BSON_SIZE = 16 * 1024 * 1024

# A copy of a raw item kept with its reject: at most this much of it, whatever it holds.
_MAX_TEXT = 2000
_MAX_KEY = 200
_MAX_ITEMS = 100
_MAX_DEPTH = 8
_MAX_NODES = 2000
_INT64 = 2**63
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(seen: float) -> int:
    """A Unix time as MongoDB stores it: whole milliseconds."""
    return math.floor(seen * 1000)


def from_ms(ms: int) -> datetime:
    """The ``datetime`` MongoDB stores for *ms*, exactly."""
    return _EPOCH + timedelta(milliseconds=ms)


def stored_ms(value: object) -> int | None:
    """Milliseconds of a ``datetime`` read back from MongoDB (None if it is not one)."""
    if not isinstance(value, datetime):
        return None
    moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def unencodable(doc: Mapping[str, Any], max_size: int = MAX_BSON_SIZE) -> str | None:
    """Why pymongo cannot send *doc* (not BSON, too deep, too large), or None if it can."""
    try:
        size = len(bson.encode(doc))
    except (BSONError, OverflowError, RecursionError, TypeError, ValueError) as exc:
        # UnicodeEncodeError (a lone surrogate) is a ValueError; DocumentTooLarge a BSONError.
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    if size > max_size:
        return f"DocumentTooLarge: {size} bytes, the server takes at most {max_size}"
    return None


def bounded(value: object) -> Any:
    """A JSON- and BSON-safe copy of *value* that costs at most a few hundred KB.

    Text is cut at 2,000 characters and lone surrogates replaced, containers at 100 entries and
    8 levels, the whole at 2,000 values; integers beyond 64 bits, other objects and lists inside
    lists become text;
    keys become text without NUL, with a leading ``$`` and every ``.`` replaced by their
    full-width forms (U+FF04, U+FF0E: MongoDB reads those as operators and paths).
    """
    return _Bounded().copy(value, 0)


class _Bounded:
    def __init__(self) -> None:
        self.nodes = 0

    def copy(self, value: object, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            return "<truncated>"
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            number = int.__int__(value)  # not a subclass's own __int__
            return number if -_INT64 <= number < _INT64 else f"<int of {number.bit_length()} bits>"
        if isinstance(value, float):
            real = float.__float__(value)
            return real if math.isfinite(real) else str(real)
        if isinstance(value, str):
            return _text(str.__str__(value), _MAX_TEXT)
        if isinstance(value, Mapping | list | tuple | set | frozenset):
            if depth >= _MAX_DEPTH:
                return "<too deep>"
            try:
                return self.container(value, depth)
            except Exception:  # noqa: BLE001 (a hostile items() or __iter__: its type is all we keep)
                return f"<{type(value).__name__}>"
        try:
            return _text(str(value), _MAX_TEXT)
        except Exception:  # noqa: BLE001 (a hostile __str__: the type is all we keep)
            return f"<{type(value).__name__}>"

    def container(self, value: Any, depth: int) -> Any:
        if isinstance(value, Mapping):
            pairs = list(value.items())
            copied = {_key(k): self.copy(v, depth + 1) for k, v in pairs[:_MAX_ITEMS]}
            if len(pairs) > _MAX_ITEMS:
                copied["<more>"] = f"{len(pairs) - _MAX_ITEMS} more keys"
            return copied
        items = list(value)
        listed = [self.copy(v, depth + 1) for v in items[:_MAX_ITEMS]]
        if len(items) > _MAX_ITEMS:
            listed.append(f"<{len(items) - _MAX_ITEMS} more>")
        # FerretDB 1.24 stores no array directly inside an array: an inner one is its JSON.
        return [_text(json.dumps(v), _MAX_TEXT) if isinstance(v, list) else v for v in listed]


def safe_text(text: str) -> str:
    """*text* with lone surrogates replaced: a key MongoDB always takes."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _text(text: str, most: int) -> str:
    if len(text) > most:
        text = f"{text[:most]}...[{len(text) - most} more characters]"
    return text.encode("utf-8", "replace").decode("utf-8")


def _key(key: object) -> str:
    try:
        text = key if isinstance(key, str) else str(key)
    except Exception:  # noqa: BLE001 (a hostile __str__)
        text = f"<{type(key).__name__}>"
    return escape_key(_text(text, _MAX_KEY))


def escape_key(key: str) -> str:
    """A field name as stored: no NUL, no leading ``$``, no ``.`` (their full-width forms)."""
    key = key.replace("\x00", "")
    if not key:
        return "_"  # MongoDB refuses an empty name in an update
    if key.startswith("$"):
        key = "\uff04" + key[1:]
    return key.replace(".", "\uff0e")


def content_hash(doc: Mapping[str, Any]) -> str:
    """SHA-256 over a document's canonical JSON: equal for equal content."""
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a lone surrogate from a page still hashes (MongoDB refuses it later).
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()
