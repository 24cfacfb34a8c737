"""The records the store batches and journals: items by collection, and rejects.

An item record (``kind`` ``item``, or ``product`` for a ``Product`` of the products
collection) carries its collection, ``_id``, document, content hash, the time it was seen and
its crawl; a reject record its ``_id`` and document. Records are JSON, so the journal holds them
as they are. Product records written before records named their collection (no
``collection``) belong to the products collection.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Any

from project.storage.config import collection_name_error
from project.storage.documents import bounded, from_ms, safe_text, to_ms

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from project.storage.placement import PlacedItem

__all__ = [
    "Record",
    "collection_of",
    "gone_record",
    "item_record",
    "refused_reject",
    "reject_record",
    "report_record",
    "touch_record",
    "well_formed",
]

Record = dict[str, Any]


def item_record(
    placed: PlacedItem, *, database: str, crawl_id: str, seen: float, spider: str = ""
) -> Record:
    """The record of an item to upsert by ``_id`` into its collection."""
    return {
        "spider": spider,
        "db": database,
        "kind": placed.kind,
        "collection": placed.collection,
        "type": placed.item_type,
        "id": placed.id,
        "doc": placed.doc,
        "hash": placed.hash,
        "seen": seen,
        "crawl_id": crawl_id,
        "id_from_url": placed.id_from_url,
    }


def reject_record(
    item: Mapping[str, Any],
    reasons: Mapping[str, Sequence[str]],
    *,
    database: str,
    crawl_id: str,
    seen: float,
    item_type: str | None = None,
) -> Record:
    """The record of an item stored in rejects, with its reasons per field.

    Its ``_id`` is ``<crawl_id>|<canonical URL or URL>`` (a product's, or an item of no named
    type), or ``<crawl_id>|<type>|<canonical URL or URL>``; an item without either is named by
    the hash of its bounded copy.
    """
    raw = bounded(dict(item))
    url = raw.get("url") if isinstance(raw.get("url"), str) else ""
    canonical = raw.get("canonical_url") if isinstance(raw.get("canonical_url"), str) else None
    key = canonical or url or _digest(raw)
    doc: Record = {
        "url": url,
        "canonical_url": canonical,
        "item": raw,
        "reasons": bounded({field: list(messages) for field, messages in reasons.items()}),
        "crawl_id": crawl_id,
    }
    if item_type is not None:
        doc["item_type"] = item_type
    return {
        "db": database,
        "kind": "reject",
        "id": f"{crawl_id}|{key}" if item_type is None else f"{crawl_id}|{item_type}|{key}",
        "doc": doc,
        "seen": seen,
    }


def report_record(report: Mapping[str, Any], *, database: str, collection: str) -> Record:
    """The record of a crawl run's report that MongoDB could not take when the run ended:
    its datetimes as Unix times, named in ``times``."""
    doc = {k: v for k, v in report.items() if k != "_id"}
    times = [name for name, value in doc.items() if hasattr(value, "timestamp")]
    for name in times:
        doc[name] = doc[name].timestamp()
    return {"db": database, "kind": "report", "collection": collection, "id": str(report["_id"]),
            "doc": doc, "times": times}  # fmt: skip


def touch_record(
    collection: str, ids: list[str], *, database: str, seen: float, crawl_id: str = "",
    spider: str = "",
) -> Record:  # fmt: skip
    """The record of items seen again without their content (a 304): ``last_seen`` moves
    (and an item marked gone comes back: the crawl and spider name its change)."""
    return {"db": database, "kind": "touch", "collection": collection, "ids": ids, "seen": seen,
            "crawl_id": crawl_id, "spider": spider}  # fmt: skip


def gone_record(
    collection: str, ids: list[str], *, database: str, at: float, before: float,
    crawl_id: str, spider: str,
) -> Record:  # fmt: skip
    """The record of items their page no longer has (project/frontier/revisit.py's evidence):
    ``gone_at`` *at*, unless gone already or seen after *before* (the page's last fetch that
    named them: another page, or a sighting since, keeps them)."""
    return {"db": database, "kind": "gone", "collection": collection, "ids": ids, "seen": at,
            "before": before, "crawl_id": crawl_id, "spider": spider}  # fmt: skip


def refused_reject(record: Record, reason: str, products_collection: str) -> Record:
    """The reject record of an item MongoDB cannot take: a bounded copy and the reason."""
    doc: dict[str, Any] = record["doc"] if isinstance(record.get("doc"), dict) else {}
    crawl_id = str(record.get("crawl_id", ""))
    key = safe_text(str(record.get("id")))
    if collection_of(record, products_collection) == products_collection:
        return {
            "kind": "reject",
            "id": f"{crawl_id}|{key}",
            "seen": record["seen"],
            "doc": {
                "url": bounded(doc.get("url")),
                "canonical_url": bounded(record.get("id")),
                "item": bounded(doc),
                "reasons": {"document": [reason]},
                "crawl_id": crawl_id,
            },
        }
    item_type = safe_text(str(record.get("type") or record.get("collection")))
    url, canonical = doc.get("url"), doc.get("canonical_url")
    return {
        "kind": "reject",
        "id": f"{crawl_id}|{item_type}|{key}",
        "seen": record["seen"],
        "doc": {
            "url": bounded(url) if isinstance(url, str) else "",
            "canonical_url": bounded(canonical) if isinstance(canonical, str) else None,
            "item": bounded(doc),
            "reasons": {"document": [reason]},
            "crawl_id": crawl_id,
            "item_type": item_type,
            "collection": bounded(record.get("collection")),
            "item_id": bounded(record.get("id")),
        },
    }


def collection_of(record: Record, products_collection: str) -> str:
    """The collection of an item record (a product record of an older node: the products')."""
    collection = record.get("collection")
    return collection if isinstance(collection, str) else products_collection


def well_formed(record: object, database: str) -> bool:
    """A record as the store writes them (the journal may hold records edited by hand)."""
    if not isinstance(record, dict) or record.get("kind") not in (
        "product",
        "item",
        "reject",
        "touch",
        "gone",
        "report",
    ):
        return False
    if record["kind"] == "report":
        collection, doc, times = (
            record.get("collection"),
            record.get("doc"),
            record.get("times", []),
        )
        return (
            isinstance(record.get("id"), str) and isinstance(doc, dict) and "_id" not in doc
            and not any(isinstance(k, str) and k.startswith("$") for k in doc)
            and isinstance(times, list) and all(isinstance(t, str) for t in times)
            and all(isinstance(doc.get(t), int | float) and _storable_time(doc[t]) for t in times)
            and isinstance(collection, str) and collection_name_error(collection, database) is None
        )  # fmt: skip
    if record["kind"] in ("touch", "gone"):
        ids, collection = record.get("ids"), record.get("collection")
        return (
            isinstance(ids, list) and all(isinstance(key, str) for key in ids)
            and isinstance(collection, str) and collection_name_error(collection, database) is None
            and isinstance(record.get("seen"), int | float) and _storable_time(record["seen"])
            and (record["kind"] == "touch" or (
                isinstance(record.get("crawl_id"), str)
                and isinstance(record.get("before"), int | float)
                and _storable_time(record["before"])))
        )  # fmt: skip
    fields: dict[str, Any] = {"id": str, "doc": dict, "seen": int | float}
    if record["kind"] != "reject":
        fields |= {"hash": str, "crawl_id": str}
    if not all(isinstance(record.get(name), kind) for name, kind in fields.items()):
        return False
    if not _storable_time(record["seen"]):
        return False
    collection = record.get("collection")
    if record["kind"] == "item" or collection is not None:
        return isinstance(collection, str) and collection_name_error(collection, database) is None
    return True


def _storable_time(seen: float) -> bool:
    """*seen* is a finite Unix time a ``datetime`` (and so MongoDB) can hold."""
    if isinstance(seen, bool) or (isinstance(seen, float) and not math.isfinite(seen)):
        return False
    try:
        from_ms(to_ms(seen))
    except (OverflowError, ValueError):  # a hand-edited 1e300: years after 9999
        return False
    return True


def _digest(value: object) -> str:
    """A stable name for a bounded copy (JSON-safe by construction)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()
