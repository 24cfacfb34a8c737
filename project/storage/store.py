"""Batched, durable MongoDB writes shared by the validation and MongoDB pipelines.

Group commit, and the journal while MongoDB is away: what a batch does to each collection is
``project.storage.writes``, what a record holds ``project.storage.records``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from pymongo import AsyncMongoClient
from pymongo.errors import ConfigurationError, ConnectionFailure, PyMongoError
from pymongo.write_concern import WriteConcern
from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import CloseSpider

from project.frontier.config import FrontierConfig
from project.frontier.signals import (
    frontier_started,
    item_stored_ref,
    items_gone,
    items_still_there,
)
from project.storage.backlog import StoreBacklog, record_bytes
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
from project.storage.outbox import Outbox
from project.storage.placement import place_product
from project.storage.records import (
    gone_record,
    item_record,
    reject_record,
    touch_record,
    well_formed,
)
from project.storage.writes import BatchWriter
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pymongo.asynchronous.database import AsyncDatabase
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.frontier.keys import FrontierKeys
    from project.schema import Product
    from project.storage.placement import PlacedItem

__all__ = ["EXIT_NOT_STORED", "ItemNotStoredError", "ItemRejectedError", "MongoStore"]

logger = logging.getLogger(__name__)

_FIRST_RETRY_DELAY = 0.5
#: Items remembered between their write and item_scraped (a dropped one never gets there).
_MAX_REFS = 10_000
#: Fields of one collection counted in ``coverage/...`` (an item's own keys are unbounded).
_MAX_COVERAGE_FIELDS = 64
#: A permanent error that goes on is logged again after this many seconds.
_REMIND_SECONDS = 600.0
#: How often a node whose MongoDB answers looks for records in the fleet's outbox.
_OUTBOX_CHECK_SECONDS = 2.0
#: A node done crawling says what still waits for MongoDB this often.
_WAITING_LOG_SECONDS = 60.0
#: Journaled records moved to the outbox per push.
_MOVE_BATCH = 500
#: The exit status of a node that crawled but could not store everything it found.
EXIT_NOT_STORED = 3
_Record = dict[str, Any]
_Pending = tuple[_Record, "asyncio.Future[None]"]
_Document = dict[str, Any]

_stores: WeakKeyDictionary[Crawler, MongoStore] = WeakKeyDictionary()


class MongoStore:
    """Writes items and rejects to MongoDB in batches; while it is away, to the fleet's outbox.

    ``save_*`` return once the record is durable: acknowledged by MongoDB in a bulk write, or
    appended and fsync'd to the journal; they raise ``ItemNotStoredError`` when neither took it,
    and ``ItemRejectedError`` (a ``DropItem``) for a document MongoDB cannot take, which is
    stored in rejects with the reason instead. While the journal is not empty every write goes
    to it (so replays keep the order), and a background task retries MongoDB with exponential
    backoff, replays the journal segment by segment and deletes each segment once MongoDB
    acknowledged it. An item's content is written only by a record seen after the stored one
    (``last_seen``), so a late replay never overwrites what another node wrote since.

    On a fleet node (the frontier announces its keys) MongoDB's absence sends batches to the
    fleet's outbox in Redis first (project/storage/outbox.py) and to the journal only when
    Redis refuses them too; journaled records move to the outbox once Redis takes them, and
    any node whose MongoDB answers drains the outbox. A node that is done waits, up to
    ``MONGO_DRAIN_TIMEOUT``, until nothing waits; then ``mongo/not_stored`` counts what still
    does and a ``scrapy`` command exits 3, ``EXIT_NOT_STORED`` (an exit handler: Scrapy's
    crawl command has no other way for a component to set its status).
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
        #: what waits to be stored; behind, the frontier starts no more downloads
        self.backlog = StoreBacklog(stats, config.max_waiting, config.max_waiting_bytes)
        self._client: AsyncMongoClient[_Document] | None = None
        self._database: AsyncDatabase[_Document] | None = None
        self._writer: BatchWriter | None = None
        self._pending: list[_Pending] = []
        self._flush_lock = asyncio.Lock()
        self._flush_queued = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._touches: set[asyncio.Future[None]] = set()
        #: Stamps what is stored: the fleet's clock once the frontier started (frontier_ready)
        self._now: Callable[[], float] = time.time
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
        self.outbox: Outbox | None = None
        self._outbox_trouble: str | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._drain_lock = asyncio.Lock()
        self._outbox_known = 0
        self._settings: Any = None
        #: Records that still waited for MongoDB when this node gave up (MONGO_DRAIN_TIMEOUT).
        self.not_stored = 0
        #: A node that gave up exits 3, in a ``scrapy`` command (``scrapy crawl``, scrapyd's
        #: runner): not a process that runs crawls of its own (a test, ``fleetcrawl store drain``).
        self.exit_when_not_stored = _in_scrapy_command()

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
            store._settings = crawler.settings
            store.backlog.signals = crawler.signals
            crawler.signals.connect(store.crawl_closed, signal=signals.spider_closed)
            # a fleet node: while MongoDB is away, items wait in the fleet's Redis
            crawler.signals.connect(store.frontier_ready, signal=frontier_started)
            # the frontier names the items it knows still there; the store keeps them
            crawler.signals.connect(store.stored_ref, signal=item_stored_ref)
            crawler.signals.connect(store.keep_alive, signal=items_still_there)
            crawler.signals.connect(store.mark_gone, signal=items_gone)
        return store

    def frontier_ready(self, keys: FrontierKeys, loop: Any = None) -> None:
        """``frontier_started``: the fleet's clock (Redis', which stamps what is stored from
        now on) and its outbox for this database, unless turned off."""
        clock = getattr(loop, "clock", None)
        if clock is not None:
            self._now = clock.now
        if self.outbox is not None or self.config.outbox_max_bytes <= 0 or self._settings is None:
            return
        client = FrontierConfig.from_settings(self._settings).client(
            socket_timeout=10, socket_connect_timeout=5
        )
        self.outbox = Outbox(
            client, f"{keys.outbox}:{self.config.database}", max_bytes=self.config.outbox_max_bytes
        )
        self._watch_once_open()

    def _watch_once_open(self) -> None:
        """Start the outbox's watcher once the store is open and has an outbox."""
        if self.outbox is not None and self._client is not None and self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch_outbox())

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
        self._in_background(self.touch(refs))

    def mark_gone(self, refs: Sequence[tuple[str, str]], before: float) -> None:
        """Mark *refs* gone in the background (``items_gone``): the sender does not wait."""
        if self.config.mark_gone:
            self._in_background(self.gone(refs, before=before))

    def _in_background(self, work: Any) -> None:
        """A touch or a gone mark, awaited by close() before the store drains."""
        task = asyncio.ensure_future(work)
        self._touches.add(task)
        task.add_done_callback(self._touched)

    async def gone(
        self, refs: Sequence[tuple[str, str]], *, before: float, at: float | None = None
    ) -> None:
        """Items their page no longer has: ``gone_at`` *at* (now), durably, unless seen
        after *before* (the page's last fetch that named them)."""
        when = self._now() if at is None else at
        for collection, keys in _by_collection(refs).items():
            record = gone_record(
                collection, keys, database=self.config.database, at=when, before=before,
                crawl_id=self.config.crawl_id, spider=self.config.spider,
            )  # fmt: skip
            await self._submit(record)
        self._stats.inc_value("mongo/gone_evidence", len(refs))

    def _touched(self, task: asyncio.Future[None]) -> None:
        self._touches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # a touch or a gone mark not written: the items keep what they had
            logger.error("could not touch or mark items: %s", task.exception())

    async def touch(self, refs: Sequence[tuple[str, str]], *, seen: float | None = None) -> None:
        """Items still there though not parsed again (a 304): ``last_seen`` moves, durably."""
        at = self._now() if seen is None else seen
        for collection, keys in _by_collection(refs).items():
            record = touch_record(
                collection, keys, database=self.config.database, seen=at,
                crawl_id=self.config.crawl_id, spider=self.config.spider,
            )  # fmt: skip
            await self._submit(record)
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
        self._watch_once_open()

    async def _abandon(self) -> None:
        """Undo an open that cannot go on."""
        await asyncio.to_thread(self.journal.close)
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def close(self) -> None:
        """Flush, wait until nothing waits for MongoDB (up to ``MONGO_DRAIN_TIMEOUT``), and
        disconnect (when the last user closes)."""
        self._users -= 1
        if self._users > 0 or self._client is None:
            return
        await self._flush()
        await asyncio.gather(*self._touches, return_exceptions=True)  # they log their own errors
        await self._flush()
        await asyncio.gather(*self._tasks)
        waiting = await self._wait_stored()
        # Wake the retry loop for a last attempt rather than cancel it: a cancelled command
        # drops its connection mid-write, which FerretDB does not always survive.
        self._closing.set()
        if self._watcher is not None:
            await self._watcher  # first: a write it fails may start the retry loop again
        while self._recovery is not None and not self._recovery.done():
            await self._recovery
        if waiting:
            # what the journal holds goes where every node can reach it, if Redis takes it
            try:
                await self._journal_to_outbox()
            except OSError as exc:
                logger.error(
                    "cannot move the journal %s to the outbox: %s", self.journal.directory, exc
                )
            waiting = await self._waiting()
        backlog = await asyncio.to_thread(self.journal.backlog)
        self._stats.set_value("mongo/journal_backlog", backlog)
        if waiting:
            self._gave_up(waiting)
        await asyncio.to_thread(self.journal.close)
        if self.outbox is not None:
            await self.outbox.client.aclose()
        client, self._client = self._client, None
        await client.close()

    async def _waiting(self) -> dict[str, int]:
        """Records not in MongoDB yet: in this node's journal, and in the fleet's outbox."""
        found = {"journal": await asyncio.to_thread(self.journal.backlog)}
        if self.outbox is not None:
            try:
                self._outbox_known = (await self.outbox.size()).records
            except RedisError as exc:
                # what it held when last read still waits, as far as this node knows
                self._outbox_unusable(f"Redis unreachable ({exc})")
            found["outbox"] = self._outbox_known
        return {where: count for where, count in found.items() if count}

    async def _wait_stored(self) -> dict[str, int]:
        """Until nothing waits for MongoDB, or MONGO_DRAIN_TIMEOUT: this node does not leave
        its run while items it crawled are not stored. Returns what still waits."""
        started = time.monotonic()
        deadline = started + self.config.drain_timeout
        told: float | None = None
        while waiting := await self._waiting():
            now = time.monotonic()
            if now >= deadline:
                return waiting
            if told is None or now - told >= _WAITING_LOG_SECONDS:
                told = now
                logger.warning(
                    "crawled, waiting for MongoDB at %s to store %s (%.0f s of"
                    " MONGO_DRAIN_TIMEOUT %.0f s)",
                    mask_url(self.config.uri), self._describe_waiting(waiting), now - started,
                    self.config.drain_timeout,
                )  # fmt: skip
            if not self._journaling:  # else the retry loop writes, or moves the journal
                await self._drain_outbox(until=deadline)
            await asyncio.sleep(1.0)
        return {}

    def _describe_waiting(self, waiting: Mapping[str, int]) -> str:
        parts = []
        if waiting.get("outbox"):
            assert self.outbox is not None
            parts.append(f"{waiting['outbox']} records in the outbox {self.outbox.key} of Redis")
        if waiting.get("journal"):
            parts.append(
                f"{waiting['journal']} in the journal {self.journal.directory} on"
                f" {socket.gethostname()}"
            )
        return " and ".join(parts)

    def _gave_up(self, waiting: Mapping[str, int]) -> None:
        """MONGO_DRAIN_TIMEOUT ran out: say how many wait and where, and exit 3."""
        self.not_stored = sum(waiting.values())
        self._stats.set_value("mongo/not_stored", self.not_stored)
        for where, count in waiting.items():
            self._stats.set_value(f"mongo/not_stored/{where}", count)
        how = (
            f"`fleetcrawl store drain --spider {self.config.spider}` or any node of this spider writes"
            " the outbox once MongoDB answers"
        )
        if waiting.get("journal"):
            how += (
                f"; the journal only a node started on {socket.gethostname()} with"
                f" MONGO_JOURNAL_DIR={self.config.journal_dir}"
            )
        logger.error(
            "crawled, not stored: MongoDB at %s did not answer within MONGO_DRAIN_TIMEOUT %.0f s;"
            " %s wait: %s",
            mask_url(self.config.uri), self.config.drain_timeout, self._describe_waiting(waiting),
            how,
        )  # fmt: skip
        if self.exit_when_not_stored:
            atexit.register(_exit_not_stored)

    def crawl_closed(self, spider: Spider, reason: str) -> None:
        """``spider_closed``: a node that could not open its store exits 1."""
        if self.fatal is not None:
            spider.crawler.spider = None  # exit status 1: see open_for_crawl

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
                seen=self._now() if seen is None else seen,
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
                seen=self._now() if seen is None else seen,
                item_type=item_type,
            )
        )

    async def _submit(self, record: _Record) -> None:
        if self._client is None:
            raise RuntimeError("the MongoDB store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        size = record_bytes(record)
        self.backlog.added(size)
        future.add_done_callback(lambda _: self.backlog.done(size))
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
        if await self._to_outbox(records):
            _settle(chunk, {})
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

    # -- the fleet's outbox (project/storage/outbox.py) -------------------------------------

    async def _to_outbox(self, records: Sequence[_Record]) -> bool:
        """Put *records* in the fleet's outbox; False when there is none or Redis refuses."""
        if self.outbox is None:
            return False
        try:
            taken = await self.outbox.push(records)
        except RedisError as exc:
            self._outbox_unusable(f"Redis unreachable ({exc})")
            return False
        if not taken:
            self._stats.inc_value("mongo/outbox_full", len(records))
            self._outbox_unusable(
                f"the outbox is full (MONGO_OUTBOX_MAX_BYTES {self.outbox.max_bytes})"
            )
            return False
        if self._outbox_trouble is not None:
            logger.warning("the outbox %s takes records again", self.outbox.key)
            self._outbox_trouble = None
        self._stats.inc_value("mongo/outboxed", len(records))
        return True

    def _outbox_unusable(self, why: str) -> None:
        if self._outbox_trouble != why:
            self._outbox_trouble = why
            logger.warning(
                "cannot put records in the outbox %s: %s; journaling to %s",
                self.outbox.key if self.outbox else "", why, self.journal.directory,
            )  # fmt: skip

    async def _journal_to_outbox(self) -> None:
        """Move journaled records (sealed segments) to the outbox, while Redis takes them."""
        if self.outbox is None or not self.journal.segments():
            return
        async with self._flush_lock:
            self.journal.seal()
        for segment in self.journal.sealed_segments():
            records = await asyncio.to_thread(self.journal.read, segment)
            records = [r for r in records if well_formed(r, self.config.database)]
            for start in range(0, len(records), _MOVE_BATCH):
                if not await self._to_outbox(records[start : start + _MOVE_BATCH]):
                    return  # the rest stays in the journal; what was moved is stored once
            await asyncio.to_thread(self.journal.remove, segment)
            self._stats.inc_value("mongo/journal_to_outbox", len(records))
            logger.info(
                "moved %d journaled records of %s to the outbox %s",
                len(records), segment, self.outbox.key,
            )  # fmt: skip

    async def _watch_outbox(self) -> None:
        """While this node's MongoDB answers, write what other nodes left in the outbox."""
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), _OUTBOX_CHECK_SECONDS)
            if self._closing.is_set() or self._journaling or self._client is None:
                continue
            await self._drain_outbox(until=time.monotonic() + _OUTBOX_CHECK_SECONDS * 10)

    async def _drain_outbox(self, until: float | None = None) -> int:
        """Write the outbox to MongoDB, oldest first, if no other node does; records written.

        Never raises: MongoDB failing sends this node back to its retry loop, Redis failing
        leaves the outbox for the next attempt.
        """
        outbox = self.outbox
        if outbox is None or self._drain_lock.locked():
            return 0
        written = 0
        async with self._drain_lock:
            try:
                if not (await outbox.size()).records:
                    return 0  # the lease is taken, and renewed, before each write below
                await self._prepare()
                while entries := await outbox.head(self.config.batch_size):
                    if until is not None and time.monotonic() >= until:
                        break  # the caller's deadline: the next attempt goes on
                    if not await outbox.lease():  # renewed before each write
                        return written
                    records, bad = self._readable(entries)
                    await outbox.set_aside(bad)
                    if records:
                        await self._write(records)
                    if not await outbox.remove(len(entries)):
                        break  # the lease lapsed: its new holder writes these again
                    written += len(records)
                    self._stats.inc_value("mongo/drained", len(records))
                await outbox.release()
            except RedisError as exc:
                logger.warning("cannot read the outbox %s (%s): trying again", outbox.key, exc)
            except PyMongoError as exc:
                self._switch_to_journal(exc)
            except Exception:
                logger.exception("could not write the outbox %s", outbox.key)
        if written:
            logger.info("wrote %d records of the outbox %s to MongoDB", written, outbox.key)
        return written

    def _readable(self, entries: Sequence[bytes]) -> tuple[list[_Record], list[bytes]]:
        """The entries that are records of this store, and the others (counted, logged)."""
        records, bad = [], []
        for entry in entries:
            try:
                record = json.loads(entry)
            except (ValueError, RecursionError):
                record = None
            if well_formed(record, self.config.database):
                records.append(record)
            else:
                bad.append(entry)
        if bad:
            assert self.outbox is not None
            self._stats.inc_value("mongo/outbox_malformed", len(bad))
            logger.error(
                "%d entries of the outbox %s are not records of this store: set aside in %s",
                len(bad), self.outbox.key, f"{self.outbox.key}:malformed",
            )  # fmt: skip
        return records, bad

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
                # MongoDB still away: what the journal holds goes where every node can reach it
                with contextlib.suppress(OSError):
                    await self._journal_to_outbox()
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
            now=lambda: self._now(),
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


def _by_collection(refs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """(collection, _id) pairs as collection -> its ids, in order."""
    grouped: dict[str, list[str]] = {}
    for collection, key in refs:
        grouped.setdefault(collection, []).append(key)
    return grouped


def _settle(chunk: Sequence[_Pending], failures: Mapping[int, BaseException]) -> None:
    for index, (_, future) in enumerate(chunk):
        if future.done():  # the waiting item was cancelled
            continue
        if index in failures:
            future.set_exception(failures[index])
        else:
            future.set_result(None)


def _in_scrapy_command() -> bool:
    """This process is a ``scrapy`` command: the console script, ``python -m scrapy``, or
    scrapyd's runner."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None) or ""
    if name in ("scrapy.__main__", "scrapy.cmdline", "scrapyd.runner"):
        return True
    return Path(sys.argv[0] if sys.argv else "").name == "scrapy"


def _exit_not_stored() -> None:
    """At exit, after a node gave up waiting for MongoDB: status 3, "crawled, not stored".

    Scrapy's ``crawl`` command has one status for a crawl that failed (1) and none of its
    components can set another, so the last exit handler registered (atexit runs them
    newest first) flushes what the logging module and the standard streams hold and ends the
    process with it.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_NOT_STORED)


class _Counts(dict[str, Any]):
    """The part of Scrapy's stats collector the store uses, for a store outside a crawl."""

    def inc_value(self, key: str, count: int = 1, start: int = 0) -> None:
        self[key] = self.get(key, start) + count

    def set_value(self, key: str, value: Any) -> None:
        self[key] = value

    def get_value(self, key: str, default: Any = None) -> Any:
        return self.get(key, default)


async def drain(settings: Any, spider: str, keys: FrontierKeys, timeout: float) -> dict[str, Any]:
    """``fleetcrawl store drain``: write *spider*'s outbox, and the journals this host's dead
    nodes left in ``MONGO_JOURNAL_DIR``, to MongoDB; wait up to *timeout* seconds for it.

    Returns the counts: ``drained`` and ``replayed`` records, ``not_stored`` still waiting.
    """
    config = MongoConfig.from_settings(settings, spider_name=spider)
    counts = _Counts()
    store = MongoStore(dataclasses.replace(config, drain_timeout=timeout), counts)  # type: ignore[arg-type]
    store._settings = settings
    store.frontier_ready(keys)
    if store.outbox is not None:  # MONGO_OUTBOX_MAX_BYTES = 0: the journals only
        try:
            # Redis unreachable: the command says so (RedisError), not "0 written"
            await store.outbox.client.ping()
        except RedisError:
            await store.outbox.client.aclose()
            raise
    await store.open()
    await store.close()
    return {
        "outbox": store.outbox.key if store.outbox is not None else None,
        "drained": counts.get("mongo/drained", 0),
        "replayed": counts.get("mongo/replayed", 0),
        "malformed": counts.get("mongo/outbox_malformed", 0),
        "not_stored": store.not_stored,
    }
