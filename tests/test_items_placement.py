"""Where any item is stored (collection, ``_id``) and what its document holds; no server needed."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import bson
import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from scrapy.settings import Settings

from project.items import ProductItem
from project.schema import Product
from project.storage.config import MongoConfig
from project.storage.documents import content_hash, unencodable
from project.storage.itemtypes import TypeTable, type_keys
from project.storage.placement import (
    MAX_ID_LENGTH,
    ItemPlacer,
    UnplaceableItemError,
    default_collection,
)
from project.storage.values import MAX_DEPTH, DocumentError, item_document
from tests.hostile_values import HostileDict, HostileInt, HostileMapping
from tests.test_schema import VALID


@dataclasses.dataclass
class BookItem:
    url: str | None = None
    title: str = "Dune"
    isbn: Any = "978-0441013593"
    edition: Any = 1


class Article(scrapy.Item):
    url = scrapy.Field()
    title = scrapy.Field()


class SpecialArticle(Article):
    pass


@attrs.define
class JobPosting:
    url: str
    title: str


class Review(BaseModel):
    url: str
    stars: int


class Color(enum.Enum):
    RED = "red"


def placer(spider: str = "catalog", **settings: Any) -> ItemPlacer:
    return ItemPlacer(MongoConfig.from_settings(Settings(settings), spider_name=spider), spider)


# -- collections ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (BookItem, "books"),
        (Article, "articles"),
        (JobPosting, "job_postings"),
        (Review, "reviews"),
        (type("HTTPResponseItem", (), {}), "http_responses"),
        (type("Item", (), {}), "items"),
        (type("Bücher", (), {}), "büchers"),
        (dict, "catalog"),  # a plain dict: the spider's name
        (type("Row", (dict,), {}), "rows"),
    ],
)
def test_a_type_goes_to_the_snake_case_plural_of_its_name(cls: type, expected: str) -> None:
    assert default_collection(cls, "catalog") == expected


def test_type_keys_name_the_class_then_its_bases() -> None:
    keys = type_keys(SpecialArticle)
    assert keys[:4] == [
        "tests.test_items_placement.SpecialArticle",
        "SpecialArticle",
        "tests.test_items_placement.Article",
        "Article",
    ]
    assert "scrapy.item.Item" in keys
    assert "object" not in keys
    assert type_keys(dict) == ["builtins.dict", "dict"]


def test_a_type_table_prefers_the_exact_type_and_earlier_layers() -> None:
    table = TypeTable({"Article": "base", "SpecialArticle": None}, {"SpecialArticle": "default"})
    assert table.get(Article) == "base"
    assert table.get(SpecialArticle) is None, "None in an earlier layer says no value"
    assert TypeTable({"tests.test_items_placement.BookItem": "dotted"}).get(BookItem) == "dotted"
    assert TypeTable({"dict": "plain"}).get(type("Row", (dict,), {})) == "plain"


def test_mongo_collections_names_the_collection_of_a_type() -> None:
    chosen = placer(
        MONGO_COLLECTIONS={
            "BookItem": "library",
            "tests.test_items_placement.Article": "press",
            "dict": "things",
        }
    )
    assert chosen.place(BookItem(url="http://a.test/1")).collection == "library"
    assert chosen.place(SpecialArticle(url="http://a.test/2")).collection == "press"
    assert chosen.place({"url": "http://a.test/3"}).collection == "things"
    assert chosen.place(JobPosting("http://a.test/4", "x")).collection == "job_postings"


@pytest.mark.parametrize(
    ("spider", "reason"),
    [
        ("system.things", "collection_invalid"),
        ("a$b", "collection_invalid"),
        ("x" * 300, "collection_invalid"),
        ("rejects", "collection_reserved"),
        ("products", "collection_reserved"),
        ("failures", "collection_reserved"),
    ],
)
def test_a_collection_mongodb_refuses_or_reserved_is_unplaceable(spider: str, reason: str) -> None:
    with pytest.raises(UnplaceableItemError) as info:
        placer(spider).place({"url": "http://a.test/1"})
    assert info.value.reason == reason
    assert info.value.item_type == "dict"
    assert "MONGO_COLLECTIONS" in info.value.message


def test_two_types_defaulting_to_one_collection_are_refused_for_the_second() -> None:
    books = placer("books")
    assert books.place({"url": "http://a.test/1"}).collection == "books", "the spider's dicts"
    with pytest.raises(UnplaceableItemError) as info:
        books.place(BookItem(url="http://a.test/1"))
    assert (info.value.item_type, info.value.reason) == ("BookItem", "collection_shared")
    assert "MONGO_COLLECTIONS" in info.value.message
    assert "builtins.dict" in info.value.message
    assert books.place({"url": "http://a.test/2"}).collection == "books", "the first stays"
    # Products are not placed by collection rules.
    assert books.place(Product.model_validate(VALID), ProductItem).collection == "products"


def test_two_classes_of_one_name_in_different_modules_do_not_share_a_collection() -> None:
    other = dataclasses.make_dataclass("BookItem", [("url", str)])
    other.__module__ = "elsewhere.items"
    chosen = placer()
    assert chosen.place(BookItem(url="http://a.test/1")).collection == "books"
    with pytest.raises(UnplaceableItemError) as info:
        chosen.place(other(url="http://a.test/1"))
    assert info.value.reason == "collection_shared"
    assert "tests.test_items_placement.BookItem" in info.value.message
    assert "elsewhere.items.BookItem" in info.value.message
    # The same class made again (same module, same name) is the same type.
    again = dataclasses.make_dataclass("BookItem", [("url", str)])
    again.__module__ = BookItem.__module__
    again.__qualname__ = BookItem.__qualname__
    assert chosen.place(again(url="http://a.test/2")).collection == "books"


def test_a_collection_mongo_collections_names_may_be_shared_on_purpose() -> None:
    chosen = placer("books", MONGO_COLLECTIONS={"BookItem": "books"})
    assert chosen.place({"url": "http://a.test/1"}).collection == "books"
    assert chosen.place(BookItem(url="http://a.test/2")).collection == "books"
    shared = placer(MONGO_COLLECTIONS={"BookItem": "library", "Article": "library"})
    assert shared.place(BookItem(url="http://a.test/1")).collection == "library"
    assert shared.place(Article(url="http://a.test/2")).collection == "library"


def test_a_product_stored_outside_products_is_an_item_record() -> None:
    product = Product.model_validate(VALID)
    chosen = placer(MONGO_COLLECTIONS={"BookItem": "library"})
    placed = chosen.place(product, BookItem)
    assert (placed.kind, placed.collection, placed.item_type) == ("item", "library", "BookItem")
    assert placed.id == "http://shop.test/product/7"
    assert chosen.place(product, ProductItem).kind == "product"
    assert chosen.place(product).kind == "product"


def test_products_keep_their_collection_shape_and_id() -> None:
    product = Product.model_validate(VALID)
    placed = placer().place(product, ProductItem)
    assert (placed.kind, placed.collection, placed.id) == (
        "product",
        "products",
        "http://shop.test/product/7",
    )
    assert placed.doc == {**product.content(), "url": product.url, "rendered": False}
    assert placed.hash == product.content_hash()
    assert placer().place(product).collection == "products"


# -- ids -------------------------------------------------------------------------------------


def test_the_default_id_is_the_normalised_canonical_url_or_url() -> None:
    place = placer().place
    assert place({"url": "HTTP://A.test:80/x?b=2&a=1#frag"}).id == "http://a.test/x?a=1&b=2"
    assert place({"url": "http://user:pw@a.test/x"}).id == "http://a.test/x", "no credentials"
    assert place({"url": "http://a.test/x?utm=1", "canonical_url": "/x"}).id == "http://a.test/x"
    # A canonical link to another site is replaced by the page's own URL, as a product's is.
    assert place({"url": "http://a.test/x", "canonical_url": "http://b.test/x"}).id == (
        "http://a.test/x"
    )
    assert place({"canonical_url": "http://a.test/c"}).id == "http://a.test/c"
    assert place({"url": 42, "canonical_url": None, "n": 1}).id_from_content
    assert place({"url": "http://a:99999/x", "canonical_url": "http://b.test/y"}).id_from_content
    assert place({"url": "http://a.test/x"}).id_from_url
    assert not place({"name": "x"}).id_from_url


@pytest.mark.parametrize(
    "item",
    [
        {"url": "/book/1"},
        {"url": "book/1"},
        {"url": "n/a"},
        {"url": "mailto:shop@a.test"},
        {"url": "ftp://a.test/file"},
        {"url": "javascript:void(0)"},
        {"url": "http://"},
        {"url": "http://a.test:99999/x"},
        {"canonical_url": "/book/1"},
        {"url": "n/a", "canonical_url": "/book/1"},
        {"url": "not a page", "canonical_url": "http://a.test/book/1"},
    ],
)
def test_an_id_from_a_url_needs_an_absolute_http_url(item: dict[str, Any]) -> None:
    one = placer().place({**item, "n": 1})
    two = placer().place({**item, "n": 2})
    assert one.id_from_content, "else every item of this shape shares one _id"
    assert (one.id, two.id) == (one.hash, two.hash)
    assert not one.id_from_url


def test_an_item_without_a_url_is_named_by_its_content() -> None:
    first = placer().place({"name": "x", "n": 1})
    again = placer().place({"n": 1, "name": "x"})
    other = placer().place({"name": "x", "n": 2})
    assert first.id_from_content
    assert first.id == again.id == first.hash == content_hash(first.doc)
    assert other.id != first.id


def test_mongo_id_fields_names_the_fields_of_the_id() -> None:
    chosen = placer(MONGO_ID_FIELDS={"BookItem": ["isbn", "edition"], "dict": "sku"})
    assert chosen.place(BookItem()).id == "978-0441013593|1"
    assert chosen.place(BookItem(isbn="a|b", edition="c")).id == "a\\|b|c"
    assert chosen.place(BookItem(isbn="a", edition="b|c")).id == "a|b\\|c", "never one id"
    assert chosen.place({"sku": 12, "url": "http://a.test/x"}).id == "12"
    assert chosen.place({"sku": Decimal("1.5")}).id == "1.5"
    assert chosen.place({"sku": Color.RED}).id == "red"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "id_missing"),
        ("", "id_empty"),
        ("   ", "id_empty"),
        (["a"], "id_not_scalar"),
        ({"a": 1}, "id_not_scalar"),
        ("x" * (MAX_ID_LENGTH + 1), "id_too_long"),
    ],
)
def test_an_id_field_that_cannot_name_the_item_is_unplaceable(value: object, reason: str) -> None:
    with pytest.raises(UnplaceableItemError) as info:
        placer(MONGO_ID_FIELDS={"BookItem": "isbn"}).place(BookItem(isbn=value))
    assert (info.value.item_type, info.value.reason) == ("BookItem", reason)
    assert "'isbn'" in info.value.message or reason == "id_too_long"


def test_an_absent_id_field_is_missing() -> None:
    with pytest.raises(UnplaceableItemError) as info:
        placer(MONGO_ID_FIELDS={"dict": "sku"}).place({"url": "http://a.test/1"})
    assert info.value.reason == "id_missing"


@pytest.mark.parametrize("field", ["content_hash", "crawl_id", "first_seen", "last_seen", "_id"])
def test_a_field_the_store_writes_is_refused(field: str) -> None:
    with pytest.raises(UnplaceableItemError) as info:
        placer().place({"url": "http://a.test/1", field: "mine"})
    assert info.value.reason == "reserved_field"


def test_an_id_field_named_id_becomes_the_id() -> None:
    placed = placer(MONGO_ID_FIELDS={"dict": "_id"}).place({"_id": "A-1", "n": 1})
    assert placed.id == "A-1"
    assert "_id" not in placed.doc


def test_something_that_is_not_an_item_is_unplaceable() -> None:
    with pytest.raises(UnplaceableItemError) as info:
        placer().place("just text")
    assert info.value.reason == "not_an_item"


# -- values ------------------------------------------------------------------------------------


def test_values_become_what_bson_ferretdb_and_json_take() -> None:
    @dataclasses.dataclass
    class Inner:
        a: int

    class Model(BaseModel):
        when: datetime.datetime
        price: Decimal

    doc, escaped = item_document(
        {
            "price": Decimal("12.50"),
            "tags": {"b", "a", "c"},
            "pair": (1, 2),
            "day": datetime.date(2024, 5, 1),
            "at": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
            "time": datetime.time(8, 15),
            "color": Color.RED,
            "id": uuid.UUID(int=1),
            "raw": b"\x00\xff",
            "nan": float("nan"),
            "inf": float("-inf"),
            "inner": Inner(3),
            "article": Article(title="t"),
            "job": JobPosting("u", "t"),
            "model": Model(when=datetime.datetime(2024, 1, 1), price=Decimal("1.10")),
            Color.RED: "enum key",
            7: "int key",
        }
    )
    assert doc == {
        "price": "12.50",
        "tags": ["a", "b", "c"],
        "pair": [1, 2],
        "day": "2024-05-01",
        "at": "2024-05-01T12:30:00+00:00",
        "time": "08:15:00",
        "color": "red",
        "id": "00000000-0000-0000-0000-000000000001",
        "raw": "AP8=",
        "nan": None,
        "inf": None,
        "inner": {"a": 3},
        "article": {"title": "t"},
        "job": {"url": "u", "title": "t"},
        "model": {"when": "2024-01-01T00:00:00", "price": "1.10"},
        "red": "enum key",
        "7": "int key",
    }
    assert escaped == 0
    assert json.loads(json.dumps(doc)) == doc, "a journal record is the document itself"
    bson.encode(doc)


def test_hostile_keys_are_escaped_as_in_rejects() -> None:
    doc, escaped = item_document(
        {"$where": "sleep(1)", "a.b": {"c.d": 1, "$gt": ""}, "nul\x00key": 1, "": 2,
         "x": {"\x00": 3}}
    )  # fmt: skip
    assert doc == {"\uff04where": "sleep(1)", "a\uff0eb": {"c\uff0ed": 1, "\uff04gt": ""},
                   "nulkey": 1, "_": 2, "x": {"_": 3}}  # fmt: skip
    assert escaped == 7
    with pytest.raises(DocumentError, match="two field names are stored as 'ab'"):
        item_document({"ab": 1, "a\x00b": 2})


def _deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deep_values_are_refused_past_mongodbs_limit_without_recursing_away() -> None:
    item_document(_deep(MAX_DEPTH - 2))
    with pytest.raises(DocumentError, match="nested deeper than 100 levels") as info:
        item_document(_deep(50_000))
    assert str(info.value).startswith("a.a.a.")
    cycle: dict[str, Any] = {"url": "http://a.test/"}
    cycle["self"] = cycle
    with pytest.raises(DocumentError, match="nested deeper"):
        item_document(cycle)
    listed: list[Any] = []
    listed.append(listed)
    with pytest.raises(DocumentError, match="nested deeper"):
        item_document({"l": listed})


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (object(), "o"),
        ({"x": [1, object()]}, "o.x[1]"),
        ({("a", "b"): 1}, "o.('a', 'b')"),
        ({10**5000: 1}, "o.<int>"),
    ],
    ids=["object", "nested-object", "tuple-key", "huge-int-key"],
)
def test_a_value_no_document_holds_is_named_with_its_place(value: object, where: str) -> None:
    with pytest.raises(DocumentError) as info:
        item_document({"url": "http://a.test/", "o": value})
    assert str(info.value).startswith(f"{where}: ")


def test_a_set_hashes_the_same_whatever_its_order() -> None:
    one = placer().place({"tags": {f"t{n}" for n in range(50)}})
    two = placer().place({"tags": {f"t{n}" for n in reversed(range(50))}})
    mixed = placer().place({"tags": {1, "a", None, 2.5}})
    assert one.hash == two.hash
    assert mixed.doc["tags"] == sorted(mixed.doc["tags"], key=json.dumps)


class Tagged(BaseModel):
    url: str
    tags: set[str]
    codes: frozenset[int] = frozenset()
    when: datetime.datetime = datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)


_ROOT = Path(__file__).resolve().parents[1]
_HASH_OF_TAGGED = """
from project.storage.placement import ItemPlacer
from project.storage.config import MongoConfig
from scrapy.settings import Settings
from tests.test_items_placement import Tagged
item = Tagged(url="http://a.test/1", tags={f"tag{n}" for n in range(40)}, codes={3, 1, 2})
print(ItemPlacer(MongoConfig.from_settings(Settings()), "x").place(item).hash)
"""


def test_a_pydantic_set_hashes_the_same_in_every_process() -> None:
    placed = placer().place(Tagged(url="http://a.test/1", tags={f"tag{n}" for n in range(40)},
                                   codes={3, 1, 2}))  # fmt: skip
    assert placed.doc["tags"] == sorted(f"tag{n}" for n in range(40))
    assert placed.doc["codes"] == [1, 2, 3]
    assert placed.doc["when"] == "2024-05-01T12:00:00Z", "as model_dump(mode='json') writes it"
    hashes = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(_ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", _HASH_OF_TAGGED], env=env, capture_output=True, text=True,
            check=True, timeout=120,
        )  # fmt: skip
        hashes.add(done.stdout.strip())
    assert hashes == {placed.hash}, "a re-crawl by another process finds it unchanged"


class Node(BaseModel):
    url: str = "http://a.test/node"
    child: Node | None = None


def test_an_item_whose_own_code_raises_is_refused_by_name() -> None:
    looped = Node()
    looped.child = looped
    with pytest.raises(DocumentError, match="Node cannot be serialised: ValueError: Circular"):
        placer().place(looped)
    with pytest.raises(DocumentError, match=r"^n: reading it raised RuntimeError: no int for you"):
        placer().place({"url": "http://a.test/", "n": HostileInt(3)})
    with pytest.raises(DocumentError, match=r"^m: reading it raised RuntimeError: no items"):
        placer().place({"url": "http://a.test/", "m": HostileMapping()})
    with pytest.raises(DocumentError, match=r"^l\[1\]: reading it raised RuntimeError"):
        placer().place({"url": "http://a.test/", "l": [1, HostileMapping()]})
    with pytest.raises(DocumentError, match=r"^d: reading it raised RuntimeError: no items"):
        placer().place({"url": "http://a.test/", "d": HostileDict(a=1)})


def test_a_huge_value_is_placed_and_left_to_the_size_check() -> None:
    placed = placer().place({"url": "http://a.test/", "text": "x" * 20_000_000})
    assert len(placed.doc["text"]) == 20_000_000, "too large: the store rejects it, with why"
    assert len(placed.hash) == 64


@pytest.mark.parametrize(
    "number", [2**63, -(2**63) - 1, 10**5000], ids=["2^63", "-2^63-1", "10^5000"]
)
def test_an_integer_beyond_64_bits_is_refused_by_name(number: int) -> None:
    with pytest.raises(DocumentError, match=r"^n: an integer of \d+ bits; BSON stores at most 64"):
        placer().place({"url": "http://a.test/", "n": number})
    with pytest.raises(DocumentError, match="BSON stores at most 64"):
        placer(MONGO_ID_FIELDS={"dict": "n"}).place({"n": number})
    assert placer().place({"n": 2**63 - 1, "m": -(2**63)}).doc == {"n": 2**63 - 1, "m": -(2**63)}


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
    | st.decimals() | st.dates() | st.datetimes() | st.binary(max_size=8)
    | st.sampled_from(Color),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    | st.frozensets(st.integers() | st.text(max_size=4), max_size=4),
    max_leaves=25,
)  # fmt: skip


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for key, inner in value.items() for k in (key, *_keys(inner))]
    if isinstance(value, list):
        return [k for inner in value for k in _keys(inner)]
    return []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=st.dictionaries(st.text(max_size=8), _VALUES, max_size=6))
def test_any_item_is_placed_or_refused_by_name(item: dict[str, Any]) -> None:
    try:
        placed = placer().place(item)
    except (DocumentError, UnplaceableItemError) as exc:
        refused = str(exc)
    else:
        refused = None
    if refused is not None:
        assert refused, "a refusal says why"
        return
    assert json.loads(json.dumps(placed.doc)) == placed.doc
    for key in _keys(placed.doc):
        assert not key.startswith("$")
        assert "." not in key
        assert "\x00" not in key
    assert placed.hash == content_hash(placed.doc)
    reason = unencodable({"_id": placed.id, **placed.doc})  # never raises
    assert reason is None or reason.startswith("UnicodeEncodeError"), reason
