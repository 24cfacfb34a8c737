"""Values that break the protocols item code relies on, shared by the storage tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class HostileInt(int):
    def __int__(self) -> int:
        raise RuntimeError("no int for you")


class HostileMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        return 1

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1

    def items(self) -> Any:
        raise RuntimeError("no items for you")


class HostileDict(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("no items for you")
