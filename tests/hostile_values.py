"""Values that break the protocols item code relies on, shared by the storage tests; a browser
provider that never starts, for the rendering tests."""

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


class FailingBrowserProvider:
    """A PLAYWRIGHT_BROWSER_PROVIDER that cannot start: a node whose browser fails to start
    (Playwright's driver killed at birth, a browser that will not launch)."""

    def __init__(self, config: object) -> None:
        self.config = config

    async def start(self) -> None:
        raise RuntimeError("this browser provider never starts (tests/hostile_values.py)")

    async def close(self) -> None:
        return None
