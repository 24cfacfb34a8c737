"""An export: every page of a read, in one format, to one place; and where it ended.

Used by ``fleetcrawl export`` (project/ops/export_cli.py) and by the feeds a run writes
when it ends (project/dataout/feeds.py). Memory holds one page (MAX_PAGE documents).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from project.dataout.formats import CsvWriter, writer_for
from project.dataout.query import MAX_PAGE, ItemQuery, make_token, pages

if TYPE_CHECKING:
    from collections.abc import Callable

    from pymongo.asynchronous.collection import AsyncCollection

__all__ = ["Exported", "export_items"]

logger = logging.getLogger(__name__)


@dataclass
class Exported:
    """What an export wrote: how many items, the token that resumes after them, and the CSV
    columns later documents had that the header did not."""

    count: int = 0
    token: str = ""
    left_out: list[str] = field(default_factory=list)


async def export_items(
    collection: AsyncCollection[dict[str, Any]],
    query: ItemQuery,
    fmt: str,
    write: Callable[[bytes], object],
    *,
    progress: Callable[[int], object] | None = None,
    page: int = MAX_PAGE,
) -> Exported:
    """Write every item of *query* in *fmt* through *write* (awaited if it returns an
    awaitable: a file written off the event loop); *progress* hears the count."""
    writer = writer_for(fmt, query.fields)
    done = Exported(token=make_token(query.until_ms))

    async def put(data: bytes) -> None:
        if data:
            written = write(data)
            if inspect.isawaitable(written):
                await written

    await put(writer.start())
    async for docs, _ in pages(collection, query, size=page):
        await put(writer.page(docs))
        done.count += len(docs)
        if progress is not None:
            progress(done.count)
    await put(writer.end())
    if isinstance(writer, CsvWriter):
        done.left_out = list(writer.left_out)
    return done
