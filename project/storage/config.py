"""The ``MONGO_*`` and ``RUNS_CRAWL_ID`` settings, parsed and checked once."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pymongo.errors import ConfigurationError
from pymongo.uri_parser import parse_uri
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting, setting_fields
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_JOURNAL_DIR",
    "PRODUCT_TYPES",
    "MongoConfig",
    "StorageConfigError",
    "collection_name_error",
]

#: The journal folder of a database and a spider (``{database}``, ``{spider}`` replaced).
DEFAULT_JOURNAL_DIR = ".state/journal/{database}/{spider}"
#: The default before journals were keyed by database: adopted from, never written to.
_LEGACY_JOURNAL_DIR = ".state/journal/{spider}"

#: Keys of ``MONGO_COLLECTIONS`` and ``MONGO_ID_FIELDS`` that name the product types, whose
#: collection is ``MONGO_PRODUCTS_COLLECTION`` and whose id is their canonical URL.
PRODUCT_TYPES = frozenset(
    {"ProductItem", "Product", "project.items.ProductItem", "project.schema.Product"}
)
#: MongoDB's longest namespace (``database.collection``), and FerretDB 1.24's longest collection.
_MAX_NAMESPACE_BYTES = 255
_MAX_COLLECTION_BYTES = 235

#: Settings that must not be empty, and their fields.
_REQUIRED = {
    "MONGO_DATABASE": "database",
    "MONGO_PRODUCTS_COLLECTION": "products_collection",
    "MONGO_REJECTS_COLLECTION": "rejects_collection",
    "MONGO_FAILURES_COLLECTION": "failures_collection",
    "MONGO_JOURNAL_DIR": "journal_dir",
    "MONGO_WRITE_CONCERN": "write_concern",
}


class StorageConfigError(RuntimeError):
    """The storage settings cannot work, so the node must not start.

    Not ``NotConfigured``: Scrapy answers that by disabling the pipelines and
    crawling on, acknowledging every page while storing nothing. *reason* is the
    finish reason of a crawl that stops for it.
    """

    def __init__(self, message: str, reason: str = "storage_settings") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class MongoConfig:
    """Where and how items, rejects and dead letters are stored."""

    uri: str = setting("MONGO_URI", "mongodb://127.0.0.1:27017")
    database: str = setting("MONGO_DATABASE", "fleetcrawl")
    products_collection: str = setting("MONGO_PRODUCTS_COLLECTION", "products")
    rejects_collection: str = setting("MONGO_REJECTS_COLLECTION", "rejects")
    failures_collection: str = setting("MONGO_FAILURES_COLLECTION", "failures")
    #: Every changed field of every stored item, and items gone: one document each.
    changes_collection: str = setting("MONGO_CHANGES_COLLECTION", "changes")
    #: Each crawl run's report (project/runs/report.py).
    runs_collection: str = setting("MONGO_RUNS_COLLECTION", "crawl_runs")
    batch_size: int = setting("MONGO_BATCH_SIZE", 100)
    flush_interval: float = setting("MONGO_FLUSH_INTERVAL", 1.0)
    #: Items, and their bytes, that may wait to be stored before the node starts no more
    #: downloads (project/storage/backlog.py); 0: no bound of that kind.
    max_waiting: int = setting("MONGO_MAX_WAITING", 2000)
    max_waiting_bytes: int = setting("MONGO_MAX_WAITING_BYTES", 64 * 1024 * 1024)
    #: ``{database}`` and ``{spider}`` are replaced by the database and the spider's name.
    journal_dir: Path = setting("MONGO_JOURNAL_DIR", DEFAULT_JOURNAL_DIR)
    retry_max_delay: float = setting("MONGO_RETRY_MAX_DELAY", 30.0)
    server_selection_timeout: float = setting("MONGO_SERVER_SELECTION_TIMEOUT", 3.0)
    socket_timeout: float = setting("MONGO_SOCKET_TIMEOUT", 30.0)
    #: How long a node that is done keeps trying to store what waits (its journal, the
    #: fleet's outbox) before it exits 3, "crawled, not stored".
    drain_timeout: float = setting("MONGO_DRAIN_TIMEOUT", 600.0)
    #: Items their page no longer has get ``gone_at`` (project/frontier/revisit.py's evidence).
    mark_gone: bool = setting("RUNS_MARK_GONE", True)
    #: Most bytes the fleet's outbox in Redis holds while MongoDB is away (0: no outbox, a
    #: node journals to its own disk).
    outbox_max_bytes: int = setting("MONGO_OUTBOX_MAX_BYTES", 512 * 1024 * 1024)
    #: ``majority``, a number of members (``1``, ``2``, ...) or a tag set's name.
    write_concern: str = setting("MONGO_WRITE_CONCERN", "majority")
    crawl_id: str = setting("RUNS_CRAWL_ID", "", shown="<spider>-<start time, UTC>")
    #: Item type (class name, dotted path or ``dict``) -> collection.
    collections: dict[str, str] = setting("MONGO_COLLECTIONS", {})
    #: Item type -> the fields whose values, joined with ``|``, are its ``_id``.
    id_fields: dict[str, tuple[str, ...]] = setting("MONGO_ID_FIELDS", {})
    #: Folders of the layout before ``{database}``: their segments of this database are adopted.
    legacy_journal_dirs: tuple[Path, ...] = field(default=())
    #: The spider whose items these are (``source_spider`` of each document).
    spider: str = field(default="")
    #: RUNS_CRAWL_ID was set: the fleet's crawl run does not replace it.
    crawl_id_set: bool = field(default=False)

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, *, spider_name: str = "spider", started: datetime | None = None
    ) -> MongoConfig:
        """Read the settings; raise ``StorageConfigError`` on a value that cannot work."""
        _refuse_unknown(settings)
        try:
            values = read_settings(cls, settings)
        except NotConfigured as exc:
            raise StorageConfigError(str(exc)) from exc
        for name in ("uri", "database", "products_collection", "rejects_collection",
                     "failures_collection", "journal_dir", "write_concern", "crawl_id"):  # fmt: skip
            values[name] = str(values[name] or "").strip()
        for name, field_name in _REQUIRED.items():
            if not values[field_name]:
                raise StorageConfigError(f"{name} is empty")
        _check_uri(values["uri"])
        if values["write_concern"] == "0" or values["write_concern"].startswith("-"):
            raise StorageConfigError(
                f"MONGO_WRITE_CONCERN must acknowledge writes (majority, 1, 2, ... or a tag),"
                f" got {values['write_concern']!r}: the store returns only once a batch is durable"
            )
        if values["batch_size"] < 1:
            raise StorageConfigError(f"MONGO_BATCH_SIZE must be >= 1, got {values['batch_size']}")
        for name, field_name in (
            ("MONGO_MAX_WAITING", "max_waiting"),
            ("MONGO_MAX_WAITING_BYTES", "max_waiting_bytes"),
        ):
            value = values[field_name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StorageConfigError(f"{name} must be a count >= 0, got {value!r}")
        for name, field_name in (
            ("MONGO_FLUSH_INTERVAL", "flush_interval"),
            ("MONGO_RETRY_MAX_DELAY", "retry_max_delay"),
            ("MONGO_SERVER_SELECTION_TIMEOUT", "server_selection_timeout"),
            ("MONGO_SOCKET_TIMEOUT", "socket_timeout"),
            ("MONGO_DRAIN_TIMEOUT", "drain_timeout"),
        ):
            if not values[field_name] > 0:
                raise StorageConfigError(f"{name} must be > 0, got {settings.get(name)!r}")
        names = [values[f] for f in ("products_collection", "rejects_collection",
                                     "failures_collection")]  # fmt: skip
        for name, collection in zip(
            ("MONGO_PRODUCTS_COLLECTION", "MONGO_REJECTS_COLLECTION", "MONGO_FAILURES_COLLECTION"),
            names,
            strict=True,
        ):
            if why := collection_name_error(collection, values["database"]):
                raise StorageConfigError(f"{name} {collection!r}: {why}")
        if len(set(names)) < len(names):
            raise StorageConfigError(
                "MONGO_PRODUCTS_COLLECTION, MONGO_REJECTS_COLLECTION and MONGO_FAILURES_COLLECTION"
                f" must differ, got {names}"
            )
        values["collections"] = _collections(values["collections"], values["database"], names)
        values["id_fields"] = _id_fields(values["id_fields"])
        started = started or datetime.now(UTC)
        template, database = values["journal_dir"], values["database"]
        values["journal_dir"] = _journal_dir(template, database, spider_name)
        if template == DEFAULT_JOURNAL_DIR:
            values["legacy_journal_dirs"] = (_journal_dir(_LEGACY_JOURNAL_DIR, "", spider_name),)
        values["crawl_id_set"] = bool(values["crawl_id"])
        values["crawl_id"] = values["crawl_id"] or f"{spider_name}-{started:%Y%m%dT%H%M%SZ}"
        values["spider"] = spider_name
        return cls(**values)


def collection_name_error(name: str, database: str) -> str | None:
    """Why MongoDB (or FerretDB 1.24) refuses *name* as a collection of *database*, or None."""
    if not name:
        return "empty"
    if "\x00" in name or "$" in name:
        return "contains a NUL or '$'"
    if name.startswith("system."):
        return "starts with 'system.' (MongoDB's own collections)"
    if name.startswith(".") or name.endswith(".") or ".." in name:
        return "starts or ends with '.', or contains '..'"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8 (a lone surrogate)"
    if size > _MAX_COLLECTION_BYTES or size + len(database.encode()) + 1 > _MAX_NAMESPACE_BYTES:
        return (
            f"too long: a collection name has at most {_MAX_COLLECTION_BYTES} bytes, and"
            f" {database}.<collection> at most {_MAX_NAMESPACE_BYTES}"
        )
    return None


def _type_key(setting_name: str, key: object) -> str:
    if not isinstance(key, str) or not key.strip():
        raise StorageConfigError(
            f"{setting_name}: a key must name an item type (a class name like 'BookItem', a"
            f" dotted path like 'myproject.items.BookItem', or 'dict'), got {key!r}"
        )
    key = key.strip()
    if key in PRODUCT_TYPES:
        fix = (
            "set MONGO_PRODUCTS_COLLECTION instead"
            if setting_name == "MONGO_COLLECTIONS"
            else "remove this entry"
        )
        raise StorageConfigError(
            f"{setting_name}[{key!r}]: products are stored in MONGO_PRODUCTS_COLLECTION by their"
            f" canonical URL; {fix}"
        )
    return key


def _collections(raw: dict[object, object], database: str, reserved: list[str]) -> dict[str, str]:
    """``MONGO_COLLECTIONS``, checked: every value is a collection MongoDB takes."""
    collections: dict[str, str] = {}
    for key, value in raw.items():
        name = _type_key("MONGO_COLLECTIONS", key)
        if not isinstance(value, str):
            raise StorageConfigError(
                f"MONGO_COLLECTIONS[{name!r}] must be a collection name, got {value!r}"
            )
        if why := collection_name_error(value, database):
            raise StorageConfigError(f"MONGO_COLLECTIONS[{name!r}] {value!r}: {why}")
        if value in reserved:
            raise StorageConfigError(
                f"MONGO_COLLECTIONS[{name!r}] {value!r} is the products, rejects or failures"
                " collection: items of another type would mix with those documents"
            )
        collections[name] = value
    return collections


def _id_fields(raw: dict[object, object]) -> dict[str, tuple[str, ...]]:
    """``MONGO_ID_FIELDS``, checked: every value is a field name or a list of them."""
    id_fields: dict[str, tuple[str, ...]] = {}
    for key, value in raw.items():
        name = _type_key("MONGO_ID_FIELDS", key)
        fields = [value] if isinstance(value, str) else value
        if (
            not isinstance(fields, list | tuple)
            or not fields
            or not all(isinstance(f, str) and f.strip() for f in fields)
        ):
            raise StorageConfigError(
                f"MONGO_ID_FIELDS[{name!r}] must be a field name or a list of field names,"
                f" got {value!r}"
            )
        id_fields[name] = tuple(f.strip() for f in fields)
    return id_fields


def _journal_dir(template: str, database: str, spider: str) -> Path:
    return Path(template.replace("{database}", database).replace("{spider}", spider))


def _check_uri(uri: str) -> None:
    if not uri.startswith(("mongodb://", "mongodb+srv://")):
        raise StorageConfigError(
            f"MONGO_URI must start with mongodb:// or mongodb+srv://, got {mask_url(uri)!r}"
        )
    if uri.startswith("mongodb+srv://"):
        return  # parsing an SRV URI looks its hosts up in DNS: the client checks it at open
    try:
        parse_uri(uri)
    except (ConfigurationError, ValueError) as exc:
        raise StorageConfigError(f"MONGO_URI {mask_url(uri)!r} is not valid: {exc}") from exc


def _refuse_unknown(settings: BaseSettings) -> None:
    """A misspelt ``MONGO_*`` name would silently leave its default in force.

    The store owns the ``MONGO_`` prefix, so any other name under it is refused; a
    ``MONGODB_*`` name (scrapy-mongodb's spelling) only when it is close to one of ours.
    """
    known = sorted(name for _, name, _ in setting_fields(MongoConfig) if name.startswith("MONGO"))
    for name in sorted(n for n in settings if isinstance(n, str) and n.startswith("MONGO")):
        if name in known or settings.get(name) is None:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
        if close:
            hint = f"did you mean {close[0]}?"
        elif name.startswith("MONGO_"):
            hint = "the MONGO_ settings are " + ", ".join(known)
        else:
            continue
        raise StorageConfigError(f"unknown setting {name}: {hint} (see docs/settings.md)")
