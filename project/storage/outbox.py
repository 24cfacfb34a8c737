"""The fleet's outbox: records a node could not write to MongoDB wait in Redis, not on its disk.

While MongoDB is away a node's batches go to one Redis list per spider and database
(``<prefix>:outbox:<database>``, FrontierKeys' ``outbox``, bounded by ``MONGO_OUTBOX_MAX_BYTES``), which any node whose
MongoDB answers, or ``fleetcrawl store drain``, writes to MongoDB: Redis already holds the
frontier (with AOF), so an item whose page was acknowledged is in MongoDB or in Redis, reachable
from every node, even when its node and its disk are gone. A node's local journal
(project/storage/journal.py) only takes what Redis refuses too (unreachable, or the outbox full)
and is moved to the outbox as soon as Redis takes it.

One drainer at a time holds the outbox's lease (``outbox_take.lua``): it reads records from the
head, writes them, then removes them, so a drainer that dies between the write and the removal
leaves them to be written again, which stores them once (upserts by ``_id``; content moves
only forward by ``last_seen``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from project.frontier import lua

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis.asyncio

__all__ = ["Outbox", "OutboxSize"]

logger = logging.getLogger(__name__)

_PUSH = lua.load("outbox_push", __package__ or "project.storage")
_TAKE = lua.load("outbox_take", __package__ or "project.storage")
_HEAD = lua.load("outbox_head", __package__ or "project.storage")
#: Bytes a drainer reads at once (the entry that crosses it is the last), and the most of one
#: entry it reads whole: the store's records are at most one BSON document (16 MiB) as JSON.
_READ_BYTES = 8 * 1024 * 1024
_ENTRY_BYTES = 64 * 1024 * 1024
#: Records of the outbox set aside because they are not records the store wrote (pushed by
#: hand, another program): the newest are kept for a look, under ``<outbox>:malformed``.
_MALFORMED_KEPT = 1000


@dataclass(frozen=True)
class OutboxSize:
    """What waits in the outbox."""

    records: int
    bytes: int


class Outbox:
    """One spider's outbox in the fleet's Redis (asyncio client, no I/O until used)."""

    def __init__(
        self, client: redis.asyncio.Redis, key: str, *, max_bytes: int, lease_seconds: float = 60.0
    ) -> None:
        self.client = client
        self.key = key
        self.max_bytes = max_bytes
        self.lease_ms = int(lease_seconds * 1000)
        self.token = f"{os.getpid()}-{os.urandom(6).hex()}"

    async def push(self, records: Sequence[dict[str, Any]]) -> bool:
        """Queue *records* (all or none); False when they do not fit. Raises RedisError."""
        if not records:
            return True
        entries = [json.dumps(r, separators=(",", ":")) for r in records]
        reply = await self.client.eval(
            _PUSH.source, len(_PUSH.keys), *_PUSH.keys_from(self, outbox=self.key),
            self.max_bytes, *entries,
        )  # fmt: skip
        return bool(int(reply[0]))

    async def size(self) -> OutboxSize:
        """Records and bytes waiting."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.llen(self.key)
            pipe.get(f"{self.key}:bytes")
            count, size = await pipe.execute()
        return OutboxSize(int(count), int(size or 0))

    async def lease(self) -> bool:
        """Take or renew the drainer's lease; False while another drainer holds it."""
        return await self._take(0)

    async def head(
        self, count: int, max_bytes: int = _READ_BYTES, entry_bytes: int = _ENTRY_BYTES
    ) -> list[bytes]:
        """The oldest entries, left in place: at most *count*, and about *max_bytes* (at least
        one). An entry over *entry_bytes* comes as a stub that is no record (outbox_head.lua)."""
        entries = await self.client.eval(
            _HEAD.source, len(_HEAD.keys), *_HEAD.keys_from(self, outbox=self.key),
            count, max_bytes, entry_bytes,
        )  # fmt: skip
        return [e if isinstance(e, bytes) else e.encode() for e in entries]

    async def remove(self, count: int) -> bool:
        """Remove the *count* oldest entries (written); False if the lease went to another."""
        return await self._take(count)

    async def release(self) -> None:
        """Give the lease up (only if this drainer holds it)."""
        await self._take(0, release=True)

    async def set_aside(self, entries: Sequence[bytes]) -> None:
        """Keep malformed entries under ``<outbox>:malformed`` (the newest only)."""
        if not entries:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.lpush(f"{self.key}:malformed", *entries)
            pipe.ltrim(f"{self.key}:malformed", 0, _MALFORMED_KEPT - 1)
            await pipe.execute()

    async def _take(self, count: int, *, release: bool = False) -> bool:
        reply = await self.client.eval(
            _TAKE.source, len(_TAKE.keys), *_TAKE.keys_from(self, outbox=self.key),
            self.token, self.lease_ms, count, "1" if release else "0",
        )  # fmt: skip
        return bool(int(reply[0]))
