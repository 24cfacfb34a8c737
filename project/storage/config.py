"""The ``MONGO_*`` and ``CRAWL_ID`` settings, parsed and checked once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["MongoConfig"]

#: Settings that must not be empty, and their fields.
_REQUIRED = {
    "MONGO_DATABASE": "database",
    "MONGO_PRODUCTS_COLLECTION": "products_collection",
    "MONGO_REJECTS_COLLECTION": "rejects_collection",
    "MONGO_FAILURES_COLLECTION": "failures_collection",
    "MONGO_JOURNAL_DIR": "journal_dir",
}


@dataclass(frozen=True)
class MongoConfig:
    """Where and how items, rejects and dead letters are stored."""

    uri: str = setting("MONGO_URI", "mongodb://127.0.0.1:27017")
    database: str = setting("MONGO_DATABASE", "fleetcrawl")
    products_collection: str = setting("MONGO_PRODUCTS_COLLECTION", "products")
    rejects_collection: str = setting("MONGO_REJECTS_COLLECTION", "rejects")
    failures_collection: str = setting("MONGO_FAILURES_COLLECTION", "failures")
    batch_size: int = setting("MONGO_BATCH_SIZE", 100)
    flush_interval: float = setting("MONGO_FLUSH_INTERVAL", 1.0)
    #: ``{spider}`` is replaced by the spider's name.
    journal_dir: Path = setting("MONGO_JOURNAL_DIR", ".state/journal/{spider}")
    retry_max_delay: float = setting("MONGO_RETRY_MAX_DELAY", 30.0)
    server_selection_timeout: float = setting("MONGO_SERVER_SELECTION_TIMEOUT", 3.0)
    socket_timeout: float = setting("MONGO_SOCKET_TIMEOUT", 30.0)
    crawl_id: str = setting("CRAWL_ID", "", shown="<spider>-<start time, UTC>")

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, *, spider_name: str = "spider", started: datetime | None = None
    ) -> MongoConfig:
        """Read the settings; raise ``NotConfigured`` on a value that cannot work."""
        values = read_settings(cls, settings)
        for name in ("uri", "database", "products_collection", "rejects_collection",
                     "failures_collection", "journal_dir", "crawl_id"):  # fmt: skip
            values[name] = str(values[name] or "").strip()
        uri = values["uri"]
        if not uri.startswith(("mongodb://", "mongodb+srv://")):
            raise NotConfigured(
                f"MONGO_URI must start with mongodb:// or mongodb+srv://, got {mask_url(uri)!r}"
            )
        for name, field in _REQUIRED.items():
            if not values[field]:
                raise NotConfigured(f"{name} is empty")
        if values["batch_size"] < 1:
            raise NotConfigured(f"MONGO_BATCH_SIZE must be >= 1, got {values['batch_size']}")
        for name, field in (
            ("MONGO_FLUSH_INTERVAL", "flush_interval"),
            ("MONGO_RETRY_MAX_DELAY", "retry_max_delay"),
            ("MONGO_SERVER_SELECTION_TIMEOUT", "server_selection_timeout"),
            ("MONGO_SOCKET_TIMEOUT", "socket_timeout"),
        ):
            if not values[field] > 0:
                raise NotConfigured(f"{name} must be > 0, got {settings.get(name)!r}")
        started = started or datetime.now(UTC)
        values["journal_dir"] = Path(values["journal_dir"].replace("{spider}", spider_name))
        values["crawl_id"] = values["crawl_id"] or f"{spider_name}-{started:%Y%m%dT%H%M%SZ}"
        return cls(**values)
