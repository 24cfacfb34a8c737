"""Every scheduling knob Scrapy and scrapy-redis users know is honoured, or refused at start
with the fleet's way named: none is silently dead."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import scrapy_redis.defaults
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from scrapy_redis.spiders import RedisSpider

from project.addon import FleetAddon
from project.config import FleetConfigError, read_settings
from project.frontier.compat import REFUSED, RENAMED, RETIRED, SCRAPY_REDIS_SETTINGS
from project.frontier.config import FrontierConfig, RetryConfig
from project.frontier.dupefilter import FleetDupeFilter
from project.frontier.keys import KeyTemplates
from project.frontier.scheduler import FleetScheduler
from project.frontier.spiders import requests_from_seed


def _settings(**values: Any) -> Settings:
    settings = Settings()
    settings.setdict(values, priority="project")
    FleetAddon().update_settings(settings)
    return settings


def test_every_default_of_scrapy_redis_is_accounted_for() -> None:
    """A new scrapy-redis default fails here until someone decides what the fleet does with it."""
    names = {name for name in vars(scrapy_redis.defaults) if name.isupper()}
    assert names == set(SCRAPY_REDIS_SETTINGS)
    for constant, (setting, fate) in SCRAPY_REDIS_SETTINGS.items():
        if setting is None:
            continue
        if fate.startswith("refused"):
            assert setting in REFUSED, f"{constant}: {setting} is said to be refused"
        elif fate.startswith("honoured"):
            assert setting not in REFUSED, f"{constant}: {setting} is said to be honoured"
        assert setting in _HONOURED or setting in _REFUSALS, f"{setting} is not tested here"


#: A value of each refused setting, and a word of the fleet's way the refusal must name.
_REFUSALS = {
    "SCHEDULER_QUEUE_CLASS": ("scrapy_redis.queue.FifoQueue", "priority"),
    "SCHEDULER_SERIALIZER": ("scrapy_redis.picklecompat", "JSON"),
    "SCHEDULER_FLUSH_ON_START": (True, "fleetcrawl clear"),
    "SCHEDULER_IDLE_BEFORE_CLOSE": (10, "FRONTIER_IDLE_GRACE"),
    "REDIS_START_URLS_AS_ZSET": (True, '"priority"'),
    "REDIS_CLS": ("redis.StrictRedis", "REDIS_PARAMS"),
    "REDIS_DECODE_RESPONSES": (True, "bytes"),
    "DUPEFILTER_KEY": ("dupefilter:%(timestamp)s", "SCHEDULER_DUPEFILTER_KEY"),
    "SCHEDULER_PRIORITY_QUEUE": ("scrapy.pqueues.ScrapyPriorityQueue", "Redis"),
    "SCHEDULER_MEMORY_QUEUE": ("scrapy.squeues.FifoMemoryQueue", "Redis"),
    "SCHEDULER_DISK_QUEUE": ("scrapy.squeues.PickleFifoDiskQueue", "Redis"),
    "SCHEDULER_START_MEMORY_QUEUE": ("scrapy.squeues.LifoMemoryQueue", "Redis"),
    "SCHEDULER_START_DISK_QUEUE": ("scrapy.squeues.PickleLifoDiskQueue", "Redis"),
    "FRONTIER_RETRY_TIMES": (5, "RETRY_TIMES"),
    "FRONTIER_RETRY_HTTP_CODES": ([500], "RETRY_HTTP_CODES"),
    "SCHEDULER": ("scrapy_redis.scheduler.Scheduler", "FleetScheduler"),
}


def test_the_refusal_table_covers_every_refused_setting() -> None:
    assert set(REFUSED) <= set(_REFUSALS)


@pytest.mark.parametrize("name", sorted(_REFUSALS))
def test_a_setting_the_fleet_cannot_honour_stops_the_node_naming_the_fleets_way(
    name: str,
) -> None:
    value, way = _REFUSALS[name]
    with pytest.raises(FleetConfigError) as info:
        _settings(**{name: value})
    assert name in str(info.value)
    assert way in str(info.value)


def test_redis_db_beside_redis_url_is_refused() -> None:
    with pytest.raises(FleetConfigError, match="put the database in REDIS_URL"):
        _settings(REDIS_URL="redis://127.0.0.1:6379/0", REDIS_DB=3)


class MyDupeFilter(FleetDupeFilter):
    """A project's own seen-set rule, on the fleet's seen-set."""


class _Books(RedisSpider):
    name = "books"


def _scheduler(**values: Any) -> FleetScheduler:
    crawler = get_crawler(_Books, {"ADDONS": {FleetAddon: 0}, **values})
    crawler.spider = _Books.from_crawler(crawler)
    scheduler = FleetScheduler.from_crawler(crawler)
    scheduler.spider = crawler.spider
    return scheduler


def _seed_decodes_as(**values: Any) -> str:
    crawler = get_crawler(_Books, {"ADDONS": {FleetAddon: 0}, **values})
    spider = _Books.from_crawler(crawler)
    (request,) = requests_from_seed(spider, "http://shop.example/caf\u00e9".encode("latin-1"))
    return request.url


class _Idle(RedisSpider):
    name = "idle"
    max_idle_time = 9
    redis_batch_size = 2


#: Honoured settings: a value, and what the fleet's parsed settings make of it.
_HONOURED: dict[str, tuple[Any, Any]] = {
    "SCHEDULER_QUEUE_KEY": (
        "{x}:%(spider)s:q",
        lambda s: KeyTemplates.from_settings(s).queue == "{x}:%(spider)s:q",
    ),
    "SCHEDULER_DUPEFILTER_KEY": (
        "x:%(spider)s:seen",
        lambda s: KeyTemplates.from_settings(s).dupefilter == "x:%(spider)s:seen",
    ),
    "REDIS_START_URLS_KEY": (
        "x:%(name)s:seeds",
        lambda s: KeyTemplates.from_settings(s).start_urls == "x:%(name)s:seeds",
    ),
    "REDIS_START_URLS_AS_SET": (True, lambda s: FrontierConfig.from_settings(s).seeds_as_set),
    "SCHEDULER_PERSIST": (False, lambda s: not FrontierConfig.from_settings(s).persist),
    "SCHEDULER_QUEUE_CLASS": (
        "scrapy_redis.queue.PriorityQueue",
        lambda s: True,  # the fleet's queue is a priority queue: accepted
    ),
    "MAX_IDLE_TIME_BEFORE_CLOSE": (
        0,
        lambda s: FrontierConfig.from_settings(s).for_spider(Spider("x")).keep_alive,
    ),
    "REDIS_PARAMS": (
        {"password": "pw", "socket_timeout": 5, "retry_on_timeout": True, "encoding": "utf-8"},
        lambda s: (
            FrontierConfig.from_settings(s).redis_params == {"password": "pw", "socket_timeout": 5}
        ),
    ),
    "REDIS_HOST": (
        "10.1.2.3",
        lambda s: FrontierConfig.from_settings(s).redis_url == "redis://10.1.2.3:6379/0",
    ),
    "REDIS_PORT": (
        6390,
        lambda s: FrontierConfig.from_settings(s).redis_url == "redis://127.0.0.1:6390/0",
    ),
    "REDIS_DB": (4, lambda s: FrontierConfig.from_settings(s).redis_url.endswith(":6379/4")),
    "RETRY_TIMES": (7, lambda s: RetryConfig.from_settings(s).max_retries == 7),
    "RETRY_ENABLED": (False, lambda s: RetryConfig.from_settings(s).max_retries == 0),
    "RETRY_HTTP_CODES": ([599], lambda s: RetryConfig.from_settings(s).http_codes == [599]),
    "RETRY_PRIORITY_ADJUST": (3, lambda s: RetryConfig.from_settings(s).priority_adjust == 3),
    "DUPEFILTER_DEBUG": (True, lambda s: FrontierConfig.from_settings(s).dupefilter_debug),
    "DOWNLOAD_SLOTS": (
        {"shop.example": {"concurrency": 2, "delay": 0.5}},
        lambda s: FrontierConfig.from_settings(s).site_caps()["shop.example"] == "2.0 2",
    ),
    "SCHEDULER_DUPEFILTER_CLASS": (
        "tests.test_compat.MyDupeFilter",
        lambda s: (
            type(_scheduler(SCHEDULER_DUPEFILTER_CLASS=MyDupeFilter)._dupefilters()[0])
            is MyDupeFilter
        ),
    ),
    "REDIS_ENCODING": (
        "latin-1",
        lambda s: _seed_decodes_as(REDIS_ENCODING="latin-1") == "http://shop.example/caf%C3%A9",
    ),
    "REDIS_ITEMS_KEY": ("%(spider)s:things", lambda s: True),  # scrapy-redis' RedisPipeline's
    "STATS_KEY": ("%(spider)s:counts", lambda s: True),  # its RedisStatsCollector's
}


@pytest.mark.parametrize("name", sorted(_HONOURED))
def test_a_setting_the_fleet_honours_changes_what_it_does(name: str) -> None:
    value, check = _HONOURED[name]
    assert check(_settings(**{name: value}))


def test_a_spiders_scrapy_redis_attributes_adjust_the_frontier() -> None:
    config = FrontierConfig.from_settings(_settings()).for_spider(_Idle())
    assert (config.keep_alive, config.idle_grace, config.seed_batch) == (False, 9.0, 2)
    assert FrontierConfig.from_settings(_settings()).for_spider(Spider("x")).idle_grace == 5.0


def test_redis_params_the_client_does_not_take_stop_the_node() -> None:
    with pytest.raises(FleetConfigError, match="REDIS_PARAMS"):
        _settings(REDIS_PARAMS={"no_such_option": 1})
    with pytest.raises(FleetConfigError, match="decode_responses"):
        _settings(REDIS_PARAMS={"decode_responses": True})


def test_redis_params_name_no_server_and_their_db_joins_the_url() -> None:
    with pytest.raises(FleetConfigError, match=r"REDIS_PARAMS\['host'\]"):
        _settings(REDIS_PARAMS={"host": "10.0.0.9"})
    with pytest.raises(FleetConfigError, match="put the database in"):
        _settings(REDIS_URL="redis://10.0.0.9:6379/0", REDIS_PARAMS={"db": 2})
    config = FrontierConfig.from_settings(_settings(REDIS_PARAMS={"db": 2, "password": "pw"}))
    assert (config.redis_url, config.redis_params) == (
        "redis://127.0.0.1:6379/2",
        {"password": "pw"},
    )


@pytest.mark.parametrize(
    ("slot", "url", "taken"),
    [
        ("book-shop", "http://127.0.0.1:8080/b", "book-shop"),
        ("Book-Shop", "http://127.0.0.1:8080/b", "book-shop"),
        ("127.0.0.1", "http://127.0.0.1:8080/b", None),  # Scrapy's own slot of the host
        ("x\ny", "http://127.0.0.1:8080/b", None),  # would break an in-flight member
        ("x" * 201, "http://127.0.0.1:8080/b", None),
        (7, "http://127.0.0.1:8080/b", None),
    ],
)
def test_a_download_slot_is_a_politeness_unit_only_when_it_is_the_spiders(
    slot: Any, url: str, taken: str | None
) -> None:
    from scrapy import Request

    scheduler = _scheduler()
    assert scheduler._slot_of(Request(url, meta={"download_slot": slot})) == taken
    redirected = Request(url, meta={"download_slot": "book-shop", "redirect_urls": ["http://a/"]})
    assert scheduler._slot_of(redirected) is None


# -- the fleet's own former names ---------------------------------------------------------------

#: A value other than the default for each renamed setting, as a project would set it.
_FORMER_VALUES: dict[str, Any] = {
    "FLEET_SITE_RATE": 2.5,
    "FLEET_SITE_CONCURRENCY": 7,
    "FLEET_SITE_LIMITS": {"shop.test": {"rate": 1, "concurrency": 2}},
    "FLEET_SITE_KEY": "ip",
    "FLEET_BURST_SECONDS": 0.5,
    "FLEET_AUTOTHROTTLE_ENABLED": True,
    "FLEET_AUTOTHROTTLE_TARGET_CONCURRENCY": 8.0,
    "FLEET_AUTOTHROTTLE_MIN_RATE": 0.25,
    "FLEET_AUTOTHROTTLE_START_RATE": 3.0,
    "FLEET_REVISIT": {"/category/": "1h"},
    "FLEET_REVISIT_ADAPTIVE": True,
    "FLEET_REVISIT_MIN": "2h",
    "FLEET_REVISIT_MAX": "3d",
    "ROBOTSTXT_CACHE_SECONDS": 60.0,
    "ROBOTSTXT_MAX_BYTES": 1000,
    "CRAWL_ID": "nightly-7",
}


def _field_of(name: str) -> tuple[type, str]:
    """The Config class and field that read setting *name*."""
    from project.config import setting_fields
    from project.frontier.config import SiteLimits
    from project.frontier.revisit import RevisitConfig
    from project.frontier.robots import RobotsConfig
    from project.storage.config import MongoConfig

    for cls in (SiteLimits, FrontierConfig, RevisitConfig, RobotsConfig, MongoConfig):
        for f, setting, _ in setting_fields(cls):
            if setting == name:
                return cls, f.name
    raise AssertionError(f"no Config reads {name}")


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "project.frontier.compat" and r.levelno == logging.WARNING
    ]


def test_every_former_name_has_a_value_here() -> None:
    assert set(_FORMER_VALUES) == set(RENAMED)


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_a_former_name_still_works_and_logs_one_deprecation_line(
    old: str, new: str, caplog: pytest.LogCaptureFixture
) -> None:
    cls, field = _field_of(new)
    settings = Settings({old: _FORMER_VALUES[old]})
    with caplog.at_level(logging.WARNING, logger="project.frontier.compat"):
        values = read_settings(cls, settings)
        read_settings(cls, settings)  # a node parses its Configs several times
    assert values[field] == _FORMER_VALUES[old]
    assert _deprecations(caplog) == [f"{old} is deprecated: it is now named {new} (rename it)"]


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_with_both_names_set_the_new_one_wins_and_the_log_says_so(
    old: str, new: str, caplog: pytest.LogCaptureFixture
) -> None:
    cls, field = _field_of(new)
    default = dict(read_settings(cls, Settings()))[field]
    settings = Settings({old: _FORMER_VALUES[old], new: default})
    with caplog.at_level(logging.WARNING, logger="project.frontier.compat"):
        values = read_settings(cls, settings)
    assert values[field] == default
    (line,) = _deprecations(caplog)
    assert line.startswith(f"{old} and {new} are both set: {new} wins")


def test_a_former_name_reaches_the_node_limits_the_addon_derives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="project.frontier.compat"):
        settings = _settings(FLEET_SITE_CONCURRENCY=100)
    assert settings.getint("CONCURRENT_REQUESTS") == 100
    assert FrontierConfig.from_settings(settings).limits.concurrency == 100
    line = "FLEET_SITE_CONCURRENCY is deprecated: it is now named FRONTIER_SITE_CONCURRENCY"
    assert _deprecations(caplog) == [f"{line} (rename it)"]


@pytest.mark.parametrize("name", sorted(RETIRED))
def test_a_retired_setting_is_ignored_saying_so_at_start(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="project.frontier.compat"):
        _settings(**{name: 1})
    (line,) = _deprecations(caplog)
    assert line == (
        f"{name} is no longer a setting and is ignored: the constant {RETIRED[name]} holds"
    )
