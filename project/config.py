"""Typed settings: each component's Config dataclass is the one home of its defaults.

A field made with :func:`setting` names the Scrapy setting it comes from;
:func:`read_settings` reads every such field with the getter its default's
type calls for (under its former name when only that one is set, see
``project.frontier.compat``), and turns a value that cannot be parsed into
``NotConfigured`` naming the setting. ``docs/settings.md`` documents every
one of them, and a test holds the two together.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from project.frontier.compat import setting_name

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "FleetConfigError",
    "exported_defaults",
    "read_field",
    "read_settings",
    "setting",
    "setting_fields",
]


class FleetConfigError(SystemExit):
    """Settings a node cannot work with: it stops with exit status 1 and one line.

    A ``SystemExit``: the line is logged where it is raised, and ``scrapy crawl``
    then exits without a traceback (an expected fault, not a bug).
    """

    def __init__(self, message: str) -> None:
        super().__init__(1)
        self.message = message

    def __str__(self) -> str:
        return self.message


def setting(name: str, default: Any, *, shown: str | None = None, export: bool = False) -> Any:
    """A dataclass field read from setting *name*, *default* when unset or None.

    *shown* is how the settings reference writes a default computed at start
    (a node id, for example) instead of the literal value. *export* marks a
    setting of another library (scrapy-playwright) whose fleet default the
    add-on writes into the settings, so that library reads it too.
    """
    metadata = {"setting": name, "shown": shown, "export": export}
    if isinstance(default, (dict, list, set)):
        frozen = default.copy()
        return dataclasses.field(default_factory=lambda: frozen.copy(), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def setting_fields(cls: type) -> list[tuple[dataclasses.Field[Any], str, Any]]:
    """``(field, setting name, default)`` of every setting field of *cls*."""
    found = []
    for f in dataclasses.fields(cls):
        name = f.metadata.get("setting")
        if name is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting field needs a default")
        found.append((f, name, default))
    return found


def _read(settings: BaseSettings, name: str, default: Any) -> Any:
    name = setting_name(settings, name)
    if settings.get(name) is None:
        return default
    try:
        if isinstance(default, bool):
            return settings.getbool(name)
        if isinstance(default, int):
            return settings.getint(name)
        if isinstance(default, float):
            return settings.getfloat(name)
        if isinstance(default, dict):
            return settings.getdict(name)
        if isinstance(default, (list, tuple, frozenset)):
            return type(default)(settings.getlist(name))
        if isinstance(default, str):
            return str(settings.get(name))
    except (TypeError, ValueError) as exc:
        kind = type(default).__name__
        raise NotConfigured(
            f"{name} must be a {kind} like {default!r}, got {settings.get(name)!r}"
        ) from exc
    return settings.get(name)


def read_settings(cls: type, settings: BaseSettings, **given: Any) -> dict[str, Any]:
    """Keyword arguments for ``cls(...)``: every setting field read from *settings*.

    Fields in *given* are taken as they are instead (values computed by the caller).
    """
    values = dict(given)
    for f, name, default in setting_fields(cls):
        if f.name not in values:
            values[f.name] = _read(settings, name, default)
    return values


def read_field(cls: type, field: str, settings: BaseSettings) -> Any:
    """One setting field of *cls* read from *settings*, for code that needs it before or
    without the whole Config (the add-on deriving node limits)."""
    for f, name, default in setting_fields(cls):
        if f.name == field:
            return _read(settings, name, default)
    raise TypeError(f"{cls.__name__}.{field} is not a setting field")


def exported_defaults(cls: type) -> dict[str, Any]:
    """``setting -> default`` of the fields of *cls* made with ``export=True``."""
    return {name: default for f, name, default in setting_fields(cls) if f.metadata["export"]}
