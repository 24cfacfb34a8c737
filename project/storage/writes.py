"""One batch of records written to MongoDB: items by collection with change tracking, rejects.

Per collection, a batch reads the content hash, ``first_seen`` and ``last_seen`` of the
documents it touches, plans each ``_id`` from its records in the order they were seen
(:func:`plan`), inserts new documents, replaces the content of changed ones (a field the item
no longer has goes with it) and only moves ``last_seen`` of unchanged ones. Content is written
only by a record seen after the stored one, so a late replay never overwrites what another node
wrote since (``mongo/stale``). Records of one ``_id`` with different content in one batch
overwrite each other: for ids made from a URL (many items of one page, each with
``url=response.url``) that is a WARNING, once per type and collection, and
``mongo/<collection>/overwritten``.

Every content write (an insert, a rewrite, a gone mark) and every change document is stamped
``written_at``: the fleet's clock (Redis') when this attempt of the batch ran, not when the
page was fetched, so what an export or a change feed has read up to a moment stays read
whenever a batch that waited (in the outbox, in a journal) is written at last. A change
document's ``_id`` begins with that time (milliseconds, 13 digits): the change feed pages
through them in the order they were written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError, InvalidName, OperationFailure, PyMongoError

from project.storage.documents import bounded, from_ms, stored_ms, to_ms, unencodable
from project.storage.errors import ItemRejectedError, severity
from project.storage.records import collection_of, refused_reject

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Sequence

    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase
    from scrapy.statscollectors import StatsCollector

    from project.storage.records import Record

__all__ = ["BatchWriter", "Plan", "Stored", "change_id", "field_changes", "plan"]

logger = logging.getLogger(__name__)

# FerretDB 1.24 (SQLite) hangs for good on an update command that modifies 100 or more
# existing documents, so a batch is sent as several bulk commands of at most this many ops.
_MAX_OPS_PER_COMMAND = 50
#: A batch that took longer than this from its stamp to its last write stamps what it wrote
#: again when it is done: a read whose watermark (its start less EXPORT_SETTLE_SECONDS, 10 s
#: by default) fell meanwhile may have passed it (project/dataout/query.py).
_RESTAMP_AFTER = 5.0
#: Most bytes of ``_id`` values in one lookup (a query must fit MongoDB's 16 MiB).
_MAX_LOOKUP_BYTES = 1 << 20
_DUPLICATE_KEY = 11000
_INVALID_NAMESPACE = 73
#: Most (type, collection) pairs told about overwritten items (a class per item gets no more).
_MAX_TOLD = 1000
_Group = list[tuple[int, "Record"]]
_Document = dict[str, Any]
#: What a batch reads of a stored document: content hash, ``last_seen``, ``first_seen`` (ms).
Stored = tuple[str | None, int | None, int | None]


class BatchWriter:
    """Writes batches of item and reject records to one database."""

    def __init__(
        self,
        database: AsyncDatabase[_Document],
        stats: StatsCollector,
        *,
        products_collection: str,
        rejects_collection: str,
        max_bson: int,
        changes_collection: str = "changes",
        now: Callable[[], float] = time.time,
    ) -> None:
        self._database = database
        self._now = now
        self._written = from_ms(0)
        self._stats = stats
        self._products = products_collection
        self._rejects = rejects_collection
        self._changes = changes_collection
        self._max_bson = max_bson
        self._told: set[tuple[str, str]] = set()
        self._one_batch = asyncio.Lock()
        self._stamped: dict[str, set[str]] = {}

    async def write(self, records: Sequence[Record]) -> dict[int, Exception]:
        """Write one batch; return the items MongoDB cannot take (stored in rejects instead).

        One batch at a time: a batch's stamp and what it stamped are the writer's while it
        runs (the store's flush and its outbox drain both write through it)."""
        async with self._one_batch:
            self._written = from_ms(to_ms(self._now()))
            self._stamped = {}
            began = time.monotonic()
            failures = await self._write(records)
            if time.monotonic() - began > _RESTAMP_AFTER and self._stamped:
                try:
                    await self._restamp(time.monotonic() - began)
                except PyMongoError as exc:  # the batch is written: only the stamps lag
                    self._stats.inc_value("mongo/restamp_errors")
                    logger.error(
                        "A slow batch's items could not be stamped again (%s): an export"
                        " that began while it ran may miss them with its next since",
                        exc,
                    )
            return failures

    async def _restamp(self, took: float) -> None:
        """Stamp again what a slow batch wrote (``written_at`` moved to now): a read that
        began while it ran finds it with its next ``since``. Its change documents keep their
        place: a change feed that read past them meanwhile does not get them (said here)."""
        again = from_ms(to_ms(self._now()))
        count = 0
        for name, keys in self._stamped.items():
            chunk = sorted(keys)
            for start in range(0, len(chunk), _MAX_OPS_PER_COMMAND):
                selected = {"_id": {"$in": chunk[start : start + _MAX_OPS_PER_COMMAND]}}
                result = await self._database[name].update_many(
                    selected, {"$max": {"written_at": again}}
                )
                count += result.modified_count
        self._stats.inc_value("mongo/restamped", count)
        logger.warning(
            "A batch took %.1f s to write: %d items stamped again for exports; a change feed"
            " reading meanwhile may have passed its changes",
            took, count,
        )  # fmt: skip

    def _stamp(self, collection: str, keys: Iterable[str]) -> None:
        self._stamped.setdefault(collection, set()).update(keys)

    async def _write(self, records: Sequence[Record]) -> dict[int, Exception]:
        items: dict[str, _Group] = {}
        rejects: _Group = []
        touches: list[Record] = []
        gone: list[Record] = []
        reports: list[Record] = []
        for index, record in enumerate(records):
            if record["kind"] == "reject":
                rejects.append((index, record))
            elif record["kind"] == "touch":
                touches.append(record)
            elif record["kind"] == "gone":
                gone.append(record)
            elif record["kind"] == "report":
                reports.append(record)
            else:
                items.setdefault(collection_of(record, self._products), []).append((index, record))
        counts: dict[str, Counter[str]] = {}
        refused: dict[int, str] = {}
        for name in sorted(items):
            counts[name] = Counter()
            refused |= await self._write_items(name, items[name], counts[name])
        for index, reason in refused.items():
            rejects.append((index, refused_reject(records[index], reason, self._products)))
            self._stats.inc_value("mongo/rejected")
            self._stats.inc_value(f"mongo/rejected/{reason.split(':')[0].split()[0]}")
        lost = await self._write_rejects(rejects) if rejects else {}
        if touches:
            await self._touch(touches)
        for record in gone:  # after the items and touches of the batch: a sighting wins
            await self._gone(record)
        for report in reports:
            await self._write_report(report)
        self._stats.inc_value("mongo/batches")
        for collection, counted in counts.items():
            for name, count in counted.items():
                self._stats.inc_value(f"mongo/{name}", count)
                self._stats.inc_value(f"mongo/{collection}/{name}", count)
        failures: dict[int, Exception] = {}
        for index, reason in refused.items():
            where = "not even in rejects" if index in lost else "stored in rejects instead"
            failures[index] = ItemRejectedError(
                f"MongoDB cannot take {_what(records[index], self._products)} ({reason}): {where}"
            )
        for index, reason in lost.items():
            failures.setdefault(index, ItemRejectedError(f"MongoDB refused the reject ({reason})"))
        return failures

    async def _write_report(self, record: Record) -> None:
        """A crawl run's report that waited in the outbox: stored as it was made, unless the
        run's report is there already (a node wrote it once MongoDB answered)."""
        doc = dict(record["doc"])
        for name in record.get("times", ()):
            if isinstance(doc.get(name), int | float):
                doc[name] = datetime.fromtimestamp(doc[name], UTC)
        collection = self._database[record["collection"]]
        try:
            await collection.update_one({"_id": record["id"]}, {"$setOnInsert": doc}, upsert=True)
        except (OperationFailure, InvalidName) as exc:
            if severity(exc) != "permanent":
                raise
            # never blocks what waits behind it: counted, logged, dropped
            self._stats.inc_value("mongo/report_errors")
            logger.error("MongoDB refuses the report %r: %s", record["id"], exc)

    async def _write_items(
        self, name: str, records: _Group, counts: Counter[str]
    ) -> dict[int, str]:
        """Write one collection's records by ``_id``; return why MongoDB cannot take some."""
        try:
            collection = self._database[name]
        except InvalidName as exc:  # a record not made by this store: checked when made
            return dict.fromkeys((index for index, _ in records), f"InvalidName: {exc}")
        refused: dict[int, str] = {}
        groups: dict[str, _Group] = {}
        for index, record in records:
            reason = unencodable(document(record, 0, 0), self._max_bson)
            if reason is None:
                groups.setdefault(record["id"], []).append((index, record))
            else:
                refused[index] = reason
        if not groups:
            return refused
        stored, gone = await _stored(collection, list(groups))
        plans = {key: plan(key, group, stored.get(key)) for key, group in groups.items()}
        new = [p for p in plans.values() if p.insert]
        written = self._written
        inserts = [InsertOne(document(p.winner, p.first_ms, p.last_ms, written)) for p in new]
        # Inserts are far cheaper than upserts (40x on FerretDB); one that lost a race with
        # another writer (duplicate _id) is planned again against what that writer stored.
        more, duplicates = await self._bulk(collection, inserts, [p.group for p in new])
        refused.update(more)
        if duplicates:
            raced = [new[i].key for i in duplicates]
            now, now_gone = await _stored(collection, raced)
            gone.update(now_gone)
            plans.update((key, plan(key, groups[key], now.get(key))) for key in raced)
        updates = [
            (op, p)
            for p in plans.values()
            if not p.insert and (op := p.update(written, p.comes_back(gone))) is not None
        ]
        rewritten = [p for _, p in updates if p.writes_content]
        back = [p for _, p in updates if not p.writes_content and p.comes_back(gone)]
        before = (
            {doc["_id"]: doc async for doc in _lookup(collection, [p.key for p in rewritten], None)}
            if rewritten
            else {}
        )
        more, _ = await self._bulk(
            collection, [op for op, _ in updates], [p.group for _, p in updates]
        )
        refused.update(more)
        changed = [p for p in rewritten if p.key in before and p.group[0][0] not in refused]
        if changed:
            await self._record_changes(name, changed, before)
        back = [p for p in back if p.group[0][0] not in refused]
        if back:
            await self._record_returns(name, back, gone)
        self._stamp(name, (p.key for p in new if p.group[0][0] not in refused))
        self._stamp(name, (p.key for p in changed + back))
        for planned in plans.values():
            if planned.group[0][0] not in refused:
                counts.update(planned.counts)
                self._overwritten(name, planned, counts)
        return refused

    async def _record_changes(
        self, name: str, plans: list[Plan], before: dict[str, _Document]
    ) -> None:
        """One document per changed field of each rewritten item (``changes``)."""
        docs = []
        written = self._written
        for planned in plans:
            winner = planned.winner
            at = from_ms(to_ms(winner["seen"]))
            found = field_changes(before[planned.key], content(winner))
            if before[planned.key].get("gone_at") is not None:
                found.append(("gone_at", before[planned.key]["gone_at"], None))
            for path, old, new in found:
                docs.append({
                    "_id": change_id(written, f"{planned.key}|{path}|{to_ms(winner['seen'])}|{name}"),
                    "item_id": planned.key, "collection": name, "field": path,
                    "old": bounded(old), "new": bounded(new), "at": at, "crawl_id": winner["crawl_id"],
                    "spider": winner.get("spider", ""), "written_at": written,
                })  # fmt: skip
        await self._insert_changes(docs)

    async def _insert_changes(self, docs: list[_Document]) -> None:
        """Store change documents; a replayed batch finds its changes there already
        (duplicate ``_id``): nothing to add."""
        if not docs:
            return
        groups: list[_Group] = [[] for _ in docs]
        await self._bulk(self._database[self._changes], [InsertOne(d) for d in docs], groups)
        self._stats.inc_value("mongo/changes", len(docs))

    def _return_change(
        self, name: str, key: str, gone_at: Any, seen: int, crawl_id: str, spider: str
    ) -> _Document:
        """The change of an item seen again at *seen* (ms) after it was marked gone."""
        return {
            "_id": change_id(self._written, f"{key}|gone_at|{seen}|{name}"), "item_id": key,
            "collection": name, "field": "gone_at", "old": gone_at, "new": None,
            "at": from_ms(seen), "crawl_id": crawl_id, "spider": spider,
            "written_at": self._written,
        }  # fmt: skip

    async def _record_returns(self, name: str, plans: list[Plan], gone: dict[str, Any]) -> None:
        """A change (``gone_at`` to none) for each item seen again after it was marked gone,
        its content the same."""
        await self._insert_changes([
            self._return_change(name, p.key, gone[p.key], to_ms(p.winner["seen"]),
                                p.winner["crawl_id"], p.winner.get("spider", ""))
            for p in plans
        ])  # fmt: skip

    async def _touch(self, records: list[Record]) -> None:
        """Move ``last_seen`` of items seen again without their content; they are not gone.

        All of a batch's touches of one collection at once, at the latest of their times (a
        few milliseconds apart), by ``_id`` alone, at most 50 ids a command (FerretDB 1.24
        hangs on an update of 100 documents or more); ``$max`` keeps a later ``last_seen``.
        Only when an update matched fewer than its ids (an item marked gone, or not stored)
        are they read: see :meth:`_touched_back`.
        """
        keys: dict[str, set[str]] = {}
        latest, last = 0, records[-1]
        for record in records:
            keys.setdefault(record["collection"], set()).update(record["ids"])
            latest = max(latest, to_ms(record["seen"]))
        update = {"$max": {"last_seen": from_ms(latest)}}
        for name, ids in keys.items():
            collection, chunk = self._database[name], sorted(ids)
            for start in range(0, len(chunk), _MAX_OPS_PER_COMMAND):
                part = chunk[start : start + _MAX_OPS_PER_COMMAND]
                selected = {"_id": {"$in": part}, "gone_at": {"$exists": False}}
                try:
                    result = await collection.update_many(selected, update)
                    if result.matched_count < len(part):
                        await self._touched_back(name, part, latest, last)
                except OperationFailure as exc:
                    if severity(exc) == "transient":
                        raise  # an outage: the batch goes to the journal and comes back
                    # refused for good (a collection gone, no privilege): only these touches go
                    self._stats.inc_value("mongo/write_errors")
                    logger.error("MongoDB refused to touch items of %s: %s", name, exc)
                    break

    async def _touched_back(self, name: str, ids: list[str], seen: int, record: Record) -> None:
        """Items of *ids* marked gone that a touch at *seen* (ms) names after their last
        sighting: back, as a parsed sighting brings them (``written_at``, a change each). A
        replayed touch finds them back already; an older one leaves them gone."""
        collection = self._database[name]
        query = {"_id": {"$in": ids}, "gone_at": {"$exists": True},
                 "last_seen": {"$lt": from_ms(seen)}}  # fmt: skip
        gone = {doc["_id"]: doc["gone_at"] async for doc in collection.find(query, {"gone_at": 1})}
        if not gone:
            return
        query["_id"] = {"$in": sorted(gone)}
        await collection.update_many(query, _back(seen, self._written))
        await self._insert_changes([
            self._return_change(name, key, gone_at, seen, record.get("crawl_id", ""),
                                record.get("spider", ""))
            for key, gone_at in gone.items()
        ])  # fmt: skip
        self._stamp(name, gone)
        self._stats.inc_value("mongo/touched_back", len(gone))

    async def _gone(self, record: Record) -> None:
        """Mark items their page no longer has: ``gone_at``, and a change each.

        Only those not gone already and not seen after the page's last fetch that named
        them (``last_seen`` up to ``before``: both Redis' time, project/frontier/clock.py),
        so an item another page yields, or yielded since, stays; at most 50 ids a command,
        as :meth:`_touch`. A replayed record finds them gone already and adds nothing.
        """
        name, at = record["collection"], from_ms(to_ms(record["seen"]))
        before = from_ms(to_ms(record["before"]))
        collection, ids = self._database[name], sorted(set(record["ids"]))
        docs, marked_now = [], 0
        for start in range(0, len(ids), _MAX_OPS_PER_COMMAND):
            chunk = ids[start : start + _MAX_OPS_PER_COMMAND]
            query = {"_id": {"$in": chunk}, "gone_at": {"$exists": False},
                     "last_seen": {"$lte": before}}  # fmt: skip
            try:
                result = await collection.update_many(
                    query, {"$set": {"gone_at": at, "written_at": self._written}}
                )
                # with the stamp the marking wrote: a replay names the same change (its _id
                # from that stamp) and adds nothing
                marked = [(doc["_id"], doc.get("written_at") or self._written)
                          async for doc in collection.find(
                              {"_id": {"$in": chunk}, "gone_at": at}, {"_id": 1, "written_at": 1})]  # fmt: skip
            except OperationFailure as exc:
                if severity(exc) == "transient":
                    raise  # an outage: the batch goes to the journal and comes back
                self._stats.inc_value("mongo/write_errors")
                logger.error("MongoDB refused to mark items of %s gone: %s", name, exc)
                break  # the change docs of the chunks marked before it still go
            marked_now += result.modified_count
            docs += [
                {"_id": change_id(stamp, f"{key}|gone_at|{to_ms(record['seen'])}|{name}"),
                 "item_id": key, "collection": name, "field": "gone_at", "old": None, "new": at,
                 "at": at, "crawl_id": record["crawl_id"], "spider": record.get("spider", ""),
                 "written_at": stamp}
                for key, stamp in marked
            ]  # fmt: skip
            self._stamp(name, (key for key, stamp in marked if stamp == self._written))
        self._stats.inc_value("mongo/gone", marked_now)  # a replay marks none again
        await self._insert_changes(docs)

    def _overwritten(self, collection: str, planned: Plan, counts: Counter[str]) -> None:
        """Count (and tell once) records of one URL id whose contents overwrote each other."""
        records = [record for _, record in planned.group if record.get("id_from_url")]
        hashes = {record["hash"] for record in records}
        if len(hashes) < 2:
            return
        counts["overwritten"] += len(hashes) - 1
        item_type = str(records[0].get("type") or "item")
        if (item_type, collection) in self._told or len(self._told) >= _MAX_TOLD:
            return
        self._told.add((item_type, collection))
        logger.warning(
            "%d different %s items share _id %s: they overwrite each other; set MONGO_ID_FIELDS"
            " (mongo/%s/overwritten counts them)",
            len(hashes), item_type, planned.key[:200], collection,
        )  # fmt: skip

    async def _write_rejects(self, rejects: _Group) -> dict[int, str]:
        """Store rejects by ``_id`` unless a newer one is stored; return the refused ones."""
        collection = self._database[self._rejects]
        refused: dict[int, str] = {}
        groups: dict[str, _Group] = {}
        for index, record in rejects:
            groups.setdefault(record["id"], []).append((index, record))
        docs: dict[str, _Document] = {}
        for key, group in groups.items():
            newest = max(group, key=lambda item: item[1]["seen"])[1]
            doc = {"_id": key, **newest["doc"], "rejected_at": from_ms(to_ms(newest["seen"]))}
            reason = unencodable(doc, self._max_bson)
            if reason is None:
                docs[key] = doc
            else:  # a bounded copy always encodes: only a reject not made by save_reject
                logger.error("cannot encode the reject %s: %s", key[:200], reason)
                refused.update((index, reason) for index, _ in group)
        stored = {
            doc["_id"]: doc.get("rejected_at")
            async for doc in _lookup(collection, list(docs), {"rejected_at": 1})
        }
        # No conditional upserts: FerretDB 1.24 answers a failed one without the counts pymongo
        # reads. New rejects are inserted, older ones replaced, newer ones (another node's, or
        # this node's before a replay) kept.
        new = [key for key in docs if key not in stored]
        more, duplicates = await self._bulk(
            collection, [InsertOne(docs[key]) for key in new], [groups[key] for key in new]
        )
        refused.update(more)
        older = [new[i] for i in duplicates] + [
            key for key, at in stored.items() if not (at and at >= docs[key]["rejected_at"])
        ]
        ops = [
            ReplaceOne({"_id": key, "rejected_at": {"$lt": docs[key]["rejected_at"]}}, docs[key])
            for key in older
        ]
        more, _ = await self._bulk(collection, ops, [groups[key] for key in older])
        refused.update(more)
        return refused

    async def _bulk(
        self,
        collection: AsyncCollection[_Document],
        ops: Sequence[Any],
        groups: Sequence[_Group],
    ) -> tuple[dict[int, str], list[int]]:
        """Run ``ops`` unordered; return refused records by index, and the duplicate-key ops."""
        refused: dict[int, str] = {}
        duplicates: list[int] = []
        commands = [(start, ops[start : start + _MAX_OPS_PER_COMMAND])
                    for start in range(0, len(ops), _MAX_OPS_PER_COMMAND)]  # fmt: skip
        while commands:
            start, command = commands.pop(0)
            try:
                await collection.bulk_write(list(command), ordered=False)
            except KeyError:
                # FerretDB 1.24 answers an update with a write error without the counts pymongo
                # reads (and stops at that op): send the ops one by one to find the one refused.
                if len(command) > 1:
                    commands[:0] = [(start + i, [op]) for i, op in enumerate(command)]
                    continue
                self._stats.inc_value("mongo/write_errors")
                for index, _ in groups[start]:
                    refused[index] = "WriteError: refused by the server, which gave no reason"
                logger.error("MongoDB refused a write to %s and gave no reason", collection.name)
            except BulkWriteError as exc:
                if exc.details.get("writeConcernErrors"):
                    raise  # not acknowledged as asked: the whole batch is retried
                errors = exc.details.get("writeErrors", [])
                for error in errors:
                    code, message = error.get("code"), str(error.get("errmsg", "write error"))
                    if code == _DUPLICATE_KEY:
                        duplicates.append(start + error["index"])
                        continue
                    failure = OperationFailure(message, code)
                    if severity(failure) == "transient":
                        raise failure from exc  # a failover mid-batch: the whole batch again
                    for index, _ in groups[start + error["index"]]:
                        refused[index] = f"WriteError {code}: {message[:200]}"
                if len(duplicates) < len(errors):
                    self._stats.inc_value("mongo/write_errors", len(errors) - len(duplicates))
                    logger.error(
                        "MongoDB refused %d of %d writes to %s, first: %s",
                        len(errors) - len(duplicates), len(ops), collection.name,
                        next(e.get("errmsg") for e in errors if e.get("code") != _DUPLICATE_KEY),
                    )  # fmt: skip
            except OperationFailure as exc:
                if exc.code != _INVALID_NAMESPACE:
                    raise  # an outage, or a fault of the whole server: the journal takes it
                # A collection the server refuses (checked when an item is placed): only its
                # items are refused, so that a record of it can never block the journal.
                self._stats.inc_value("mongo/write_errors", len(command))
                for offset in range(len(command)):
                    for index, _ in groups[start + offset]:
                        refused[index] = f"InvalidNamespace: {str(exc)[:200]}"
                logger.error("MongoDB refused the collection %s: %s", collection.name, exc)
        return refused, duplicates


@dataclass
class Plan:
    """What one batch does to one ``_id``: its records (oldest first) and their outcome."""

    key: str
    group: _Group
    counts: Counter[str]
    winner: Record  # the record whose content is written, if any
    writes_content: bool
    insert: bool
    first_ms: int
    last_ms: int
    stored_last_ms: int | None

    def comes_back(self, gone: dict[str, Any]) -> bool:
        """Marked gone, and seen after its last sighting stored: a replayed or late record
        of an older sighting brings nothing back (as the gone mark's own check, last_seen)."""
        return self.key in gone and (
            self.stored_last_ms is None or self.last_ms > self.stored_last_ms
        )

    def update(
        self, written: datetime, came_back: bool = False
    ) -> ReplaceOne[_Document] | UpdateOne | None:
        """The write to a stored document (a content write stamped *written*; so is an item
        seen again after it was marked gone, *came_back*), or None when nothing moves."""
        if self.writes_content:
            # The content is replaced, so a field the item no longer has goes; only over
            # content seen before this record: a newer write by another node stays. Not an
            # upsert: FerretDB 1.24 answers a failed conditional upsert without its counts.
            match: dict[str, Any] = {"_id": self.key}
            if self.stored_last_ms is not None:
                match["last_seen"] = {"$lt": from_ms(to_ms(self.winner["seen"]))}
            return ReplaceOne(match, document(self.winner, self.first_ms, self.last_ms, written))
        if came_back:
            return UpdateOne({"_id": self.key}, _back(self.last_ms, written))
        if self.stored_last_ms is None or self.last_ms > self.stored_last_ms:
            return UpdateOne(
                {"_id": self.key},
                {"$max": {"last_seen": from_ms(self.last_ms)}, "$unset": {"gone_at": ""}},
            )
        return None


def plan(key: str, group: _Group, stored: Stored | None) -> Plan:
    """Apply an ``_id``'s records in the order they were seen, against what is stored.

    Records of one millisecond (all MongoDB keeps of a time) are applied in the order they
    were submitted, so the later one wins; a record no later than the stored content is stale.
    """
    ordered = sorted(group, key=lambda item: (to_ms(item[1]["seen"]), item[0]))
    counts: Counter[str] = Counter()
    current, last, stored_first = stored if stored is not None else (None, None, None)
    stored_last = last
    exists, winner, writes = stored is not None, ordered[-1][1], False
    for _, record in ordered:
        seen = to_ms(record["seen"])
        if not exists:
            counts["inserted"] += 1
            exists, current, last, winner, writes = True, record["hash"], seen, record, True
        elif record["hash"] == current:
            counts["unchanged"] += 1
            last = seen if last is None else max(last, seen)
        elif last is not None and (seen < last or seen == stored_last):
            # Older than the content so far, or no newer than the stored one: a late replay.
            counts["stale"] += 1
        else:
            counts["updated"] += 1
            current, last, winner, writes = record["hash"], seen, record, True
    first = to_ms(ordered[0][1]["seen"])
    if stored_first is not None:
        first = min(first, stored_first)
    assert last is not None
    return Plan(key, ordered, counts, winner, writes, stored is None, first, last, stored_last)


def content(record: Record) -> _Document:
    """What a content write sets: the document, its hash, the crawl and spider that wrote it."""
    doc = {**record["doc"], "content_hash": record["hash"], "crawl_id": record["crawl_id"]}
    if record.get("spider"):
        doc["source_spider"] = record["spider"]
    return doc


#: Fields of a stored document that are the store's, not the item's: never a "change".
_BOOKKEEPING = frozenset({"_id", "content_hash", "crawl_id", "first_seen", "last_seen",
                          "source_spider", "gone_at", "written_at"})  # fmt: skip
_MAX_CHANGE_DEPTH = 4


def _comparable(value: Any) -> Any:
    if isinstance(value, datetime):
        return to_ms(
            value.replace(tzinfo=UTC).timestamp() if value.tzinfo is None else value.timestamp()
        )
    if isinstance(value, tuple | list):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


def field_changes(
    old: _Document, new: _Document, prefix: str = "", depth: int = 0
) -> list[tuple[str, Any, Any]]:
    """(dotted field, old value, new value) of every field that differs; nested documents
    are compared field by field, lists as a whole."""
    found: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new), key=str):
        if not prefix and key in _BOOKKEEPING:
            continue
        path = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and depth < _MAX_CHANGE_DEPTH:
            found += field_changes(a, b, path + ".", depth + 1)
        elif _comparable(a) != _comparable(b):
            found.append((path, a, b))
    return found


def document(
    record: Record, first_ms: int, last_ms: int, written: datetime | None = None
) -> _Document:
    """The whole document of an item record, as first inserted (stamped *written*)."""
    doc = {
        "_id": record["id"],
        **content(record),
        "first_seen": from_ms(first_ms),
        "last_seen": from_ms(last_ms),
    }
    doc["written_at"] = written if written is not None else from_ms(last_ms)
    return doc


def _back(seen_ms: int, written: datetime) -> _Document:
    """The update of an item seen again at *seen_ms* after it was marked gone: a write."""
    return {"$max": {"last_seen": from_ms(seen_ms)}, "$unset": {"gone_at": ""},
            "$set": {"written_at": written}}  # fmt: skip


def change_id(written: datetime, key: str) -> str:
    """A change document's ``_id``: its write time in milliseconds, 13 digits, then *key*
    (what the change is: item, field, fetch, collection)."""
    return f"{stored_ms(written) or 0:013d}|{key}"


async def _stored(
    collection: AsyncCollection[_Document], keys: list[str]
) -> tuple[dict[str, Stored], dict[str, Any]]:
    """What a batch needs to know of the stored documents of *keys*; and the ``gone_at`` of
    those marked gone."""
    projection = {"content_hash": 1, "last_seen": 1, "first_seen": 1, "gone_at": 1}
    stored: dict[str, Stored] = {}
    gone: dict[str, Any] = {}
    async for doc in _lookup(collection, keys, projection):
        stored[doc["_id"]] = (
            doc.get("content_hash"),
            stored_ms(doc.get("last_seen")),
            stored_ms(doc.get("first_seen")),
        )
        if doc.get("gone_at") is not None:
            gone[doc["_id"]] = doc["gone_at"]
    return stored, gone


async def _lookup(
    collection: AsyncCollection[_Document], keys: list[str], projection: dict[str, int] | None
) -> AsyncIterator[_Document]:
    """The stored documents of *keys*, in queries that each fit a command."""
    start = 0
    while start < len(keys):
        end, size = start, 0
        while end < len(keys) and (end == start or size + len(keys[end]) * 4 <= _MAX_LOOKUP_BYTES):
            size += len(keys[end]) * 4
            end += 1
        async for doc in collection.find({"_id": {"$in": keys[start:end]}}, projection):
            yield doc
        start = end


def _what(record: Record, products_collection: str) -> str:
    if collection_of(record, products_collection) == products_collection:
        return f"product {record['id']}"
    return f"{record.get('type') or 'item'} {str(record['id'])[:200]} in {record['collection']}"
