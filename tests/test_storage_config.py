"""The ``MONGO_*``, ``CRAWL_ID`` and ``VALIDATION_*`` settings, parsed by their Config classes."""

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
    )
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
            "CRAWL_ID": "nightly-7",
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
        ("MONGO_HOST", "the MONGO_ settings are MONGO_BATCH_SIZE, MONGO_DATABASE"),
    ],
)
def test_row6_a_misspelt_mongo_setting_stops_the_node(name: str, hint: str) -> None:
    settings = Settings({name: "mongodb://db.internal:27017"})
    with pytest.raises(StorageConfigError, match=f"unknown setting {name}: {hint}"):
        MongoConfig.from_settings(settings)
    crawler = get_crawler(_Shop, {name: "mongodb://db.internal:27017"})
    with pytest.raises(StorageConfigError, match=name):
        MongoPipeline.from_crawler(crawler)


def test_row6_unset_or_foreign_names_are_not_typos() -> None:
    settings = Settings({"MONGO_URL": None, "MONGODB_PIPELINE_ORDER": 5, "MONGO_URI": None})
    assert MongoConfig.from_settings(settings).uri == "mongodb://127.0.0.1:27017"


def test_row12_the_journal_is_keyed_by_database_and_spider() -> None:
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
        "MONGO_RETRY_MAX_DELAY", "MONGO_WRITE_CONCERN", "CRAWL_ID", "VALIDATION_ENABLED",
    }  # fmt: skip


def test_validation_pipeline_can_be_switched_off() -> None:
    crawler = get_crawler(Spider, {"VALIDATION_ENABLED": False})
    with pytest.raises(NotConfigured):
        ValidationPipeline.from_crawler(crawler)
