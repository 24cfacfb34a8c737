"""Settings keyed by item type: a class name (``BookItem``), a dotted path, or ``dict``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["TypeTable", "type_keys"]

_V = TypeVar("_V")
#: Distinct classes remembered by one table (a spider that makes a class per item gets no more).
_MAX_CACHED = 1000


def type_keys(cls: type) -> list[str]:
    """The keys that name *cls*, most specific first.

    Its dotted path, then its name, then the same for each base class in method resolution
    order (``object`` left out): ``{"Item": ...}`` matches every ``scrapy.Item``, and a plain
    ``dict`` is ``builtins.dict`` or ``dict``.
    """
    keys: list[str] = []
    for klass in cls.__mro__:
        if klass is not object:
            keys += [f"{klass.__module__}.{klass.__qualname__}", klass.__name__]
    return keys


class TypeTable(Generic[_V]):
    """Values by item type, from one or more mappings of type keys (earlier ones win).

    The first mapping that names the type (or a base class of it) decides, even with None:
    ``{"BookItem": None}`` over a default ``{"BookItem": ...}`` says "no value" for books.
    """

    def __init__(self, *layers: Mapping[str, _V | None]) -> None:
        self._layers = layers
        self._cache: dict[type, _V | None] = {}

    def get(self, cls: type) -> _V | None:
        """The value for *cls*, or None when no mapping names it."""
        try:
            return self._cache[cls]
        except KeyError:
            pass
        except TypeError:  # a metaclass without __hash__: looked up every time
            return self._lookup(cls)
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        value = self._cache[cls] = self._lookup(cls)
        return value

    def _lookup(self, cls: type) -> _V | None:
        keys = type_keys(cls)
        for layer in self._layers:
            for key in keys:
                if key in layer:
                    return layer[key]
        return None
