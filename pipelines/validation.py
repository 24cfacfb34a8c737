"""Validate scraped products; drop and record the invalid ones."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pydantic import ValidationError
from scrapy.exceptions import DropItem, NotConfigured

from project.config import read_settings, setting
from project.items import ProductItem
from project.schema import Product, canonical_product_url, field_errors
from project.storage.store import MongoStore

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

__all__ = ["ValidationConfig", "ValidationPipeline"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationConfig:
    """The ``VALIDATION_*`` settings."""

    enabled: bool = setting("VALIDATION_ENABLED", True)
    store_rejects: bool = setting("VALIDATION_STORE_REJECTS", True)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ValidationConfig:
        """Read the settings."""
        return cls(**read_settings(cls, settings))


class ValidationPipeline:
    """Turns each ``ProductItem`` into a validated ``Product``; other items pass unchanged.

    An invalid item is counted (``validation/dropped``, ``validation/errors/<field>``), stored
    in the rejects collection with its reasons, and dropped. A canonical link that is not on
    the page's own site is replaced by the page URL (``validation/canonical/<why>``).
    """

    def __init__(self, stats: StatsCollector, store: MongoStore | None = None) -> None:
        self._stats = stats
        self._store = store

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ValidationPipeline:
        """Build from the crawler's settings; raise ``NotConfigured`` when switched off."""
        config = ValidationConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("VALIDATION_ENABLED is off")
        assert crawler.stats is not None
        return cls(
            crawler.stats, MongoStore.from_crawler(crawler) if config.store_rejects else None
        )

    async def open_spider(self) -> None:
        """Open the shared store the rejects go to."""
        if self._store is not None:
            await self._store.open_for_crawl()

    async def close_spider(self) -> None:
        """Release the shared store."""
        if self._store is not None:
            await self._store.close()

    async def process_item(self, item: Any) -> Any:
        """Return the normalised ``Product``, or record the item and raise ``DropItem``."""
        if not isinstance(item, ProductItem):
            return item
        data = ItemAdapter(item).asdict()
        try:
            product = Product.model_validate(data)
        except ValidationError as exc:
            reasons = field_errors(exc)
            self._stats.inc_value("validation/dropped")
            for field in reasons:
                self._stats.inc_value(f"validation/errors/{field}")
            if self._store is not None:
                await self._store.save_reject(data, reasons)
            summary = "; ".join(
                "{}: {}".format(field, ", ".join(messages)) for field, messages in reasons.items()
            )
            raise DropItem("invalid product {} ({})".format(data.get("url"), summary)) from exc
        self._stats.inc_value("validation/passed")
        canonical = data.get("canonical_url")
        why = (
            canonical_product_url(product.url, canonical)[1] if isinstance(canonical, str) else None
        )
        if why is not None:
            self._stats.inc_value(f"validation/canonical/{why}")
        return product
