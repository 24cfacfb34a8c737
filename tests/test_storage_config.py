"""The ``MONGO_*``, ``CRAWL_ID`` and ``VALIDATION_*`` settings, parsed by their Config classes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from pipelines.validation import ValidationConfig, ValidationPipeline
from project.config import setting_fields
from project.storage.config import MongoConfig


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
        journal_dir=Path(".state/journal/shop"),
        retry_max_delay=30.0,
        server_selection_timeout=3.0,
        socket_timeout=30.0,
        crawl_id="shop-20260102T030405Z",
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
            "MONGO_JOURNAL_DIR": "/var/j/{spider}",
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
    assert config.journal_dir == Path("/var/j/books")
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
    ],
)
def test_config_rejects_unusable_values(name: str, value: object) -> None:
    with pytest.raises(NotConfigured, match=name):
        MongoConfig.from_settings(Settings({name: value}))


def test_every_setting_has_a_default() -> None:
    # setting_fields raises TypeError on a setting field without a default.
    names = {name for config in (MongoConfig, ValidationConfig)
             for _, name, _ in setting_fields(config)}  # fmt: skip
    assert names >= {
        "MONGO_URI", "MONGO_DATABASE", "MONGO_PRODUCTS_COLLECTION", "MONGO_REJECTS_COLLECTION",
        "MONGO_FAILURES_COLLECTION", "MONGO_BATCH_SIZE", "MONGO_FLUSH_INTERVAL", "MONGO_JOURNAL_DIR",
        "MONGO_RETRY_MAX_DELAY", "CRAWL_ID", "VALIDATION_ENABLED",
    }  # fmt: skip


def test_validation_pipeline_can_be_switched_off() -> None:
    crawler = get_crawler(Spider, {"VALIDATION_ENABLED": False})
    with pytest.raises(NotConfigured):
        ValidationPipeline.from_crawler(crawler)
