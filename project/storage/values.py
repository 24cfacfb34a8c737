"""Item values as stored: what BSON, FerretDB 1.24 and the JSON journal all take.

Any item itemadapter supports becomes a document of JSON values only (so a journaled record
is the document itself): ``Decimal`` -> its text (as a product's price), ``datetime``, ``date``
and ``time`` -> ISO 8601 text, enums -> their value, ``UUID`` -> text, ``bytes`` -> base64
text, tuples -> lists, sets -> sorted lists, NaN and infinities -> null (FerretDB refuses
infinities and drops the connection on NaN), nested items (dicts, ``scrapy.Item``,
dataclasses, attrs classes) -> documents, pydantic models -> what ``model_dump(mode="json")``
writes, with sets sorted (pydantic lists a set in hash order, which changes between processes).
Field names become text; a leading ``$`` and every ``.`` are replaced by their full-width
forms (U+FF04, U+FF0E: MongoDB reads those as operators and paths), NUL is removed, and a name
left empty becomes ``_`` (as in rejects). Anything else, an integer beyond 64 bits, nesting
deeper than MongoDB's 100 levels, or an item whose own code raises while it is read (a
``__int__``, an ``items()``, a model that contains itself), is a :class:`DocumentError`.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from itemadapter import ItemAdapter
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from project.storage.documents import escape_key

__all__ = ["MAX_DEPTH", "DocumentError", "item_document"]

#: MongoDB's deepest document; the item itself is level 1.
MAX_DEPTH = 100
_PATH_KEY = 40
_INT64 = 2**63


class DocumentError(ValueError):
    """A value no MongoDB document can hold; the message says what and where."""

    def __init__(self, message: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        where = "".join(self.path).lstrip(".")
        return f"{where}: {self.message}" if where else self.message


def item_document(item: Any) -> tuple[dict[str, Any], int]:
    """The document of *item*, and how many field names were escaped.

    Raises :class:`DocumentError` for a value no document can hold.
    """
    converter = _Converter()
    if isinstance(item, BaseModel):
        return converter.mapping(_model_dump(item), 1), converter.escaped
    try:
        fields = dict(ItemAdapter(item).items())
    except RecursionError as exc:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from exc
    except Exception as exc:  # an item's own code may raise anything
        raise _failed(exc) from exc
    return converter.mapping(fields, 1), converter.escaped


def _model_dump(model: BaseModel) -> dict[str, Any]:
    """What ``model_dump(mode="json")`` writes, but with every set sorted.

    Dumped in python mode (a set stays a set), its sets sorted, then made JSON by pydantic's
    own serialisers (datetimes as ``model_dump(mode="json")`` writes them).
    """
    try:
        data = model.model_dump()
    except RecursionError as exc:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from exc
    except Exception as exc:  # a model that contains itself, a hostile validator
        raise DocumentError(f"{type(model).__name__} cannot be serialised: {_reason(exc)}") from exc
    try:
        dumped: dict[str, Any] = to_jsonable_python(_sorted_sets(data, 1))
    except PydanticSerializationError:
        return data  # a value pydantic cannot write as JSON: the converter has its say
    except RecursionError as exc:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from exc
    return dumped


def _sorted_sets(value: Any, depth: int) -> Any:
    """*value* (a python-mode dump) with each set as a list in the order of its JSON."""
    if depth > MAX_DEPTH:
        return value  # the converter refuses it, and says where
    if isinstance(value, dict):
        return {key: _sorted_sets(inner, depth + 1) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_sorted_sets(inner, depth + 1) for inner in value]
    if isinstance(value, set | frozenset):
        items = [to_jsonable_python(_sorted_sets(inner, depth + 1)) for inner in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return value


def _reason(exc: BaseException) -> str:
    """An exception raised by an item's own code, as one short line."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 (a hostile __str__)
        text = ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _failed(exc: BaseException) -> DocumentError:
    return DocumentError(f"reading it raised {_reason(exc)}")


def _int64(value: int) -> int:
    if not -_INT64 <= value < _INT64:
        # BSON has no larger integer (and JSON, the journal, cannot print one of 4,300 digits).
        raise DocumentError(f"an integer of {value.bit_length()} bits; BSON stores at most 64")
    return value


def _location(key: object) -> str:
    """A field name in an error's path: short, whatever the key is."""
    try:
        text = key if isinstance(key, str) else repr(key)
    except Exception:  # noqa: BLE001 (a hostile __repr__, an int too long to print)
        text = f"<{type(key).__name__}>"
    return "." + (text if len(text) <= _PATH_KEY else text[:_PATH_KEY] + "...")


class _Converter:
    def __init__(self) -> None:
        self.escaped = 0

    def mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            pairs = [(key, inner) for key, inner in value.items()]
        except Exception as exc:  # a mapping's own items() may raise anything
            raise _failed(exc) from exc
        out: dict[str, Any] = {}
        for key, inner in pairs:
            try:
                name = self.key(key)
                if name in out:
                    raise DocumentError(f"two field names are stored as {name[:_PATH_KEY]!r}")
                out[name] = self.value(inner, depth + 1)
            except DocumentError as exc:
                exc.path = (_location(key), *exc.path)
                raise
            except Exception as exc:  # a value's own __int__, __str__, ...
                error = _failed(exc)
                error.path = (_location(key),)
                raise error from exc
        return out

    def key(self, key: object) -> str:
        if isinstance(key, Enum):
            key = key.value
        if isinstance(key, str):
            text = str.__str__(key)
        elif isinstance(key, int | float) or key is None:
            try:
                text = str(key)
            except ValueError as exc:  # an integer of more digits than Python prints
                raise DocumentError("a field name of more than 4,300 digits") from exc
        else:
            raise DocumentError(f"a field name must be text, got a {type(key).__name__}")
        escaped = escape_key(text)
        if escaped != text:
            self.escaped += 1
        return escaped

    def value(self, value: object, depth: int) -> Any:
        kind = type(value)
        if value is None or kind is str or kind is bool:
            return value
        if isinstance(value, Enum):
            return self.value(value.value, depth + 1)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return _int64(int(value))
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else None
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, datetime | date | time):
            return value.isoformat()
        if isinstance(value, UUID):
            return str(value)
        if isinstance(value, bytes | bytearray | memoryview):
            return base64.b64encode(bytes(value)).decode("ascii")
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, BaseModel):
            return self.mapping(_model_dump(value), depth)
        if isinstance(value, Mapping):
            return self.mapping(value, depth)
        if isinstance(value, list | tuple):
            return self.sequence(value, depth)
        if isinstance(value, set | frozenset):
            # Sorted: a set's order changes between runs, its content hash must not.
            items = self.sequence(_listed(value), depth)
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        if ItemAdapter.is_item(value):
            return self.mapping(dict(ItemAdapter(value).items()), depth)
        raise DocumentError(f"cannot store a value of type {kind.__name__}")

    def sequence(self, values: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
        out: list[Any] = []
        for index, inner in enumerate(_listed(values)):
            try:
                out.append(self.value(inner, depth + 1))
            except DocumentError as exc:
                exc.path = (f"[{index}]", *exc.path)
                raise
            except Exception as exc:  # a value's own __int__, __str__, ...
                error = _failed(exc)
                error.path = (f"[{index}]",)
                raise error from exc
        return out


def _listed(values: Any) -> list[Any]:
    """The values of a list, tuple or set, whatever its own ``__iter__`` raises."""
    try:
        return list(values)
    except Exception as exc:  # a container's own __iter__ may raise anything
        raise _failed(exc) from exc
