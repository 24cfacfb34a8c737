"""Store every item in MongoDB, durably, through the shared batched store."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

from itemadapter import ItemAdapter
from pydantic import BaseModel
from scrapy.exceptions import DropItem

from pipelines.validation import InvalidItemError, ItemModels
from project.storage.errors import ItemRejectedError
from project.storage.placement import ItemPlacer, UnplaceableItemError, is_product_type
from project.storage.store import MongoStore
from project.storage.values import DocumentError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

__all__ = ["MongoPipeline"]

logger = logging.getLogger(__name__)

#: An item type that keeps failing for one reason is logged again after this many seconds.
_REMIND_SECONDS = 600.0


class MongoPipeline:
    """Upserts every item into its collection by ``_id``; returns once the write is durable.

    Any item itemadapter supports (dict, ``scrapy.Item``, dataclass, attrs, pydantic) is
    stored (``project.storage.placement``): a ``Product`` in the products collection by
    canonical URL, a model instance ``ValidationPipeline`` made in the collection of the type it
    came from. An item of a type ``VALIDATION_MODELS`` maps that did not go through validation
    (switched off) is validated here and dropped if invalid, without a reject record.

    An item that cannot be placed (its id field missing, a collection MongoDB refuses) is an
    ERROR, counted in ``mongo/unplaceable/<reason>``, stored in rejects and dropped; one that
    MongoDB cannot take is stored in rejects and dropped (``ItemRejectedError``); one that
    neither MongoDB nor the journal took fails with ``ItemNotStoredError``, so Scrapy reports an
    item error, not a scraped item.
    """

    def __init__(
        self, store: MongoStore, placer: ItemPlacer, models: ItemModels, stats: StatsCollector
    ) -> None:
        self._store = store
        self._placer = placer
        self._models = models
        self._stats = stats
        self._told: dict[tuple[str, str], float] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoPipeline:
        """Build from the crawler's settings (``StorageConfigError`` if they cannot work)."""
        store = MongoStore.from_crawler(crawler)
        assert crawler.stats is not None
        placer = ItemPlacer(store.config, crawler.spidercls.name)
        return cls(store, placer, ItemModels.from_crawler(crawler), crawler.stats)

    async def open_spider(self) -> None:
        """Connect (or journal while MongoDB is unreachable); close the crawl if it cannot store."""
        await self._store.open_for_crawl()

    async def close_spider(self) -> None:
        """Flush what is pending and disconnect."""
        await self._store.close()

    async def process_item(self, item: Any) -> Any:
        """Store the item; return it once MongoDB or the journal has it."""
        origin = self._models.origin_of(item)
        if origin is None:
            try:
                validated = self._models.validate(item)
            except InvalidItemError as exc:
                what = "product" if is_product_type(type(item)) else type(item).__name__
                url = str(exc.data.get("url"))[:200]
                raise DropItem(f"invalid {what} {url} ({', '.join(exc.reasons)})") from exc
            if validated is not None:
                origin, item = type(item), validated
        try:
            placed = self._placer.place(item, origin)
        except UnplaceableItemError as exc:
            await self._unplaceable(item, exc)
        except DocumentError as exc:
            await self._unstorable(item, (origin or type(item)).__name__, exc)
        if placed.id_from_content:
            self._stats.inc_value("mongo/id_from_content")
        if placed.escaped_keys:
            self._stats.inc_value("mongo/escaped_keys", placed.escaped_keys)
        await self._store.save_item(placed)
        self._store.remember(item, placed)
        return item

    async def _unplaceable(self, item: Any, exc: UnplaceableItemError) -> NoReturn:
        self._stats.inc_value("mongo/unplaceable")
        self._stats.inc_value(f"mongo/unplaceable/{exc.reason}")
        # One ERROR per type and reason (again after a while): each item is also dropped.
        now, told = time.monotonic(), self._told.get((exc.item_type, exc.reason))
        if told is None or now - told >= _REMIND_SECONDS:
            self._told[exc.item_type, exc.reason] = now
            logger.error(
                "cannot store items of type %s (%s): %s; they go to %s",
                exc.item_type, exc.reason, exc.message, self._store.config.rejects_collection,
            )  # fmt: skip
        await self._store.save_reject(
            _fields(item), {"placement": [exc.message]}, item_type=exc.item_type
        )
        raise DropItem(str(exc)) from exc

    async def _unstorable(self, item: Any, name: str, exc: DocumentError) -> NoReturn:
        self._stats.inc_value("mongo/rejected")
        self._stats.inc_value("mongo/rejected/DocumentError")
        await self._store.save_reject(_fields(item), {"document": [str(exc)]}, item_type=name)
        raise ItemRejectedError(
            f"MongoDB cannot take {name} ({exc}): stored in rejects instead"
        ) from exc


def _fields(item: Any) -> dict[str, Any]:
    """An item's fields for its reject record (``bounded`` makes them safe to store)."""
    try:
        if isinstance(item, BaseModel):
            return dict(item)
        if ItemAdapter.is_item(item):
            return dict(ItemAdapter(item).items())
    except Exception:  # noqa: BLE001 (an item whose own code raises: its type is all we keep)
        return {"item": f"<{type(item).__name__}>"}
    return {"item": item}
