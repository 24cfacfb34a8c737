"""Documents as bytes: JSON Lines, a JSON array, CSV; written a page at a time.

JSON: datetimes as ISO 8601 in UTC (``2026-12-06T05:14:17.123Z``), ObjectIds and other
BSON values as their text, bytes as base64. CSV: nested documents flattened into dotted
columns (``offers.price``, as Apify's ``flatten``), lists as JSON text, one header: the
fields asked for, else the columns of the documents it is given (see :class:`CsvWriter`); a
text that a spreadsheet would run as a formula starts with ``'``.
Parquet is not offered: its schema must be known before the first row, and a scraped
collection's documents rarely share one; ``pyarrow.json.read_json`` turns a JSONL export
into Parquet when needed.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "CsvWriter",
    "JsonArrayWriter",
    "JsonLinesWriter",
    "dumps",
    "flatten",
    "writer_for",
]

FORMATS = ("jsonl", "json", "csv")
CONTENT_TYPES = {
    "jsonl": "application/x-ndjson; charset=utf-8",
    "json": "application/json; charset=utf-8",
    "csv": "text/csv; charset=utf-8",
}
#: Most columns a CSV takes from the documents themselves (a header must end somewhere).
_MAX_COLUMNS = 2000


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def dumps(doc: Any) -> str:
    """One document as JSON text."""
    return json.dumps(doc, default=_plain, ensure_ascii=False, separators=(",", ":"))


def _cell(text: str) -> str:
    """A text cell a spreadsheet will not run: a formula's first character (a scraped value
    may be ``=HYPERLINK(...)``) gets a ``'`` before it, as OWASP advises for CSV."""
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested documents as dotted keys; lists as JSON text; other values as CSV takes them."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, list):
            flat[name] = dumps(value)
        elif isinstance(value, datetime | bytes):
            flat[name] = _plain(value)
        elif value is None or isinstance(value, str | int | float | bool):
            flat[name] = value
        else:
            flat[name] = _plain(value)
    return flat


class JsonLinesWriter:
    """JSON Lines: a document a line."""

    def start(self) -> bytes:
        return b""

    def page(self, docs: Iterable[dict[str, Any]]) -> bytes:
        return "".join(dumps(doc) + "\n" for doc in docs).encode("utf-8")

    def end(self) -> bytes:
        return b""


class JsonArrayWriter:
    """One JSON array, a document a line inside it."""

    def __init__(self) -> None:
        self._first = True

    def start(self) -> bytes:
        return b"["

    def page(self, docs: Iterable[dict[str, Any]]) -> bytes:
        parts = []
        for doc in docs:
            parts.append(("\n" if self._first else ",\n") + dumps(doc))
            self._first = False
        return "".join(parts).encode("utf-8")

    def end(self) -> bytes:
        return b"\n]\n" if not self._first else b"]\n"


class CsvWriter:
    """CSV with one header: *columns* (the fields asked for), else the flattened keys of the
    first page (later documents' other keys are left out: give ``fields`` to choose)."""

    def __init__(self, columns: Sequence[str] = ()) -> None:
        self.columns: list[str] = list(columns)
        self._started = False
        self._chosen = bool(columns)
        #: Columns of later documents the header does not have (at most _MAX_COLUMNS named).
        self.left_out: dict[str, None] = {}

    def start(self) -> bytes:
        return b""

    def page(self, docs: Iterable[dict[str, Any]]) -> bytes:
        rows = [
            {k: _cell(v) if isinstance(v, str) else v for k, v in flatten(doc).items()}
            for doc in docs
        ]
        out = io.StringIO()
        if not self._started:
            if not self.columns:
                seen: dict[str, None] = {}
                for row in rows:
                    for key in row:
                        if len(seen) < _MAX_COLUMNS:
                            seen.setdefault(key, None)
                self.columns = list(seen)
            csv.writer(out).writerow(self.columns)
            self._started = True
        writer = csv.DictWriter(out, self.columns, extrasaction="ignore", restval="")
        writer.writerows(rows)
        if not self._chosen and len(self.left_out) < _MAX_COLUMNS:
            known = set(self.columns)
            for row in rows:
                self.left_out.update((key, None) for key in row if key not in known)
        return out.getvalue().encode("utf-8")

    def end(self) -> bytes:
        if not self._started and self.columns:
            self._started = True
            out = io.StringIO()
            csv.writer(out).writerow(self.columns)
            return out.getvalue().encode("utf-8")
        return b""


def writer_for(
    fmt: str, fields: Sequence[str] = ()
) -> JsonLinesWriter | JsonArrayWriter | CsvWriter:
    """The writer of *fmt* (one of FORMATS)."""
    if fmt == "jsonl":
        return JsonLinesWriter()
    if fmt == "json":
        return JsonArrayWriter()
    if fmt == "csv":
        return CsvWriter(fields)
    raise ValueError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
