"""What an export, a page of the API or a feed reads: items or changes, in keyset pages.

Both go through a collection in ``_id`` order, a page at a time (``_id`` greater than the
last one read, never ``skip``): on MongoDB through its ``_id`` index, on the embedded FerretDB
through the index of fleetcrawl's patch (project/ops/ferretdb/fleetcrawl_order.go), so a page
costs the same at the end of a collection as at its start, and memory holds one page.

Where a reader stands between two reads is a watermark: a time by the fleet's clock (Redis')
up to which everything is read. The store stamps every content write ``written_at`` when it
writes (project/storage/writes.py); a read takes what was written up to the watermark, and
the next read with ``since`` the watermark takes what was written after it: nothing twice,
nothing missed. The watermark is the read's start less EXPORT_SETTLE_SECONDS, the longest a
write may take from its stamp to its commit, so no write stamped before it lands after it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from project.storage.documents import from_ms, stored_ms

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from pymongo.asynchronous.collection import AsyncCollection

__all__ = [
    "MAX_PAGE",
    "BadParameterError",
    "ChangeQuery",
    "Cursor",
    "ItemQuery",
    "make_token",
    "pages",
    "read_token",
    "split_fields",
    "watermark_ms",
    "window_of",
]

#: Most documents in one page (an API ``limit`` above it is capped).
MAX_PAGE = 1000
#: Most fields one read may name, and the longest name.
_MAX_FIELDS = 200
_MAX_FIELD = 200
#: Milliseconds of a token or a cursor: at most 13 digits (until the year 2286), the width
#: of a change's _id prefix, so that they compare as numbers do.
_TOKEN = re.compile(r"w(\d{1,13})")
_MAX_MS = 10**13
#: Longest cursor: an _id of a few thousand characters (ids are at most MAX_ID_LENGTH; a
#: URL's query string is the limit of what a client sends anyway).
_MAX_CURSOR = 16384
#: Turns of the event loop that put a find on the wire (pymongo's async client: the command
#: is encoded, a connection checked out, the bytes written).
_TURNS_TO_SEND = 3


class BadParameterError(ValueError):
    """A parameter of a read that cannot be used (the API answers 400 with its text)."""


def make_token(ms: int) -> str:
    """The token of watermark *ms*: what a reader gives as ``since`` next time."""
    return f"w{ms}"


def read_token(text: str) -> int:
    """The watermark of a token (``w`` and the milliseconds)."""
    match = _TOKEN.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise BadParameterError(
            f"since: {text[:40]!r} is not a token (w and milliseconds, as an export printed it)"
        )
    return int(match[1])


def split_fields(text: str | None, what: str = "fields") -> tuple[str, ...]:
    """Comma-separated field names (dotted for nested ones), checked."""
    if not text:
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if len(names) > _MAX_FIELDS:
        raise BadParameterError(f"{what}: at most {_MAX_FIELDS} fields, got {len(names)}")
    for name in names:
        if (
            len(name) > _MAX_FIELD
            or name.startswith(("$", "."))
            or name.endswith(".")
            or ".." in name
            or "\x00" in name
        ):
            raise BadParameterError(f"{what}: {name[:40]!r} is not a field name")
    for name in names:  # MongoDB refuses a path and a path inside it in one projection
        if any(other.startswith(name + ".") for other in names):
            raise BadParameterError(f"{what}: {name[:40]!r} and a field inside it")
    return names


@dataclass(frozen=True)
class Cursor:
    """Where a paged read stands: the last ``_id`` read and the read's watermark."""

    after: str
    until_ms: int

    def encode(self) -> str:
        raw = json.dumps(
            {"a": self.after, "w": self.until_ms}, separators=(",", ":"), ensure_ascii=False
        )
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor a page gave (``BadParameterError`` for anything else)."""
        if not isinstance(text, str) or not 0 < len(text) <= _MAX_CURSOR:
            raise BadParameterError("cursor: not a cursor a page gave")
        try:
            data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError, RecursionError):
            raise BadParameterError("cursor: not a cursor a page gave") from None
        if not (
            isinstance(data, dict)
            and isinstance(data.get("a"), str)
            and isinstance(data.get("w"), int)
            and not isinstance(data.get("w"), bool)
            and 0 <= data["w"] < _MAX_MS
        ):
            raise BadParameterError("cursor: not a cursor a page gave")
        return cls(data["a"], data["w"])


@dataclass(frozen=True)
class ItemQuery:
    """Items of one collection: those written up to *until_ms* (after *since_ms*, if given),
    seen within a run's window (*run_window*, ms), with the chosen fields."""

    until_ms: int
    since_ms: int | None = None
    run_window: tuple[int, int] | None = None
    fields: tuple[str, ...] = ()
    omit: tuple[str, ...] = ()

    def filter(self, after: str | None) -> dict[str, Any]:
        until = from_ms(self.until_ms)
        query: dict[str, Any] = {"_id": {"$gt": after} if after is not None else {"$gte": ""}}
        if self.since_ms is not None:
            query["written_at"] = {"$gt": from_ms(self.since_ms), "$lte": until}
        else:  # a document written before the stamp existed is part of every whole read
            query["written_at"] = {"$not": {"$gt": until}}
        if self.run_window is not None:
            start, end = self.run_window
            query["last_seen"] = {"$gte": from_ms(start), "$lte": from_ms(end)}
        return query

    def projection(self) -> dict[str, int] | None:
        if self.fields:
            return {"_id": 1, **dict.fromkeys(self.fields, 1)}
        if self.omit:
            return {name: 0 for name in self.omit if name != "_id"} or None
        return None

    def shape(self, doc: dict[str, Any]) -> dict[str, Any]:
        """*doc* as the reader asked for it: without ``_id`` unless asked, without *omit*."""
        if self.fields and "_id" not in self.fields:
            doc.pop("_id", None)
        if self.fields and self.omit:
            for name in self.omit:
                _drop(doc, name)
        return doc


@dataclass(frozen=True)
class ChangeQuery:
    """Changes written after *since_ms* up to *until_ms*, of one collection, field or item."""

    until_ms: int
    since_ms: int | None = None
    collection: str | None = None
    field: str | None = None
    item: str | None = None

    def filter(self, after: str | None) -> dict[str, Any]:
        # a change's _id begins with its write time, 13 digits (project/storage/writes.py)
        low = after if after is not None else f"{(self.since_ms or -1) + 1:013d}"
        query: dict[str, Any] = {"_id": {"$gt" if after is not None else "$gte": low,
                                         "$lt": f"{self.until_ms + 1:013d}"}}  # fmt: skip
        given = {"collection": self.collection, "field": self.field, "item_id": self.item}
        query.update({name: value for name, value in given.items() if value is not None})
        return query

    def projection(self) -> None:
        return None

    def shape(self, doc: dict[str, Any]) -> dict[str, Any]:
        return doc


async def pages(
    collection: AsyncCollection[dict[str, Any]],
    query: ItemQuery | ChangeQuery,
    *,
    after: str | None = None,
    size: int = MAX_PAGE,
    ahead: bool = True,
) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """Pages of *query* after the ``_id`` *after*: (documents, the last ``_id`` read). With
    *ahead*, the next page is asked for as soon as a page arrives (it needs only its last
    ``_id``), so the server reads it while the caller writes this one."""

    async def fetch(start: str | None) -> list[dict[str, Any]]:
        cursor = collection.find(query.filter(start), query.projection())
        # the whole page in the first reply: one round trip, no getMore nor killCursors
        cursor = cursor.sort("_id", 1).limit(size).batch_size(size)
        found: list[dict[str, Any]] = await cursor.to_list(size)
        return found

    next_page: asyncio.Future[list[dict[str, Any]]] | None = None
    try:
        while True:
            docs = await (next_page if next_page is not None else fetch(after))
            next_page = None
            if not docs:
                return
            after = str(docs[-1]["_id"])
            full = len(docs) == size
            if full and ahead:
                next_page = asyncio.ensure_future(fetch(after))
                for _ in range(_TURNS_TO_SEND):  # its find on the wire before the caller
                    await asyncio.sleep(0)  # works through this page without yielding
            yield [query.shape(doc) for doc in docs], after
            if not full:
                return
    finally:
        if next_page is not None and not next_page.done():
            next_page.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await next_page


def watermark_ms(now_ms: int, settle_seconds: float) -> int:
    """The watermark of a read that starts at *now_ms* (Redis' clock)."""
    return now_ms - int(settle_seconds * 1000)


def window_of(report: dict[str, Any]) -> tuple[int, int]:
    """A run's window (ms) from its report: items seen in it have ``last_seen`` inside."""
    start, end = stored_ms(report.get("started")), stored_ms(report.get("ended"))
    if start is None or end is None:
        raise BadParameterError(f"run {str(report.get('_id'))[:100]!r} has no start and end")
    return start, end


def _drop(doc: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for name in parents:
        node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)
