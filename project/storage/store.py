"""Batched, durable MongoDB writes shared by the validation and MongoDB pipelines.

Group commit, and the journal while MongoDB is away: what a batch does to each collection is
``project.storage.writes``, what a record holds ``project.storage.records``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from pymongo import AsyncMongoClient
from pymongo.errors import ConfigurationError, ConnectionFailure, PyMongoError
from pymongo.write_concern import WriteConcern
from scrapy import signals
from scrapy.exceptions import CloseSpider

from project.frontier.signals import item_stored_ref, items_still_there
from project.storage.config import MongoConfig, StorageConfigError
from project.storage.documents import MAX_BSON_SIZE
from project.storage.errors import (
    ItemNotStoredError,
    ItemRejectedError,
    describe,
    is_authentication_failure,
    severity,
)
from project.storage.journal import Journal, JournalLockedError
from project.storage.placement import place_product
from project.storage.records import item_record, reject_record, touch_record, well_formed
from project.storage.writes import BatchWriter
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pymongo.asynchronous.database import AsyncDatabase
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.schema import Product
    from project.storage.placement import PlacedItem

__all__ = ["ItemNotStoredError", "ItemRejectedError", "MongoStore"]

logger = logging.getLogger(__name__)

_FIRST_RETRY_DELAY = 0.5
#: Items remembered between their write and item_scraped (a dropped one never gets there).
_MAX_REFS = 10_000
#: Fields of one collection counted in ``coverage/...`` (an item's own keys are unbounded).
_MAX_COVERAGE_FIELDS = 64
#: A permanent error that goes on is logged again after this many seconds.
_REMIND_SECONDS = 600.0
_Record = dict[str, Any]
_Pending = tuple[_Record, "asyncio.Future[None]"]
_Document = dict[str, Any]

_stores: WeakKeyDictionary[Crawler, MongoStore] = WeakKeyDictionary()


class MongoStore:
    """Writes items and rejects to MongoDB in batches, or to the local journal while it is away.

    ``save_*`` return once the record is durable: acknowledged by MongoDB in a bulk write, or
    appended and fsync'd to the journal; they raise ``ItemNotStoredError`` when neither took it,
    and ``ItemRejectedError`` (a ``DropItem``) for a document MongoDB cannot take, which is
    stored in rejects with the reason instead. While the journal is not empty every write goes
    to it (so replays keep the order), and a background task retries MongoDB with exponential
    backoff, replays the journal segment by segment and deletes each segment once MongoDB
    acknowledged it. An item's content is written only by a record seen after the stored one
    (``last_seen``), so a late replay never overwrites what another node wrote since.
    """

    def __init__(self, config: MongoConfig, stats: StatsCollector) -> None:
        self.config: MongoConfig = config
        self.journal: Journal = Journal(
            config.journal_dir,
            database=config.database,
            legacy=config.legacy_journal_dirs,
            segment_records=max(1000, 20 * config.batch_size),
        )
        self._stats = stats
        self._client: AsyncMongoClient[_Document] | None = None
        self._database: AsyncDatabase[_Document] | None = None
        self._writer: BatchWriter | None = None
        self._pending: list[_Pending] = []
        self._flush_lock = asyncio.Lock()
        self._flush_queued = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._touches: set[asyncio.Future[None]] = set()
        self._recovery: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._journaling = False
        self._journal_failing = False
        self._last_error: tuple[str, float] | None = None
        self._users = 0
        self._opening: asyncio.Task[None] | None = None
        #: The finish reason of a node that could not open its store.
        self.fatal: str | None = None
        # items stored and not yet scraped, by id() with the item itself (an id() is reused
        # once its object is gone): revisits name them by (collection, _id)
        self._refs: dict[int, tuple[Any, tuple[str, str]]] = {}
        self._coverage: dict[str, set[str]] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoStore:
        """The crawler's store, shared by every pipeline that writes through it."""
        store = _stores.get(crawler)
        if store is None:
            try:
                config = MongoConfig.from_settings(
                    crawler.settings, spider_name=crawler.spidercls.name
                )
            except StorageConfigError as exc:
                logger.error("%s: this node cannot store items, so it does not start", exc)
                raise
            assert crawler.stats is not None
            store = _stores[crawler] = cls(config, crawler.stats)
            crawler.signals.connect(store.crawl_closed, signal=signals.spider_closed)
            # the frontier names the items it knows still there; the store keeps them
            crawler.signals.connect(store.stored_ref, signal=item_stored_ref)
            crawler.signals.connect(store.keep_alive, signal=items_still_there)
        return store

    @staticmethod
    def existing(crawler: Crawler) -> MongoStore | None:
        """The crawler's store if a pipeline made one."""
        return _stores.get(crawler)

    def use_crawl_id(self, crawl_id: str) -> None:
        """Stamp what is stored from now on with the fleet's crawl run (unless RUNS_CRAWL_ID is set)."""
        if not self.config.crawl_id_set:
            self.config = dataclasses.replace(self.config, crawl_id=crawl_id)

    def remember(self, item: Any, placed: PlacedItem) -> None:
        """Note where *item* was stored, until it is scraped (:meth:`stored_ref`)."""
        if len(self._refs) >= _MAX_REFS:
            self._refs.pop(next(iter(self._refs)))  # items that never reached item_scraped
        self._refs[id(item)] = (item, (placed.collection, placed.id))

    def stored_ref(self, item: Any) -> tuple[str, str] | None:
        """(collection, _id) *item* was stored under, once."""
        found = self._refs.pop(id(item), None)
        return found[1] if found is not None and found[0] is item else None

    def keep_alive(self, refs: Sequence[tuple[str, str]]) -> None:
        """Touch *refs* in the background (``items_still_there``): the sender does not wait."""
        task = asyncio.ensure_future(self.touch(refs))
        self._touches.add(task)
        task.add_done_callback(self._touched)

    def _touched(self, task: asyncio.Future[None]) -> None:
        self._touches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the items keep their last_seen: the run's end may call them gone, not lose them
            logger.error("could not keep %s alive: %s", "items", task.exception())

    async def touch(self, refs: Sequence[tuple[str, str]], *, seen: float | None = None) -> None:
        """Items still there though not parsed again (a 304): ``last_seen`` moves, durably."""
        by_collection: dict[str, list[str]] = {}
        for collection, key in refs:
            by_collection.setdefault(collection, []).append(key)
        at = time.time() if seen is None else seen
        for collection, keys in by_collection.items():
            await self._submit(
                touch_record(collection, keys, database=self.config.database, seen=at)
            )
        self._stats.inc_value("mongo/touched", len(refs))

    @property
    def journaling(self) -> bool:
        """True while writes go to the journal instead of MongoDB."""
        return self._journaling

    @property
    def write_concern(self) -> WriteConcern | None:
        """The write concern in force (None until MongoDB first answered)."""
        return self._database.write_concern if self._database is not None else None

    # -- opening and closing ---------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create the indexes, and start replaying a journal left by a previous run.

        Raises ``StorageConfigError`` when the node cannot work: the journal folder cannot be
        written, MongoDB refuses the credentials, or the write concern cannot be satisfied.
        """
        self._users += 1
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        await self._opening

    async def open_for_crawl(self) -> None:
        """:meth:`open` for a pipeline: a node that cannot store closes at once, and exits 1.

        The frontier's way (``project.frontier.scheduler``): one ERROR line, ``CloseSpider``
        with the reason (the engine honours it once the spider is open, so every component
        closes cleanly), and at ``spider_closed`` no spider, which ``scrapy crawl`` reports
        as a crawl that failed to start.
        """
        try:
            await self.open()
        except StorageConfigError as exc:
            self.fatal = exc.reason
            raise CloseSpider(exc.reason) from exc

    async def _open(self) -> None:
        try:
            await self._connect()
        except StorageConfigError as exc:
            logger.error("%s: this node cannot store items, so it does not start", exc)
            raise

    async def _connect(self) -> None:
        config = self.config
        try:
            await asyncio.to_thread(self.journal.open)
            backlog = await asyncio.to_thread(self.journal.backlog)
        except (OSError, JournalLockedError) as exc:
            raise StorageConfigError(
                f"cannot use the journal folder {config.journal_dir} ({exc}):"
                " set MONGO_JOURNAL_DIR to a folder this process may write",
                "journal_unusable",
            ) from exc
        try:
            self._client = AsyncMongoClient(
                config.uri,
                serverSelectionTimeoutMS=int(config.server_selection_timeout * 1000),
                connectTimeoutMS=int(config.server_selection_timeout * 1000),
                socketTimeoutMS=int(config.socket_timeout * 1000),
                tz_aware=True,
                appname="fleetcrawl",
            )
        except (ConfigurationError, ValueError) as exc:
            await asyncio.to_thread(self.journal.close)
            raise StorageConfigError(f"MONGO_URI {mask_url(config.uri)!r}: {exc}") from exc
        logger.info(
            "MongoDB store %s, database %s, crawl_id %s, journal %s",
            mask_url(config.uri), config.database, config.crawl_id, self.journal.directory,
        )  # fmt: skip
        try:
            await self._prepare()
        except StorageConfigError:
            await self._abandon()
            raise
        except PyMongoError as exc:
            if is_authentication_failure(exc):
                await self._abandon()
                raise StorageConfigError(
                    f"MongoDB at {mask_url(config.uri)} refused the credentials"
                    f" ({describe(exc)}): check the user and password in MONGO_URI",
                    "mongo_auth",
                ) from exc
            self._switch_to_journal(exc)
            return
        if backlog:
            logger.info(
                "found %d journaled items in %s, replaying them first", backlog, config.journal_dir
            )
            self._start_journaling(delay=0.0)

    async def _abandon(self) -> None:
        """Undo an open that cannot go on."""
        await asyncio.to_thread(self.journal.close)
        client, self._client = self._client, None
        if client is not None:
            await client.close()

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
        backlog = await asyncio.to_thread(self.journal.backlog)
        self._stats.set_value("mongo/journal_backlog", backlog)
        if backlog:
            logger.warning(
                "closing with %d journaled items in %s: they are replayed at the next start",
                backlog, self.journal.directory,
            )  # fmt: skip
        await asyncio.to_thread(self.journal.close)
        client, self._client = self._client, None
        await client.close()

    def crawl_closed(self, spider: Spider, reason: str) -> None:
        """``spider_closed``: a crawl that ``finished`` with a journal backlog says so."""
        if self.fatal is not None:
            spider.crawler.spider = None  # exit status 1: see open_for_crawl
        backlog = int(self._stats.get_value("mongo/journal_backlog", 0) or 0)
        if reason == "finished" and backlog:
            logger.warning(
                "crawl finished with %d items not in MongoDB yet: they wait in the journal %s"
                " on %s, and reach MongoDB only when a node starts there again with this"
                " MONGO_JOURNAL_DIR",
                backlog, self.config.journal_dir, socket.gethostname(), extra={"spider": spider},
            )  # fmt: skip

    # -- saving ----------------------------------------------------------------------------

    async def save_product(self, product: Product, *, seen: float | None = None) -> None:
        """Upsert a product into the products collection by canonical URL, once it is durable."""
        await self.save_item(place_product(product, self.config.products_collection), seen=seen)

    async def save_item(self, placed: PlacedItem, *, seen: float | None = None) -> None:
        """Upsert an item into its collection by ``_id``; return once it is durable."""
        self._count_coverage(placed)
        await self._submit(
            item_record(
                placed,
                database=self.config.database,
                crawl_id=self.config.crawl_id,
                seen=time.time() if seen is None else seen,
                spider=self.config.spider,
            )
        )

    def _count_coverage(self, placed: PlacedItem) -> None:
        """``coverage/<collection>/<field>``: items with that field filled, for the run report."""
        fields = self._coverage.setdefault(placed.collection, set())
        self._stats.inc_value(f"coverage/{placed.collection}/items")
        for key, value in placed.doc.items():
            if value is None or value == "" or value == [] or value == {}:
                continue
            if key not in fields:
                if len(fields) >= _MAX_COVERAGE_FIELDS:
                    continue  # items with keys of their own: their first fields only
                fields.add(key)
            self._stats.inc_value(f"coverage/{placed.collection}/{key}")

    async def save_reject(
        self,
        item: Mapping[str, Any],
        reasons: Mapping[str, Sequence[str]],
        *,
        seen: float | None = None,
        item_type: str | None = None,
    ) -> None:
        """Store a rejected item with its reasons per field; return once it is durable.

        *item_type* names the type of an item that is not a product (it is part of the id).
        """
        await self._submit(
            reject_record(
                item,
                reasons,
                database=self.config.database,
                crawl_id=self.config.crawl_id,
                seen=time.time() if seen is None else seen,
                item_type=item_type,
            )
        )

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
        try:
            await asyncio.to_thread(self.journal.append, records)
        except OSError as exc:
            self._journal_failed(exc, len(records))
            _settle(chunk, {i: self._not_stored(exc) for i in range(len(chunk))})
            return
        if self._journal_failing:
            self._journal_failing = False
            logger.warning("the journal %s takes items again", self.journal.directory)
        self._stats.inc_value("mongo/journaled", len(records))
        _settle(chunk, {})

    def _journal_failed(self, exc: OSError, count: int) -> None:
        """Neither MongoDB nor the disk takes the items: the pipeline must fail them."""
        self._stats.inc_value("mongo/journal_errors", count)
        if not self._journal_failing:
            self._journal_failing = True
            logger.error(
                "cannot journal %d items to %s (%s) while MongoDB is unavailable: they are not"
                " stored, and the pipeline fails them",
                count, self.journal.directory, describe(exc),
            )  # fmt: skip

    def _not_stored(self, exc: OSError) -> ItemNotStoredError:
        error = ItemNotStoredError(
            f"neither MongoDB nor the journal {self.journal.directory} took the item"
            f" ({describe(exc)})"
        )
        error.__cause__ = exc
        return error

    # -- MongoDB unavailable: the journal and its replay -----------------------------------

    def _switch_to_journal(self, exc: PyMongoError) -> None:
        if severity(exc) == "permanent":
            self._permanent_error(exc, f"writes refused, journaling to {self.journal.directory}")
        else:
            what = "unreachable" if isinstance(exc, ConnectionFailure) else "failed"
            logger.warning(
                "MongoDB %s (%s), journaling to %s", what, describe(exc), self.journal.directory
            )
        self._start_journaling()

    def _permanent_error(self, exc: BaseException, what: str) -> None:
        """A fault only an operator can fix: an ERROR (again when it changes), a stat, the text."""
        text = f"{what}: {describe(exc)}"
        self._stats.inc_value("mongo/permanent_errors")
        self._stats.set_value("mongo/last_error", text)
        now = time.monotonic()
        last = self._last_error
        if last is None or last[0] != text or now - last[1] >= _REMIND_SECONDS:
            self._last_error = (text, now)
            logger.error("MongoDB at %s: %s", mask_url(self.config.uri), text)

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
            except Exception as exc:  # noqa: BLE001 (this loop must outlive any failure)
                self._stats.inc_value("mongo/retries")
                if self._closing.is_set():
                    return
                delay, next_delay = next_delay, min(next_delay * 2, self.config.retry_max_delay)
                self._replay_failed(exc, delay)
            else:
                return

    def _replay_failed(self, exc: Exception, delay: float) -> None:
        if isinstance(exc, PyMongoError) and severity(exc) == "transient":
            logger.debug("journal replay failed (%s), next attempt in %.1f s", describe(exc), delay)
        elif isinstance(exc, PyMongoError | StorageConfigError):
            self._permanent_error(exc, f"journal replay refused, items wait in {self.journal.base}")
        elif isinstance(exc, OSError):
            logger.error("journal replay failed (%s), next attempt in %.1f s", describe(exc), delay)
        else:
            logger.error("journal replay failed, next attempt in %.1f s", delay, exc_info=exc)

    async def _replay(self) -> None:
        """Replay the journal oldest segment first; switch back to direct writes once it is empty."""
        await self._prepare()
        assert self._database is not None
        # a server that answers, before "MongoDB back" is said: _prepare does no I/O once done
        await self._database.command("ping")
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
                    self.journal.directory,
                )
                announced = True
            for segment in segments:
                records = await asyncio.to_thread(self.journal.read, segment)
                database = self.config.database
                if malformed := [r for r in records if not well_formed(r, database)]:
                    # Not written by this store (edited by hand, another program): dropped.
                    self._stats.inc_value("mongo/journal_malformed", len(malformed))
                    logger.error("dropping %d malformed records of %s", len(malformed), segment)
                    records = [r for r in records if well_formed(r, database)]
                for start in range(0, len(records), self.config.batch_size):
                    # What MongoDB cannot take goes to rejects: a record never blocks the replay.
                    await self._write(records[start : start + self.config.batch_size])
                await asyncio.to_thread(self.journal.remove, segment)
                self._stats.inc_value("mongo/replayed", len(records))

    # -- what the server supports ----------------------------------------------------------

    async def _prepare(self) -> None:
        """Learn the server's write concern and document size, and create the indexes (once)."""
        if self._database is not None:
            return
        if self._client is None:
            raise RuntimeError("the MongoDB store is not open")
        hello = await self._client.admin.command("hello")
        concern = self._write_concern(hello)
        database = self._client.get_database(self.config.database, write_concern=concern)
        await self._ensure_indexes(database)
        self._writer = BatchWriter(
            database,
            self._stats,
            products_collection=self.config.products_collection,
            rejects_collection=self.config.rejects_collection,
            changes_collection=self.config.changes_collection,
            max_bson=int(hello.get("maxBsonObjectSize") or MAX_BSON_SIZE),
        )
        self._database = database

    def _write_concern(self, hello: Mapping[str, Any]) -> WriteConcern:
        """``MONGO_WRITE_CONCERN``; on a single server (FerretDB, a standalone mongod), ``w=1``."""
        wanted = self.config.write_concern
        w: int | str = int(wanted) if wanted.isdigit() else wanted
        replicated = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
        if not replicated:
            if w not in ("majority", 1):
                raise StorageConfigError(
                    f"MONGO_WRITE_CONCERN={wanted} needs a replica set, but MongoDB at"
                    f" {mask_url(self.config.uri)} is a single server: set it to majority or 1",
                    "mongo_write_concern",
                )
            if w == "majority":
                logger.info(
                    "MongoDB at %s is a single server, not a replica set: a write is durable"
                    " once it acknowledges it (w=1); MONGO_WRITE_CONCERN=majority applies to"
                    " replica sets",
                    mask_url(self.config.uri),
                )
            w = 1
        self._stats.set_value("mongo/write_concern", str(w))
        return WriteConcern(w=w)

    async def _ensure_indexes(self, database: AsyncDatabase[_Document]) -> None:
        """Create the query indexes; one the server refuses for good is an ERROR, not an outage."""
        for collection, key in (
            (self.config.products_collection, "sku"),
            (self.config.rejects_collection, "crawl_id"),
            (self.config.changes_collection, "item_id"),
            (self.config.changes_collection, "at"),
        ):
            try:
                await database[collection].create_index(key, name=key)
            except PyMongoError as exc:
                # Items are found by _id: without these indexes only queries are slower.
                if severity(exc) == "transient" or is_authentication_failure(exc):
                    raise
                self._permanent_error(
                    exc,
                    f"cannot create the index {key} of {self.config.database}.{collection}"
                    " (writes go on without it)",
                )

    async def _write(self, records: Sequence[_Record]) -> dict[int, Exception]:
        """Write one batch; return the items MongoDB cannot take (stored in rejects instead)."""
        if self._writer is None:
            raise RuntimeError("the MongoDB store is not prepared")
        return await self._writer.write(records)


def _settle(chunk: Sequence[_Pending], failures: Mapping[int, BaseException]) -> None:
    for index, (_, future) in enumerate(chunk):
        if future.done():  # the waiting item was cancelled
            continue
        if index in failures:
            future.set_exception(failures[index])
        else:
            future.set_result(None)
