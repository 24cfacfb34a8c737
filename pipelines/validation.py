"""Validate scraped items with the pydantic model of their type; drop and record the invalid ones."""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pydantic import BaseModel, ValidationError
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.utils.misc import load_object

from project.config import read_settings, setting
from project.items import ProductItem
from project.schema import Product, canonical_product_url, field_errors
from project.storage.config import StorageConfigError
from project.storage.itemtypes import TypeTable
from project.storage.placement import is_product_type
from project.storage.store import MongoStore

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

__all__ = ["InvalidItemError", "ItemModels", "ValidationConfig", "ValidationPipeline"]

logger = logging.getLogger(__name__)

#: ``VALIDATION_MODELS``' default: the product schema. A project's own entries are added to it.
DEFAULT_MODELS: dict[str, str | None] = {"project.items.ProductItem": "project.schema.Product"}

#: Most characters of an item's URL in a drop message (the reject keeps the item).
_MAX_URL_SHOWN = 200

_models: weakref.WeakKeyDictionary[Crawler, ItemModels] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ValidationConfig:
    """The ``VALIDATION_*`` settings."""

    enabled: bool = setting("VALIDATION_ENABLED", True)
    store_rejects: bool = setting("VALIDATION_STORE_REJECTS", True)
    #: Item type (class name, dotted path or ``dict``) -> dotted path of a pydantic model.
    models: dict[str, str | None] = setting("VALIDATION_MODELS", DEFAULT_MODELS)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ValidationConfig:
        """Read the settings."""
        return cls(**read_settings(cls, settings))


class InvalidItemError(Exception):
    """An item its model refused: the data it was validated from, and the reasons per field."""

    def __init__(self, data: dict[str, Any], reasons: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{f}: {', '.join(m)}" for f, m in reasons.items()))
        self.data = data
        self.reasons = reasons


class ItemModels:
    """The models of ``VALIDATION_MODELS``, and the type each validated instance came from.

    Shared by the pipelines of one crawler: ``MongoPipeline`` stores a model instance in the
    collection of the item type it was validated from, and validates an item of a mapped type
    itself when it did not go through ``ValidationPipeline``.
    """

    def __init__(self, *layers: Mapping[str, type[BaseModel] | None]) -> None:
        self._table: TypeTable[type[BaseModel]] = TypeTable(*layers)
        # id(instance) -> (a weak reference to it, its item type); entries go with the instance.
        self._origins: dict[int, tuple[weakref.ref[Any], type]] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemModels:
        """The crawler's models (``StorageConfigError`` for an entry that cannot be used)."""
        models = _models.get(crawler)
        if models is None:
            try:
                models = _models[crawler] = cls.from_settings(crawler.settings)
            except StorageConfigError as exc:
                logger.error("%s: this node cannot validate items, so it does not start", exc)
                raise
        return models

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ItemModels:
        """Import the models; a project's entries come before the default ones."""
        try:
            config = ValidationConfig.from_settings(settings)
        except NotConfigured as exc:
            raise StorageConfigError(str(exc)) from exc
        models = cls(_load(config.models), _load(DEFAULT_MODELS))
        product = models.model_for(ProductItem)
        if product is None or not issubclass(product, Product):
            raise StorageConfigError(
                "VALIDATION_MODELS must map project.items.ProductItem to project.schema.Product"
                f" (or a subclass), got {product!r}: products are stored in that shape"
            )
        return models

    def model_for(self, cls: type) -> type[BaseModel] | None:
        """The model items of *cls* are validated with, or None."""
        return self._table.get(cls)

    def validate(self, item: Any) -> BaseModel | None:
        """The model instance of *item*, or None when its type has no model.

        Raises :class:`InvalidItemError` when the model refuses it.
        """
        model = self.model_for(type(item))
        if model is None:
            return None
        try:
            data = ItemAdapter(item).asdict()
        except RecursionError:  # nested deeper than Python recurses: invalid, not a crash
            raise InvalidItemError(
                dict(ItemAdapter(item).items()), {"__root__": ["nested too deeply to validate"]}
            ) from None
        try:
            instance = model.model_validate(data)
        except ValidationError as exc:
            raise InvalidItemError(data, field_errors(exc)) from exc
        self._mark(instance, type(item))
        return instance

    def origin_of(self, instance: object) -> type | None:
        """The item type *instance* was validated from, or None if it was not."""
        entry = self._origins.get(id(instance))
        if entry is None or entry[0]() is not instance:
            return None
        return entry[1]

    def _mark(self, instance: BaseModel, origin: type) -> None:
        key = id(instance)

        def forget(ref: weakref.ref[Any]) -> None:
            if self._origins.get(key, (None,))[0] is ref:
                del self._origins[key]

        # A model without weak references is stored as its own type.
        with contextlib.suppress(TypeError):
            self._origins[key] = (weakref.ref(instance, forget), origin)


def _load(entries: Mapping[Any, object]) -> dict[str, type[BaseModel] | None]:
    loaded: dict[str, type[BaseModel] | None] = {}
    for key, path in entries.items():
        if not isinstance(key, str) or not key.strip():
            raise StorageConfigError(
                f"VALIDATION_MODELS: a key must name an item type (a class name, a dotted path"
                f" or 'dict'), got {key!r}"
            )
        if path is None:
            loaded[key.strip()] = None  # this type is not validated
            continue
        if not isinstance(path, str):
            raise StorageConfigError(
                f"VALIDATION_MODELS[{key!r}] must be the dotted path of a pydantic model or None,"
                f" got {path!r}"
            )
        try:
            model = load_object(path)
        except (ImportError, AttributeError, NameError, ValueError) as exc:
            raise StorageConfigError(
                f"VALIDATION_MODELS[{key!r}]: cannot import {path!r} ({exc})"
            ) from exc
        if not isinstance(model, type) or not issubclass(model, BaseModel):
            raise StorageConfigError(
                f"VALIDATION_MODELS[{key!r}]: {path!r} is not a pydantic model (BaseModel)"
            )
        loaded[key.strip()] = model
    return loaded


class ValidationPipeline:
    """Validates each item of a type ``VALIDATION_MODELS`` maps; other items pass unchanged.

    A ``ProductItem`` becomes a ``Product``, a ``BookItem`` mapped to ``BookModel`` a
    ``BookModel``. An invalid item is counted (``validation/dropped``,
    ``validation/dropped/<TypeName>``, ``validation/errors/<field>``), stored in the rejects
    collection with its reasons, and dropped. A product's canonical link that is not on the
    page's own site is replaced by the page URL (``validation/canonical/<why>``).
    """

    def __init__(
        self, stats: StatsCollector, models: ItemModels, store: MongoStore | None = None
    ) -> None:
        self._stats = stats
        self._models = models
        self._store = store

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ValidationPipeline:
        """Build from the crawler's settings; raise ``NotConfigured`` when switched off.

        A ``VALIDATION_*`` value that cannot work stops the node (``StorageConfigError``):
        ``MongoPipeline`` validates with the same models.
        """
        models = ItemModels.from_crawler(crawler)
        config = ValidationConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("VALIDATION_ENABLED is off")
        assert crawler.stats is not None
        store = MongoStore.from_crawler(crawler) if config.store_rejects else None
        return cls(crawler.stats, models, store)

    async def open_spider(self) -> None:
        """Open the shared store the rejects go to."""
        if self._store is not None:
            await self._store.open_for_crawl()

    async def close_spider(self) -> None:
        """Release the shared store."""
        if self._store is not None:
            await self._store.close()

    async def process_item(self, item: Any) -> Any:
        """Return the item's model instance, or record the item and raise ``DropItem``."""
        if self._models.origin_of(item) is not None:
            return item  # validated already (a model mapped to itself)
        try:
            instance = self._models.validate(item)
        except InvalidItemError as exc:
            drop = await self._reject(item, exc)
            raise drop from exc
        if instance is None:
            return item
        self._stats.inc_value("validation/passed")
        if isinstance(instance, Product):
            canonical = ItemAdapter(item).get("canonical_url")
            if isinstance(canonical, str):
                why = canonical_product_url(instance.url, canonical)[1]
                if why is not None:
                    self._stats.inc_value(f"validation/canonical/{why}")
        return instance

    async def _reject(self, item: Any, exc: InvalidItemError) -> DropItem:
        """Count and store an invalid item; the ``DropItem`` to raise for it."""
        name = type(item).__name__
        self._stats.inc_value("validation/dropped")
        self._stats.inc_value(f"validation/dropped/{name}")
        for field in exc.reasons:
            self._stats.inc_value(f"validation/errors/{field}")
        product = is_product_type(type(item))
        if self._store is not None:
            await self._store.save_reject(
                exc.data, exc.reasons, item_type=None if product else name
            )
        summary = "; ".join(
            "{}: {}".format(field, ", ".join(messages)) for field, messages in exc.reasons.items()
        )
        url = exc.data.get("url")
        if product:
            return DropItem(f"invalid product {str(url)[:_MAX_URL_SHOWN]} ({summary})")
        where = f" {url[:_MAX_URL_SHOWN]}" if isinstance(url, str) else ""
        return DropItem(f"invalid {name}{where} ({summary})")
