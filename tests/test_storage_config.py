"""The ``MONGO_*``, ``RUNS_CRAWL_ID`` and ``VALIDATION_*`` settings, parsed by their Config classes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from pipelines.mongo import MongoPipeline
from pipelines.validation import ValidationConfig, ValidationPipeline
from project.config import setting_fields
from project.storage.config import MongoConfig, StorageConfigError


class _Shop(Spider):
    name = "shop"


def test_config_defaults() -> None:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    config = MongoConfig.from_settings(Settings(), spider_name="shop", started=started)
    assert config == MongoConfig(
        uri="mongodb://127.0.0.1:27017",
        database="fleetcrawl",
        products_collection="products",
        rejects_collection="rejects",
        failures_collection="failures",
        batch_size=100,
        flush_interval=1.0,
        journal_dir=Path(".state/journal/fleetcrawl/shop"),
        retry_max_delay=30.0,
        server_selection_timeout=3.0,
        socket_timeout=30.0,
        write_concern="majority",
        crawl_id="shop-20260102T030405Z",
        legacy_journal_dirs=(Path(".state/journal/shop"),),
        spider="shop",
    )
    assert config.changes_collection == "changes"
    assert config.runs_collection == "crawl_runs"
    assert not config.crawl_id_set  # the fleet's crawl run id replaces it
    assert ValidationConfig.from_settings(Settings()) == ValidationConfig(
        enabled=True, store_rejects=True
    )


def test_config_reads_settings() -> None:
    settings = Settings(
        {
            "MONGO_URI": "mongodb://u:p@db:27018/?replicaSet=rs",
            "MONGO_DATABASE": "shop",
            "MONGO_BATCH_SIZE": "25",
            "MONGO_FLUSH_INTERVAL": "0.5",
            "MONGO_JOURNAL_DIR": "/var/j/{database}-{spider}",
            "MONGO_WRITE_CONCERN": "2",
            "RUNS_CRAWL_ID": "nightly-7",
        }
    )
    config = MongoConfig.from_settings(settings, spider_name="books")
    assert (config.uri, config.database, config.batch_size, config.flush_interval) == (
        "mongodb://u:p@db:27018/?replicaSet=rs",
        "shop",
        25,
        0.5,
    )
    assert config.journal_dir == Path("/var/j/shop-books")
    assert config.legacy_journal_dirs == (), "only the default layout had an older one"
    assert config.write_concern == "2"
    assert config.crawl_id == "nightly-7"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MONGO_URI", "http://127.0.0.1:27017"),
        ("MONGO_URI", ""),
        ("MONGO_DATABASE", ""),
        ("MONGO_BATCH_SIZE", 0),
        ("MONGO_BATCH_SIZE", "many"),
        ("MONGO_FLUSH_INTERVAL", 0),
        ("MONGO_RETRY_MAX_DELAY", "soon"),
        ("MONGO_JOURNAL_DIR", ""),
        ("MONGO_URI", "mongodb://db:port"),
        ("MONGO_URI", "mongodb://db:99999"),
        ("MONGO_URI", "mongodb://db/?replicaset=rs&bogusOption=1"),
        ("MONGO_URI", "mongodb://"),
        ("MONGO_WRITE_CONCERN", "0"),
        ("MONGO_WRITE_CONCERN", ""),
    ],
)
def test_config_rejects_unusable_values(name: str, value: object) -> None:
    # Not NotConfigured: Scrapy would disable the pipelines and crawl on, storing nothing.
    with pytest.raises(StorageConfigError, match=name) as info:
        MongoConfig.from_settings(Settings({name: value}))
    assert not isinstance(info.value, NotConfigured)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("MONGO_URL", "did you mean MONGO_URI?"),
        ("MONGO_DATBASE", "did you mean MONGO_DATABASE?"),
        ("MONGODB_URI", "did you mean MONGO_URI?"),  # scrapy-mongodb's spelling
        ("MONGO_BATCHSIZE", "did you mean MONGO_BATCH_SIZE?"),
        ("MONGO_COLLECTION", "did you mean MONGO_COLLECTIONS?"),
        ("MONGO_ID_FIELD", "did you mean MONGO_ID_FIELDS?"),
        (
            "MONGO_HOST",
            (
                "the MONGO_ settings are MONGO_BATCH_SIZE, MONGO_CHANGES_COLLECTION, MONGO_COLLECTIONS,"
                " MONGO_DATABASE"
            ),
        ),
    ],
)
def test_a_misspelt_mongo_setting_stops_the_node(name: str, hint: str) -> None:
    settings = Settings({name: "mongodb://db.internal:27017"})
    with pytest.raises(StorageConfigError, match=f"unknown setting {name}: {hint}"):
        MongoConfig.from_settings(settings)
    crawler = get_crawler(_Shop, {name: "mongodb://db.internal:27017"})
    with pytest.raises(StorageConfigError, match=name):
        MongoPipeline.from_crawler(crawler)


def test_unset_or_foreign_names_are_not_typos() -> None:
    settings = Settings({"MONGO_URL": None, "MONGODB_PIPELINE_ORDER": 5, "MONGO_URI": None})
    assert MongoConfig.from_settings(settings).uri == "mongodb://127.0.0.1:27017"


def test_the_journal_is_keyed_by_database_and_spider() -> None:
    one = MongoConfig.from_settings(Settings({"MONGO_DATABASE": "a"}), spider_name="products")
    two = MongoConfig.from_settings(Settings({"MONGO_DATABASE": "b"}), spider_name="products")
    assert one.journal_dir == Path(".state/journal/a/products")
    assert two.journal_dir == Path(".state/journal/b/products")
    assert one.legacy_journal_dirs == two.legacy_journal_dirs == (Path(".state/journal/products"),)


def test_every_setting_has_a_default() -> None:
    # setting_fields raises TypeError on a setting field without a default.
    names = {name for config in (MongoConfig, ValidationConfig)
             for _, name, _ in setting_fields(config)}  # fmt: skip
    assert names >= {
        "MONGO_URI", "MONGO_DATABASE", "MONGO_PRODUCTS_COLLECTION", "MONGO_REJECTS_COLLECTION",
        "MONGO_FAILURES_COLLECTION", "MONGO_BATCH_SIZE", "MONGO_FLUSH_INTERVAL", "MONGO_JOURNAL_DIR",
        "MONGO_RETRY_MAX_DELAY", "MONGO_WRITE_CONCERN", "RUNS_CRAWL_ID", "VALIDATION_ENABLED",
    }  # fmt: skip


def test_validation_pipeline_can_be_switched_off() -> None:
    crawler = get_crawler(Spider, {"VALIDATION_ENABLED": False})
    with pytest.raises(NotConfigured):
        ValidationPipeline.from_crawler(crawler)


# -- collections, ids and models by item type --------------------------------------------------


def test_collections_and_id_fields_are_read_and_normalised() -> None:
    config = MongoConfig.from_settings(
        Settings(
            {
                "MONGO_COLLECTIONS": '{"BookItem": "library", "dict": "things"}',  # as with -s
                "MONGO_ID_FIELDS": {
                    " myproject.items.BookItem ": ["isbn", " edition"],
                    "dict": "sku",
                },
            }
        )
    )
    assert config.collections == {"BookItem": "library", "dict": "things"}
    assert config.id_fields == {"myproject.items.BookItem": ("isbn", "edition"), "dict": ("sku",)}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MONGO_COLLECTIONS", "books", "MONGO_COLLECTIONS must be a dict"),
        ("MONGO_COLLECTIONS", ["books"], "MONGO_COLLECTIONS must be a dict"),
        (
            "MONGO_COLLECTIONS",
            {"BookItem": 5},
            r"MONGO_COLLECTIONS\['BookItem'\] must be a collection",
        ),
        ("MONGO_COLLECTIONS", {"BookItem": None}, "must be a collection name"),
        ("MONGO_COLLECTIONS", {"": "books"}, "a key must name an item type"),
        ("MONGO_COLLECTIONS", {"BookItem": ""}, "empty"),
        ("MONGO_COLLECTIONS", {"BookItem": "a$b"}, "contains a NUL or '\\$'"),
        ("MONGO_COLLECTIONS", {"BookItem": "a\x00b"}, "contains a NUL"),
        ("MONGO_COLLECTIONS", {"BookItem": "system.books"}, "starts with 'system.'"),
        ("MONGO_COLLECTIONS", {"BookItem": ".books"}, "starts or ends with '.'"),
        ("MONGO_COLLECTIONS", {"BookItem": "b" * 236}, "too long"),
        ("MONGO_COLLECTIONS", {"BookItem": "rejects"}, "is the products, rejects or failures"),
        ("MONGO_COLLECTIONS", {"ProductItem": "goods"}, "set MONGO_PRODUCTS_COLLECTION instead"),
        ("MONGO_ID_FIELDS", "isbn", "MONGO_ID_FIELDS must be a dict"),
        ("MONGO_ID_FIELDS", {"BookItem": 3}, "must be a field name or a list of field names"),
        ("MONGO_ID_FIELDS", {"BookItem": []}, "must be a field name or a list"),
        ("MONGO_ID_FIELDS", {"BookItem": ["isbn", ""]}, "must be a field name or a list"),
        ("MONGO_ID_FIELDS", {"BookItem": [["isbn"]]}, "must be a field name or a list"),
        ("MONGO_ID_FIELDS", {"project.schema.Product": "sku"}, "remove this entry"),
        ("MONGO_PRODUCTS_COLLECTION", "system.products", "starts with 'system.'"),
        ("MONGO_REJECTS_COLLECTION", "products", "must differ"),
    ],
)
def test_collections_and_id_fields_that_cannot_work_stop_the_node(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(StorageConfigError, match=message):
        MongoConfig.from_settings(Settings({name: value}))
    crawler = get_crawler(_Shop, {name: value})
    with pytest.raises(StorageConfigError, match=message):
        MongoPipeline.from_crawler(crawler)


def test_validation_models_default_to_the_product_schema() -> None:
    from pipelines.validation import ItemModels
    from project.items import ProductItem
    from project.schema import Product

    assert ValidationConfig.from_settings(Settings()).models == {
        "project.items.ProductItem": "project.schema.Product"
    }
    models = ItemModels.from_settings(
        Settings({"VALIDATION_MODELS": {"dict": "project.schema.Product"}})
    )
    assert models.model_for(ProductItem) is Product, "a project's entries add to the default"
    assert models.model_for(dict) is Product
    assert models.model_for(_Shop) is None


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            {"BookItem": "no.such.module.BookModel"},
            r"VALIDATION_MODELS\['BookItem'\]: cannot import",
        ),
        ({"BookItem": "project.schema.NoSuchModel"}, "cannot import 'project.schema.NoSuchModel'"),
        ({"BookItem": "project.items.ProductItem"}, "is not a pydantic model"),
        ({"BookItem": "project.schema.field_errors"}, "is not a pydantic model"),
        ({"BookItem": "nodots"}, "cannot import 'nodots'"),
        ({"BookItem": 5}, "must be the dotted path of a pydantic model or None"),
        ({"ProductItem": None}, "must map project.items.ProductItem to project.schema.Product"),
        ({"ProductItem": "pydantic.BaseModel"}, "must map project.items.ProductItem"),
        ("[1, 2]", "VALIDATION_MODELS must be a dict"),
    ],
)
def test_a_validation_model_that_cannot_be_used_stops_the_node(
    models: object, message: str
) -> None:
    crawler = get_crawler(_Shop, {"VALIDATION_MODELS": models})
    with pytest.raises(StorageConfigError, match=message):
        ValidationPipeline.from_crawler(crawler)
    with pytest.raises(StorageConfigError, match=message):
        MongoPipeline.from_crawler(get_crawler(_Shop, {"VALIDATION_MODELS": models}))
