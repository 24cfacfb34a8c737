"""Batched, durable MongoDB writes shared by the validation and MongoDB pipelines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from pymongo import AsyncMongoClient, InsertOne, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, PyMongoError

from project.storage.config import MongoConfig
from project.storage.journal import Journal
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pymongo.asynchronous.collection import AsyncCollection
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.schema import Product

__all__ = ["MongoStore", "StoreWriteError"]

logger = logging.getLogger(__name__)

_FIRST_RETRY_DELAY = 0.5
# FerretDB 1.24 (SQLite) hangs for good on an update command that modifies 100 or more
# existing documents, so a batch is sent as several bulk commands of at most this many ops.
_MAX_OPS_PER_COMMAND = 50
_Record = dict[str, Any]
_Group = list[tuple[int, _Record]]
_DUPLICATE_KEY = 11000
_Pending = tuple[_Record, "asyncio.Future[None]"]


class StoreWriteError(Exception):
    """MongoDB refused to write one document (a permanent error: it is not retried)."""


_stores: WeakKeyDictionary[Crawler, MongoStore] = WeakKeyDictionary()


class MongoStore:
    """Writes products and rejects to MongoDB in batches, or to the local journal while it is away.

    ``save_*`` return once the record is durable: acknowledged by MongoDB in a bulk write, or
    appended and fsync'd to the journal. While the journal is not empty every write goes to it
    (so replays keep the order), and a background task retries MongoDB with exponential backoff,
    replays the journal segment by segment and deletes each segment once MongoDB acknowledged it.
    """

    def __init__(self, config: MongoConfig, stats: StatsCollector) -> None:
        self.config: MongoConfig = config
        self.journal: Journal = Journal(
            config.journal_dir, segment_records=max(1000, 20 * config.batch_size)
        )
        self._stats = stats
        self._client: AsyncMongoClient[dict[str, Any]] | None = None
        self._pending: list[_Pending] = []
        self._flush_lock = asyncio.Lock()
        self._flush_queued = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._recovery: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._journaling = False
        self._users = 0
        self._opening: asyncio.Task[None] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoStore:
        """The crawler's store, shared by every pipeline that writes through it."""
        store = _stores.get(crawler)
        if store is None:
            config = MongoConfig.from_settings(crawler.settings, spider_name=crawler.spidercls.name)
            assert crawler.stats is not None
            store = _stores[crawler] = cls(config, crawler.stats)
        return store

    @property
    def journaling(self) -> bool:
        """True while writes go to the journal instead of MongoDB."""
        return self._journaling

    async def open(self) -> None:
        """Connect, create the indexes, and start replaying a journal left by a previous run."""
        self._users += 1
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        await self._opening

    async def _open(self) -> None:
        config = self.config
        await asyncio.to_thread(self.journal.open)
        backlog = await asyncio.to_thread(self.journal.backlog)
        self._client = AsyncMongoClient(
            config.uri,
            serverSelectionTimeoutMS=int(config.server_selection_timeout * 1000),
            connectTimeoutMS=int(config.server_selection_timeout * 1000),
            socketTimeoutMS=int(config.socket_timeout * 1000),
            tz_aware=True,
            appname="fleetcrawl",
        )
        logger.info(
            "MongoDB store %s, database %s, crawl_id %s, journal %s",
            mask_url(config.uri), config.database, config.crawl_id, config.journal_dir,
        )  # fmt: skip
        if backlog:
            logger.info(
                "found %d journaled items in %s, replaying them first", backlog, config.journal_dir
            )
            self._start_journaling(delay=0.0)
            return
        try:
            await self._ensure_indexes()
        except PyMongoError as exc:
            self._switch_to_journal(exc)

    async def close(self) -> None:
        """Flush, make a last replay attempt, and disconnect (when the last user closes)."""
        self._users -= 1
        if self._users > 0 or self._client is None:
            return
        await self._flush()
        await asyncio.gather(*self._tasks)
        # Wake the retry loop for a last attempt rather than cancel it: a cancelled command
        # drops its connection mid-write, which FerretDB does not always survive.
        self._closing.set()
        if self._recovery is not None:
            await self._recovery
        if self._journaling:
            logger.warning(
                "closing with %d journaled items in %s: they are replayed at the next start",
                await asyncio.to_thread(self.journal.backlog), self.config.journal_dir,
            )  # fmt: skip
        await asyncio.to_thread(self.journal.close)
        client, self._client = self._client, None
        await client.close()

    async def save_product(self, product: Product, *, seen: float | None = None) -> None:
        """Upsert a product by canonical URL; return once it is durable."""
        doc = {**product.content(), "url": product.url, "rendered": product.rendered}
        record = {
            "kind": "product",
            "id": product.canonical_url,
            "doc": doc,
            "hash": product.content_hash(),
            "seen": time.time() if seen is None else seen,
            "crawl_id": self.config.crawl_id,
        }
        await self._submit(record)

    async def save_reject(
        self,
        item: Mapping[str, Any],
        reasons: Mapping[str, Sequence[str]],
        *,
        seen: float | None = None,
    ) -> None:
        """Store a rejected item with its reasons per field; return once it is durable."""
        raw = json.loads(json.dumps(dict(item), default=str))
        url = str(raw.get("url") or "")
        key = raw.get("canonical_url") if isinstance(raw.get("canonical_url"), str) else None
        doc = {
            "url": url,
            "canonical_url": key,
            "item": raw,
            "reasons": {field: list(messages) for field, messages in reasons.items()},
            "crawl_id": self.config.crawl_id,
        }
        record = {
            "kind": "reject",
            "id": f"{self.config.crawl_id}|{key or url}",
            "doc": doc,
            "seen": time.time() if seen is None else seen,
        }
        await self._submit(record)

    async def _submit(self, record: _Record) -> None:
        if self._client is None:
            raise RuntimeError("the MongoDB store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((record, future))
        # Group commit: an idle writer flushes at once (the item waits one
        # round trip, not the interval); while a write is under way items
        # gather into the next batch.
        if len(self._pending) >= self.config.batch_size or not self._flush_lock.locked():
            if not self._flush_queued:
                self._flush_queued = True
                self._spawn(self._flush())
        elif self._timer is None:
            self._timer = loop.call_later(
                self.config.flush_interval, lambda: self._spawn(self._flush())
            )
        await future

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        async with self._flush_lock:
            self._flush_queued = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._pending = self._pending, []
            size = self.config.batch_size
            for start in range(0, len(batch), size):
                chunk = batch[start : start + size]
                try:
                    await self._flush_chunk(chunk)
                except Exception as exc:  # every waiting item must hear about it, whatever it is
                    logger.exception("could not store %d items", len(chunk))
                    _settle(chunk, dict.fromkeys(range(len(chunk)), exc))
            if self._pending and not self._flush_queued:
                self._flush_queued = True
                self._spawn(self._flush())

    async def _flush_chunk(self, chunk: list[_Pending]) -> None:
        records = [record for record, _ in chunk]
        if not self._journaling:
            try:
                failures = await self._write(records)
            except PyMongoError as exc:
                self._switch_to_journal(exc)
            else:
                _settle(chunk, failures)
                return
        await asyncio.to_thread(self.journal.append, records)
        self._stats.inc_value("mongo/journaled", len(records))
        _settle(chunk, {})

    def _switch_to_journal(self, exc: PyMongoError) -> None:
        what = "unreachable" if isinstance(exc, ConnectionFailure) else "failed"
        logger.warning(
            "MongoDB %s (%s), journaling to %s", what, _describe(exc), self.config.journal_dir
        )
        self._start_journaling()

    def _start_journaling(self, delay: float = _FIRST_RETRY_DELAY) -> None:
        self._journaling = True
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.ensure_future(self._recover(delay))

    async def _recover(self, delay: float) -> None:
        next_delay = max(delay, _FIRST_RETRY_DELAY)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
            try:
                await self._replay()
            except (PyMongoError, OSError) as exc:
                self._stats.inc_value("mongo/retries")
                if self._closing.is_set():
                    return
                delay, next_delay = next_delay, min(next_delay * 2, self.config.retry_max_delay)
                log = logger.debug if isinstance(exc, PyMongoError) else logger.error
                log("journal replay failed (%s), next attempt in %.1f s", _describe(exc), delay)
            else:
                return

    async def _replay(self) -> None:
        """Replay the journal oldest segment first; switch back to direct writes once it is empty."""
        await self._ensure_indexes()
        announced = False
        while True:
            async with self._flush_lock:
                segments = self.journal.segments()
                if not segments:
                    self._journaling = False
                    if announced:
                        logger.info("journal replayed, writing to MongoDB directly again")
                    else:
                        logger.info("MongoDB back, writing to it directly again")
                    return
                self.journal.seal()  # appends from now on go to a new segment
            if not announced:
                backlog = await asyncio.to_thread(self.journal.backlog)
                logger.info(
                    "MongoDB back, replaying %d journaled items from %s",
                    backlog,
                    self.config.journal_dir,
                )
                announced = True
            for segment in segments:
                records = await asyncio.to_thread(self.journal.read, segment)
                for start in range(0, len(records), self.config.batch_size):
                    # Permanent per-document errors are logged and counted by _write; not retried.
                    await self._write(records[start : start + self.config.batch_size])
                await asyncio.to_thread(self.journal.remove, segment)
                self._stats.inc_value("mongo/replayed", len(records))

    async def _ensure_indexes(self) -> None:
        db = self._db()
        await db[self.config.products_collection].create_index("sku", name="sku")
        await db[self.config.rejects_collection].create_index("crawl_id", name="crawl_id")

    def _db(self) -> Any:
        if self._client is None:
            raise RuntimeError("the MongoDB store is not open")
        return self._client[self.config.database]

    async def _write(self, records: Sequence[_Record]) -> dict[int, Exception]:
        """Write one batch; return the permanent failures by record index."""
        products = [(i, r) for i, r in enumerate(records) if r["kind"] == "product"]
        rejects = [(i, r) for i, r in enumerate(records) if r["kind"] == "reject"]
        failures: dict[int, Exception] = {}
        counts: Counter[str] = Counter()
        if products:
            failures.update(await self._write_products(products, counts))
        if rejects:
            groups = _group(rejects)
            ops = [
                ReplaceOne(
                    {"_id": key},
                    {**group[-1][1]["doc"], "rejected_at": _time(group[-1][1]["seen"])},
                    upsert=True,
                )
                for key, group in groups.items()
            ]
            rejected, _ = await self._bulk(
                self._db()[self.config.rejects_collection], ops, list(groups.values())
            )
            failures.update(rejected)
        self._stats.inc_value("mongo/batches")
        for name, count in counts.items():
            self._stats.inc_value(f"mongo/{name}", count)
        return failures

    async def _write_products(
        self, products: list[tuple[int, _Record]], counts: Counter[str]
    ) -> dict[int, Exception]:
        collection = self._db()[self.config.products_collection]
        groups = _group(products)
        cursor = collection.find({"_id": {"$in": list(groups)}}, {"content_hash": 1})
        stored = {doc["_id"]: doc.get("content_hash") async for doc in cursor}
        new: list[tuple[dict[str, Any], _Group]] = []
        changed: list[tuple[UpdateOne, _Group]] = []
        unchanged: list[tuple[str, _Group]] = []
        group_counts: dict[str, Counter[str]] = {}
        for key, group in groups.items():
            exists, current, seen = key in stored, stored.get(key), Counter[str]()
            for _, record in group:
                if not exists:
                    seen["inserted"] += 1
                    exists = True
                elif record["hash"] != current:
                    seen["updated"] += 1
                else:
                    seen["unchanged"] += 1
                current = record["hash"]
            group_counts[key] = seen
            last = group[-1][1]
            content = {**last["doc"], "content_hash": last["hash"], "crawl_id": last["crawl_id"]}
            first_seen = _time(min(r["seen"] for _, r in group))
            last_seen = _time(max(r["seen"] for _, r in group))
            if key not in stored:
                new.append(
                    (
                        {"_id": key, **content, "first_seen": first_seen, "last_seen": last_seen},
                        group,
                    )
                )
            elif stored[key] != last["hash"]:
                update = {
                    "$set": content,
                    "$setOnInsert": {"first_seen": first_seen},
                    "$max": {"last_seen": last_seen},
                }
                changed.append((UpdateOne({"_id": key}, update, upsert=True), group))
            else:
                unchanged.append((key, group))

        # Inserts are far cheaper than upserts (40x on FerretDB); one that lost a race with
        # another writer (duplicate _id) is redone as an upsert.
        failures, duplicates = await self._bulk(
            collection, [InsertOne(doc) for doc, _ in new], [g for _, g in new]
        )
        for position in duplicates:
            doc, group = new[position]
            content = {k: v for k, v in doc.items() if k not in ("_id", "first_seen", "last_seen")}
            update = {
                "$set": content,
                "$setOnInsert": {"first_seen": doc["first_seen"]},
                "$max": {"last_seen": doc["last_seen"]},
            }
            changed.append((UpdateOne({"_id": doc["_id"]}, update, upsert=True), group))
        more, _ = await self._bulk(collection, [op for op, _ in changed], [g for _, g in changed])
        failures.update(more)
        # Unchanged content: only last_seen moves, one command per chunk (batch precision).
        for start in range(0, len(unchanged), _MAX_OPS_PER_COMMAND):
            chunk = unchanged[start : start + _MAX_OPS_PER_COMMAND]
            last_seen = _time(max(r["seen"] for _, group in chunk for _, r in group))
            await collection.update_many(
                {"_id": {"$in": [key for key, _ in chunk]}}, {"$max": {"last_seen": last_seen}}
            )
        for key, group in groups.items():
            if group[0][0] not in failures:
                counts.update(group_counts[key])
        return failures

    async def _bulk(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: Sequence[Any],
        groups: Sequence[_Group],
    ) -> tuple[dict[int, Exception], list[int]]:
        """Run ``ops`` unordered; return permanent failures by record index, and duplicate-key ops."""
        failures: dict[int, Exception] = {}
        duplicates: list[int] = []
        for start in range(0, len(ops), _MAX_OPS_PER_COMMAND):
            try:
                await collection.bulk_write(
                    list(ops[start : start + _MAX_OPS_PER_COMMAND]), ordered=False
                )
            except BulkWriteError as exc:
                if exc.details.get("writeConcernErrors"):
                    raise  # not acknowledged as asked: the whole batch is retried
                errors = exc.details.get("writeErrors", [])
                for error in errors:
                    if error.get("code") == _DUPLICATE_KEY:
                        duplicates.append(start + error["index"])
                        continue
                    for index, _ in groups[start + error["index"]]:
                        failures[index] = StoreWriteError(str(error.get("errmsg", "write error")))
                if len(duplicates) < len(errors):
                    logger.error(
                        "MongoDB refused %d of %d writes to %s, first: %s",
                        len(errors) - len(duplicates), len(ops), collection.name,
                        next(e.get("errmsg") for e in errors if e.get("code") != _DUPLICATE_KEY),
                    )  # fmt: skip
        if failures:
            self._stats.inc_value("mongo/write_errors", len(failures))
        return failures, duplicates


def _group(indexed: list[tuple[int, _Record]]) -> dict[str, list[tuple[int, _Record]]]:
    groups: dict[str, list[tuple[int, _Record]]] = {}
    for index, record in indexed:
        groups.setdefault(record["id"], []).append((index, record))
    return groups


def _settle(chunk: Sequence[_Pending], failures: Mapping[int, Exception]) -> None:
    for index, (_, future) in enumerate(chunk):
        if future.done():  # the waiting item was cancelled
            continue
        if index in failures:
            future.set_exception(failures[index])
        else:
            future.set_result(None)


def _time(seen: float) -> datetime:
    return datetime.fromtimestamp(seen, tz=UTC)


def _describe(exc: BaseException) -> str:
    text = str(exc).split(", Timeout:")[0]  # drop pymongo's topology description
    return f"{type(exc).__name__}: {text[:200]}"
