"""FLEET_FEEDS: when a crawl run ends, its whole export, written once from MongoDB.

Scrapy's FEEDS write what one process scraped: on a fleet, one partial file per node. The
node that ends a run (project/runs/report.py) writes each of FLEET_FEEDS instead, from the
store: every item last seen in the run (``last_seen`` within its window), as an export reads
them (project/dataout/export.py). A URI takes Scrapy's placeholders ``%(name)s`` (the
spider), ``%(time)s`` (the run's end, ``2026-12-06T05-14-17``) and fleetcrawl's ``%(run)s``
and ``%(collection)s`` (one file per collection of the run's items; without it, the feed's
``collection`` option, else the one collection or MONGO_PRODUCTS_COLLECTION).

``file:`` URIs are written beside their path and renamed into place; ``s3://bucket/key``
goes up with botocore's ``put_object`` (credentials, region and ``AWS_ENDPOINT_URL`` from
the environment, as botocore reads them; one object of at most 5 GB). A feed that fails is
logged, counted (``feeds/failed``) and kept in the report with its error; it costs the
others nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from project.dataout.export import export_items
from project.dataout.query import ItemQuery
from project.utils import mask_url

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

    from project.dataout.config import Feed

__all__ = ["feed_uri", "write_feeds"]

logger = logging.getLogger(__name__)


def feed_uri(template: str, *, spider: str, run: str, ended: float, collection: str) -> str:
    """*template* with its placeholders filled."""
    moment = datetime.fromtimestamp(ended, UTC).strftime("%Y-%m-%dT%H-%M-%S")
    values = {"name": spider, "spider": spider, "run": run, "time": moment,
              "collection": collection}  # fmt: skip
    try:
        return template % values
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{mask_url(template)}: a placeholder it cannot fill ({exc})") from None


async def write_feeds(
    database: AsyncDatabase[dict[str, Any]],
    feeds: list[Feed],
    *,
    spider: str,
    run: str,
    window: tuple[int, int],
    until_ms: int,
    collections: list[str],
    default_collection: str,
) -> list[dict[str, Any]]:
    """Write every feed of the run; what became of each (for the run's report)."""
    done: list[dict[str, Any]] = []
    for feed in feeds:
        names = _collections_of(feed, collections, default_collection)
        for name in names:
            entry: dict[str, Any] = {"feed": mask_url(feed.uri), "collection": name}
            try:
                uri = feed_uri(feed.uri, spider=spider, run=run, ended=window[1] / 1000,
                               collection=name)  # fmt: skip
                entry["uri"] = mask_url(uri)
                query = ItemQuery(until_ms, None, window, feed.fields, feed.omit)
                entry["items"] = await _write_one(database[name], query, feed.format, uri)
            except Exception as exc:  # noqa: BLE001 (one feed's failure, whatever it is, is its own)
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                logger.error("Feed %s of run %s not written: %s", mask_url(feed.uri), run,
                             entry["error"])  # fmt: skip
            else:
                logger.info("Feed %s of run %s: %d items", entry["uri"], run, entry["items"])
            done.append(entry)
    return done


def _collections_of(feed: Feed, collections: list[str], default: str) -> list[str]:
    if "%(collection)s" in feed.uri:
        return collections or [default]
    if feed.collection:
        return [feed.collection]
    if len(collections) == 1:
        return collections
    return [default]


async def _write_one(collection: Any, query: ItemQuery, fmt: str, uri: str) -> int:
    """Export *query* into a temporary file, then put it where *uri* says."""
    parts = urlsplit(uri)
    if parts.scheme not in ("file", "s3"):
        raise ValueError(f"{mask_url(uri)}: not a file: or s3: URI")
    if parts.scheme == "file":
        target = Path(unquote(parts.path))
        partial = target.with_name(target.name + ".partial")
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
    else:
        handle, name = await asyncio.to_thread(tempfile.mkstemp, prefix="fleetcrawl-feed-")
        os.close(handle)
        partial = Path(name)
    # the file is written off the event loop, a page at a time
    out = await asyncio.to_thread(partial.open, "wb")
    try:
        exported = await export_items(
            collection, query, fmt, lambda data: asyncio.to_thread(out.write, data)
        )
    finally:
        await asyncio.to_thread(out.close)
    try:
        if parts.scheme == "file":
            await asyncio.to_thread(partial.replace, target)
        else:
            await asyncio.to_thread(_put_s3, parts.netloc, parts.path.lstrip("/"), partial, fmt)
    finally:
        if parts.scheme == "s3":
            await asyncio.to_thread(partial.unlink, missing_ok=True)
    return exported.count


def _put_s3(bucket: str, key: str, path: Path, fmt: str) -> None:
    import botocore.session

    from project.dataout.formats import CONTENT_TYPES

    client = botocore.session.get_session().create_client(
        "s3", region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
    )  # fmt: skip
    with path.open("rb") as body:
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType=CONTENT_TYPES[fmt])
