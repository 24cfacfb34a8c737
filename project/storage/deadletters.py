"""Copies dead letters from the frontier into MongoDB's ``failures`` collection."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pymongo import AsyncMongoClient, UpdateOne
from pymongo.errors import PyMongoError

from project.storage.config import MongoConfig
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

__all__ = ["DeadLetterSink"]

logger = logging.getLogger(__name__)


class DeadLetterSink:
    """Upserts dead-letter records into MongoDB, keeping a bounded backlog.

    Redis' ``<spider>:dead`` list stays the source of truth (``fleetcrawl
    failures`` works on it); MongoDB gets a queryable copy. Records are keyed
    by their content hash, so sending one twice stores it once.
    """

    def __init__(
        self, uri: str, database: str, collection: str, stats: StatsCollector, backlog: int = 10000
    ) -> None:
        self.uri = uri
        self.database = database
        self.collection = collection
        self.stats = stats
        self.backlog_max = backlog
        self._pending: list[dict[str, Any]] = []
        self._client: AsyncMongoClient[dict[str, Any]] | None = None
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self._next_try = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DeadLetterSink:
        """The sink of the crawler's ``MONGO_*`` settings."""
        assert crawler.stats is not None
        config = MongoConfig.from_settings(crawler.settings, spider_name=crawler.spidercls.name)
        return cls(config.uri, config.database, config.failures_collection, crawler.stats)

    def kick(self) -> None:
        """Start a background flush if one is due; never waits for MongoDB."""
        if not self._pending or time.monotonic() < self._next_try:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.flush())

    def add(self, records: list[bytes]) -> None:
        for raw in records:
            doc = json.loads(raw)
            doc["_id"] = hashlib.sha1(raw).hexdigest()  # noqa: S324 (a key, not security)
            self._pending.append(doc)
        overflow = len(self._pending) - self.backlog_max
        if overflow > 0:
            # Still in Redis; only the MongoDB copy is skipped.
            del self._pending[:overflow]
            self.stats.inc_value("frontier/dead_export/skipped", overflow)

    async def flush(self) -> None:
        if not self._pending:
            return
        if self._client is None:
            self._client = AsyncMongoClient(self.uri, serverSelectionTimeoutMS=3000)
        # FerretDB 1.24 wedges on update commands touching 100+ documents.
        batch = self._pending[:50]
        try:
            await self._client[self.database][self.collection].bulk_write(
                [UpdateOne({"_id": d["_id"]}, {"$setOnInsert": d}, upsert=True) for d in batch],
                ordered=False,
            )
        except PyMongoError as exc:
            if not self._failing:
                logger.warning(
                    "Cannot copy %d dead letters to MongoDB at %s (%s); they stay in Redis,"
                    " retrying",
                    len(batch),
                    mask_url(self.uri),
                    type(exc).__name__,
                )
            self._failing = True
            self._next_try = time.monotonic() + 10.0
            return
        if self._failing:
            logger.info("Dead letters copied to MongoDB again")
        self._failing = False
        del self._pending[: len(batch)]
        self.stats.inc_value("frontier/dead_export/stored", len(batch))
        if self._pending:
            await self.flush()

    async def close(self) -> None:
        if self._task is not None:
            await self._task
        if self._pending:
            await self.flush()
        if self._client is not None:
            await self._client.close()
