"""Store validated products in MongoDB, durably, through the shared batched store."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pydantic import ValidationError
from scrapy.exceptions import DropItem

from project.items import ProductItem
from project.schema import Product, field_errors
from project.storage.store import MongoStore

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["MongoPipeline"]

logger = logging.getLogger(__name__)


class MongoPipeline:
    """Upserts each product by canonical URL; ``process_item`` returns once the write is durable.

    Takes the ``Product`` that ``ValidationPipeline`` returns; a raw ``ProductItem`` (validation
    switched off) is validated here and dropped if invalid, without a reject record. Other items
    pass unchanged. A product MongoDB cannot take is stored in rejects and dropped
    (``ItemRejectedError``); one that neither MongoDB nor the journal took fails with
    ``ItemNotStoredError``, so Scrapy reports an item error, not a scraped item.
    """

    def __init__(self, store: MongoStore) -> None:
        self._store = store

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoPipeline:
        """Build from the crawler's ``MONGO_*`` settings (``StorageConfigError`` if they cannot work)."""
        return cls(MongoStore.from_crawler(crawler))

    async def open_spider(self) -> None:
        """Connect (or journal while MongoDB is unreachable); close the crawl if it cannot store."""
        await self._store.open_for_crawl()

    async def close_spider(self) -> None:
        """Flush what is pending and disconnect."""
        await self._store.close()

    async def process_item(self, item: Any) -> Any:
        """Store the product; return it once MongoDB or the journal has it."""
        if isinstance(item, ProductItem):
            try:
                item = Product.model_validate(ItemAdapter(item).asdict())
            except ValidationError as exc:
                raise DropItem(
                    "invalid product {} ({})".format(item.url, ", ".join(field_errors(exc)))
                ) from exc
        if isinstance(item, Product):
            await self._store.save_product(item)
        return item
