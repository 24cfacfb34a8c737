"""EXPORT_* and FLEET_FEEDS: how exports settle, and the feeds a run writes when it ends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.dataout.formats import FORMATS
from project.dataout.query import BadParameterError, split_fields
from project.utils import mask_url

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["DataOutConfig", "Feed"]

_SCHEMES = ("file", "s3")


@dataclass(frozen=True)
class Feed:
    """One entry of FLEET_FEEDS: where (a URI template), in what format, which items."""

    uri: str
    format: str
    collection: str | None = None
    fields: tuple[str, ...] = ()
    omit: tuple[str, ...] = ()


@dataclass(frozen=True)
class DataOutConfig:
    """How reads of the store settle, and the fleet's feeds."""

    #: Seconds a write may take from its stamp to its commit: a read takes what was written
    #: up to its start less this (project/dataout/query.py).
    settle_seconds: float = setting("EXPORT_SETTLE_SECONDS", 10.0)
    #: Scrapy's FEEDS shape: {uri: {"format": ..., "fields": [...], "collection": ...}}.
    feeds: dict[str, Any] = setting("FLEET_FEEDS", {})

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(cls, settings)
        if not 0 <= values["settle_seconds"] <= 3600:
            raise NotConfigured(
                f"EXPORT_SETTLE_SECONDS must be within [0, 3600]: {values['settle_seconds']!r}"
            )
        return cls(**values)

    def parsed_feeds(self) -> list[Feed]:
        """FLEET_FEEDS checked (``NotConfigured`` naming what is wrong)."""
        raw: Any = self.feeds
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except ValueError as exc:
                raise NotConfigured(f"FLEET_FEEDS is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise NotConfigured("FLEET_FEEDS must map feed URIs to their options, as FEEDS does")
        feeds = []
        for given, options in raw.items():
            uri = mask_url(str(given))[:200]  # in messages: never a password
            if (
                not isinstance(given, str)
                or ":" not in given
                or given.split(":", 1)[0] not in _SCHEMES
            ):
                raise NotConfigured(f"FLEET_FEEDS: {uri!r} is not a file: or s3: URI")
            try:
                netloc = urlsplit(given).netloc
            except ValueError as exc:
                raise NotConfigured(f"FLEET_FEEDS: {uri!r} is not a URI ({exc})") from None
            if "@" in netloc:
                raise NotConfigured(
                    f"FLEET_FEEDS: {uri!r} has credentials: S3 takes them from the environment"
                    " (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never from a setting"
                )
            options = options or {}
            if not isinstance(options, dict):
                raise NotConfigured(f"FLEET_FEEDS[{uri!r}] must be a dict of options")
            fmt = options.get("format") or _format_of(uri)
            if fmt not in FORMATS:
                raise NotConfigured(
                    f"FLEET_FEEDS[{uri!r}]: format {fmt!r} is not one of {', '.join(FORMATS)}"
                )
            try:
                fields = _names(options.get("fields"), "fields")
                omit = _names(options.get("omit"), "omit")
            except BadParameterError as exc:
                raise NotConfigured(f"FLEET_FEEDS[{uri!r}]: {exc}") from None
            collection = options.get("collection")
            if collection is not None and not isinstance(collection, str):
                raise NotConfigured(f"FLEET_FEEDS[{uri!r}]: collection must be a name")
            feeds.append(Feed(given, fmt, collection, fields, omit))
        return feeds


def _names(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return split_fields(",".join(value), what)
    raise BadParameterError(f"{what} must be a list of field names")


def _format_of(uri: str) -> str | None:
    for fmt in ("jsonl", "json", "csv"):
        if uri.lower().endswith("." + fmt):
            return fmt
    return None
