"""The frontier's Lua scripts, one file per script or per phase of the step.

A script opens with a header comment that lists its ``KEYS[n] name`` lines;
the loader reads the key order from there, gives the script a ``K`` table of
those names (``K.inflight`` rather than ``KEYS[2]``) and a ``CODE`` table of the
codes shared with Python (project/frontier/codes.py), and replaces each
``--@include path`` line with that file of this folder (once per script), so
a tick is still one EVALSHA. Scripts of other capabilities (the monitor's
heartbeat) load from their own folder and include from this one. :class:`LuaScript.keys_from` turns a key builder into the KEYS list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from project.frontier.codes import LUA_CODES

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.resources.abc import Traversable

__all__ = ["FOLDER", "LuaScript", "load", "used_keys"]

#: Where the frontier's scripts live: read through importlib.resources, because a
#: scrapyd node runs the project from a zipped egg.
FOLDER: Traversable = files(__name__)

_INCLUDE = re.compile(r"^--@include (\S+)\s*$", re.MULTILINE)
_HEADER = re.compile(r"\A--\[\[(.*?)\]\]", re.DOTALL)
_KEY = re.compile(r"^\s*KEYS\[(\d+)\]\s+(\w+)", re.MULTILINE)


@dataclass(frozen=True)
class LuaScript:
    """A script with its includes resolved and the names of its KEYS, in order."""

    name: str
    source: str
    keys: tuple[str, ...]

    def keys_from(self, builder: Any, **given: str) -> list[str]:
        """The KEYS argument: each key from *given*, else the attribute of *builder* so named."""
        return [given[name] if name in given else getattr(builder, name) for name in self.keys]


def _resource(folder: Traversable, relative: str) -> Traversable:
    for part in relative.split("/"):
        folder = folder / part
    return folder


def _expand(text: str, seen: set[str]) -> str:
    def include(match: re.Match[str]) -> str:
        if match[1] in seen:
            return f"-- (already included: {match[1]})"
        seen.add(match[1])
        return _expand(_resource(FOLDER, match[1]).read_text(encoding="utf-8"), seen)

    return _INCLUDE.sub(include, text)


def _key_names(name: str, source: str) -> tuple[str, ...]:
    header = _HEADER.match(source)
    if header is None:
        raise ValueError(f"{name}: a script opens with a --[[ header ]] comment")
    found = [(int(n), key) for n, key in _KEY.findall(header[1])]
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"{name}: KEYS in the header must be numbered 1..n in order")
    return tuple(key for _, key in found)


@cache
def load(name: str, package: str = __name__) -> LuaScript:
    """The script ``<name>.lua`` of *package*, ready for ``register_script``."""
    text = files(package).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    keys = _key_names(name, text)
    body = _expand(text, set())
    table = ", ".join(f"{key} = KEYS[{n}]" for n, key in enumerate(keys, 1))
    codes = ", ".join(f"{code} = '{value}'" for code, value in LUA_CODES.items())
    return LuaScript(name, f"local K = {{{table}}}\nlocal CODE = {{{codes}}}\n{body}", keys)


def used_keys(script: LuaScript) -> Sequence[str]:
    """Names the script reads from its K table (for the tests that check the headers)."""
    return sorted(set(re.findall(r"\bK\.(\w+)", script.source)))
