"""Where an item is stored: its collection, its ``_id``, its document and its content hash.

Products (``project.schema.Product``) keep their shape and their canonical URL. Any other
item goes to the collection ``MONGO_COLLECTIONS`` names for its type, or by default to the
spider's name (a plain ``dict``) or its class name in snake case, a trailing ``Item`` dropped
and an ``s`` added (``BookItem`` -> ``books``). Its ``_id`` is the text of the fields
``MONGO_ID_FIELDS`` names for its type (several joined with ``|``), or by default its
``canonical_url`` (on the site of its ``url``, as a product's) or ``url``, normalised, when
that is an absolute http(s) URL; else the SHA-256 of its content, so an identical item is
stored once. Two item types that default to one collection (a spider ``books`` yielding dicts
and ``BookItem``) would mix their documents: the second type seen is unplaceable
(``collection_shared``) until ``MONGO_COLLECTIONS`` names its collection; a collection that
``MONGO_COLLECTIONS`` names may be shared on purpose, its types then sharing one id space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

from project.items import ProductItem
from project.schema import Product, canonical_product_url, is_http_url, normalise_url
from project.storage.config import collection_name_error
from project.storage.documents import content_hash, escape_key
from project.storage.itemtypes import TypeTable
from project.storage.values import item_document

if TYPE_CHECKING:
    from project.storage.config import MongoConfig

__all__ = [
    "MAX_ID_LENGTH",
    "TRACKING_FIELDS",
    "ItemPlacer",
    "PlacedItem",
    "UnplaceableItemError",
    "default_collection",
    "is_product_type",
    "place_product",
]

#: Longest ``_id`` (characters): a batch looks up its ids in one query, which has to fit 16 MiB.
MAX_ID_LENGTH = 8192
#: Fields the store writes on every document: an item may not bring its own.
TRACKING_FIELDS = frozenset({"_id", "content_hash", "crawl_id", "first_seen", "last_seen"})
#: Item types whose rules are remembered (a spider that makes a class per item gets no more).
_MAX_RULES = 1000
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


@dataclass(frozen=True)
class PlacedItem:
    """An item ready to store: ``kind`` is ``product`` (a ``Product``) or ``item``."""

    kind: str
    collection: str
    id: str
    doc: dict[str, Any]
    hash: str
    item_type: str
    id_from_content: bool = False
    #: The ``_id`` is the item's (canonical) URL: items of one page may share it.
    id_from_url: bool = False
    escaped_keys: int = 0


class UnplaceableItemError(Exception):
    """An item without a collection or an ``_id`` it can be stored under."""

    def __init__(self, item_type: str, reason: str, message: str) -> None:
        super().__init__(f"cannot store {item_type}: {message}")
        self.item_type = item_type
        #: A short name for stats (``mongo/unplaceable/<reason>``).
        self.reason = reason
        self.message = message


def is_product_type(cls: type) -> bool:
    """Items of *cls* go to ``MONGO_PRODUCTS_COLLECTION`` as products."""
    return issubclass(cls, ProductItem | Product)


def default_collection(cls: type, spider_name: str) -> str:
    """The collection of *cls* without a ``MONGO_COLLECTIONS`` entry."""
    if cls is dict:
        return spider_name
    name = cls.__name__
    if name.endswith("Item") and name != "Item":
        name = name[: -len("Item")]
    return _CAMEL.sub("_", name).lower() + "s"


def place_product(product: Product, collection: str, item_type: str = "Product") -> PlacedItem:
    """A product as stored: its content, the page it was seen on, by canonical URL."""
    return PlacedItem(
        kind="product",
        collection=collection,
        id=product.canonical_url,
        doc={**product.content(), "url": product.url, "rendered": product.rendered},
        hash=product.content_hash(),
        item_type=item_type,
    )


@dataclass(frozen=True)
class _Rule:
    """How items of one type are placed."""

    collection: str
    collection_error: tuple[str, str] | None  # (reason, message)
    id_fields: tuple[str, ...]


class ItemPlacer:
    """Places items by the ``MONGO_COLLECTIONS`` and ``MONGO_ID_FIELDS`` of one crawl."""

    def __init__(self, config: MongoConfig, spider_name: str) -> None:
        self._config = config
        self._spider = spider_name
        self._collections: TypeTable[str] = TypeTable(config.collections)
        self._id_fields: TypeTable[tuple[str, ...]] = TypeTable(config.id_fields)
        self._reserved = {
            config.products_collection: "the products collection",
            config.rejects_collection: "the rejects collection",
            config.failures_collection: "the failures collection",
        }
        self._rules: dict[tuple[type, type], _Rule] = {}
        #: Collection -> the item type (dotted path) whose items it took by default, first.
        self._owners: dict[str, str] = {}
        self._named = frozenset(config.collections.values())

    def place(self, item: Any, origin: type | None = None) -> PlacedItem:
        """Place *item*; *origin* is the type it was validated from, if it was.

        Raises :class:`UnplaceableItemError`, or ``project.storage.values.DocumentError`` for a
        value no document can hold.
        """
        source = origin or type(item)
        if isinstance(item, Product):
            collection = self._config.products_collection
            if not is_product_type(source):  # validated into a Product from another type
                rule = self._rule(source, type(item))
                if rule.collection_error is not None and rule.collection != collection:
                    raise UnplaceableItemError(source.__name__, *rule.collection_error)
                collection = rule.collection
            placed = place_product(item, collection, source.__name__)
            if collection != self._config.products_collection:
                # Not "product": a node of an older version replays those into products.
                placed = replace(placed, kind="item")
            return placed
        if not ItemAdapter.is_item(item):
            raise UnplaceableItemError(
                source.__name__, "not_an_item", "not an item type itemadapter supports"
            )
        rule = self._rule(source, type(item))
        if rule.collection_error is not None:
            raise UnplaceableItemError(source.__name__, *rule.collection_error)
        doc, escaped = item_document(item)
        key = self._id(doc, rule, source.__name__)
        if "_id" in rule.id_fields:
            doc.pop("_id", None)
        if clash := sorted(TRACKING_FIELDS & doc.keys()):
            raise UnplaceableItemError(
                source.__name__,
                "reserved_field",
                f"its field {clash[0]!r} is one the store writes on every document"
                f" ({', '.join(sorted(TRACKING_FIELDS))}): rename it",
            )
        digest = content_hash(doc)
        return PlacedItem(
            kind="item",
            collection=rule.collection,
            id=digest if key is None else key,
            doc=doc,
            hash=digest,
            item_type=source.__name__,
            id_from_content=key is None,
            id_from_url=key is not None and not rule.id_fields,
            escaped_keys=escaped,
        )

    def _rule(self, source: type, model: type) -> _Rule:
        try:
            return self._rules[source, model]
        except KeyError:
            pass
        if len(self._rules) >= _MAX_RULES:
            self._rules.clear()
        rule = self._rules[source, model] = self._new_rule(source, model)
        return rule

    def _new_rule(self, source: type, model: type) -> _Rule:
        named = self._collections.get(source)
        collection = named or default_collection(source, self._spider)
        fields = self._id_fields.get(source) or self._id_fields.get(model) or ()
        error: tuple[str, str] | None = None
        if why := collection_name_error(collection, self._config.database):
            message = f"collection {collection[:100]!r}: {why}; name one in MONGO_COLLECTIONS"
            error = ("collection_invalid", message)
        elif collection in self._reserved:
            message = (
                f"collection {collection!r} is {self._reserved[collection]};"
                " name another in MONGO_COLLECTIONS"
            )
            error = ("collection_reserved", message)
        elif not named and collection not in self._named:
            path = f"{source.__module__}.{source.__qualname__}"
            owner = self._owners.setdefault(collection, path)
            if owner != path:
                # Their ids would collide and their fields mix: one type per default collection.
                message = (
                    f"collection {collection!r} is where items of type {owner} go by default;"
                    f" name a collection for {path} in MONGO_COLLECTIONS"
                )
                error = ("collection_shared", message)
        return _Rule(collection, error, fields)

    def _id(self, doc: dict[str, Any], rule: _Rule, name: str) -> str | None:
        """The ``_id`` of *doc*, or None when it is to be its content hash."""
        if not rule.id_fields:
            key = _url_id(doc)
            if key is None:
                return None
        else:
            parts = [_id_part(doc, field, name) for field in rule.id_fields]
            # Escaped, so that two different lists of values never join into one id.
            key = (
                parts[0]
                if len(parts) == 1
                else "|".join(p.replace("\\", "\\\\").replace("|", "\\|") for p in parts)
            )
        if len(key) > MAX_ID_LENGTH:
            raise UnplaceableItemError(
                name, "id_too_long", f"its id has {len(key)} characters, at most {MAX_ID_LENGTH}"
            )
        return key


def _url_id(doc: dict[str, Any]) -> str | None:
    """The normalised ``canonical_url`` (on the site of ``url``) or ``url``, if that is an
    absolute http(s) URL (``/a``, ``mailto:`` or ``n/a`` names nothing: the content does)."""
    url, canonical = doc.get("url"), doc.get("canonical_url")
    url = url.strip() if isinstance(url, str) and url.strip() else None
    canonical = canonical.strip() if isinstance(canonical, str) and canonical.strip() else None
    if url is not None and canonical is not None:
        try:
            key = canonical_product_url(url, canonical)[0]
        except ValueError:  # a page URL that does not parse (a port out of range)
            key = normalise_url(url)
    elif url is None and canonical is None:
        return None
    else:
        key = normalise_url(canonical or url or "")
    return key if is_http_url(key) else None


def _id_part(doc: dict[str, Any], field: str, name: str) -> str:
    value = doc.get(escape_key(field))
    where = f"its id field {field!r} (MONGO_ID_FIELDS)"
    if value is None:
        raise UnplaceableItemError(name, "id_missing", f"{where} is missing")
    if isinstance(value, bool | int | float):
        return str(value)
    if not isinstance(value, str):
        raise UnplaceableItemError(
            name, "id_not_scalar", f"{where} is a {type(value).__name__}, not text or a number"
        )
    if not value.strip():
        raise UnplaceableItemError(name, "id_empty", f"{where} is empty")
    return value
