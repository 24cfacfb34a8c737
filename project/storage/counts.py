"""How many documents a collection holds, from what the server keeps, not by reading them.

``estimated_document_count`` is a ``count`` command: MongoDB answers it from its metadata,
but FerretDB 1.24 reads every document to answer it (16 s for 10^5 products here). The
``$collStats`` stage's count comes from MongoDB's metadata, and from the SQLite pages'
own counts on FerretDB (it reads every page, not every document: 0.3 s at 10^5). Through a
mongos it answers once per shard: the counts are summed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pymongo.errors import OperationFailure

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.collection import Collection

__all__ = ["count_of", "count_of_async"]

_PIPELINE: list[dict[str, Any]] = [{"$collStats": {"count": {}}}]


def _count(found: list[dict[str, Any]]) -> int | None:
    """The sum of the shards' counts (one document unless sharded; none: no collection)."""
    total = 0
    for shard in found:
        value = shard.get("count")
        if not isinstance(value, int | float):
            return None
        total += int(value)
    return total


def count_of(collection: Collection[Any]) -> int:
    """The documents of *collection* (a server without ``$collStats``: its count command)."""
    try:
        counted = _count(list(collection.aggregate(_PIPELINE)))
    except OperationFailure:
        counted = None
    return counted if counted is not None else collection.estimated_document_count()


async def count_of_async(collection: AsyncCollection[Any]) -> int:
    """:func:`count_of` with the asynchronous client."""
    try:
        counted = _count(await (await collection.aggregate(_PIPELINE)).to_list(None))
    except OperationFailure:
        counted = None
    return counted if counted is not None else await collection.estimated_document_count()
