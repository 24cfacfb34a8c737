"""Scrapy's and scrapy-redis' scheduling knobs on the fleet: each honoured, or refused at start.

A project moved from stock scrapy-redis keeps its settings. Those the fleet
honours are read where they act (``docs/settings.md`` says where); those it
cannot honour stop the node before it starts, with the fleet's way named, so
none is silently dead. ``tests/test_compat.py`` walks scrapy-redis' defaults
module against :data:`SCRAPY_REDIS_SETTINGS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

__all__ = ["REFUSED", "SCRAPY_REDIS_SETTINGS", "check_settings"]

#: scrapy_redis.defaults' names -> the setting each is the default of, and what the fleet
#: does with that setting (None: a constant no setting reads).
SCRAPY_REDIS_SETTINGS: dict[str, tuple[str | None, str]] = {
    "DUPEFILTER_KEY": ("DUPEFILTER_KEY", "refused: SCHEDULER_DUPEFILTER_KEY names the seen-set"),
    "PIPELINE_KEY": ("REDIS_ITEMS_KEY", "honoured by scrapy_redis.pipelines.RedisPipeline"),
    "STATS_KEY": ("STATS_KEY", "honoured by scrapy_redis.stats.RedisStatsCollector"),
    "REDIS_CLS": ("REDIS_CLS", "refused: the frontier uses redis.asyncio"),
    "REDIS_ENCODING": ("REDIS_ENCODING", "honoured: decodes seeds"),
    "REDIS_PARAMS": ("REDIS_PARAMS", "honoured: the Redis client's keyword arguments"),
    "REDIS_CONCURRENT_REQUESTS": (None, "a fallback of CONCURRENT_REQUESTS, not a setting"),
    "SCHEDULER_QUEUE_KEY": ("SCHEDULER_QUEUE_KEY", "honoured: the queue's key"),
    "SCHEDULER_QUEUE_CLASS": ("SCHEDULER_QUEUE_CLASS", "PriorityQueue honoured, others refused"),
    "SCHEDULER_DUPEFILTER_KEY": ("SCHEDULER_DUPEFILTER_KEY", "honoured: the seen-set's key"),
    "SCHEDULER_DUPEFILTER_CLASS": ("SCHEDULER_DUPEFILTER_CLASS", "honoured as DUPEFILTER_CLASS"),
    "SCHEDULER_PERSIST": ("SCHEDULER_PERSIST", "honoured: False deletes a finished crawl"),
    "START_URLS_KEY": ("REDIS_START_URLS_KEY", "honoured: where seeds are pushed"),
    "START_URLS_AS_SET": ("REDIS_START_URLS_AS_SET", "honoured: seeds from a set"),
    "START_URLS_AS_ZSET": ("REDIS_START_URLS_AS_ZSET", "refused: JSON seeds carry a priority"),
    "MAX_IDLE_TIME": ("MAX_IDLE_TIME_BEFORE_CLOSE", "honoured: 0 keeps alive, N idle seconds"),
}


def _set(value: Any) -> bool:
    return value is not None and value is not False and value != "" and value != 0


def _not_priority_queue(value: Any) -> bool:
    if value is None:
        return False
    try:
        cls = load_object(value) if isinstance(value, str) else value
    except (ImportError, ValueError, NameError, AttributeError):
        return True
    return getattr(cls, "__module__", "") + "." + getattr(cls, "__name__", "") != (
        "scrapy_redis.queue.PriorityQueue"
    )


#: Settings the fleet refuses: (when a value is refused, the fleet's way instead).
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "SCHEDULER_QUEUE_CLASS": (
        _not_priority_queue,
        (
            "the fleet's queue is ordered by request priority, then first in first out: give"
            " requests a priority (Request(priority=...)) instead of another queue class"
        ),
    ),
    "SCHEDULER_SERIALIZER": (
        _set,
        "requests travel through Redis as JSON (project.frontier.wire), never pickle",
    ),
    "SCHEDULER_FLUSH_ON_START": (
        _set,
        (
            "a starting node would delete the other nodes' crawl: run `fleetcrawl clear <spider>`"
            " before the crawl instead"
        ),
    ),
    "SCHEDULER_IDLE_BEFORE_CLOSE": (
        _set,
        (
            "the fleet closes the moment nothing is left; FRONTIER_IDLE_GRACE (or"
            " MAX_IDLE_TIME_BEFORE_CLOSE) is how long a node waits for a crawl to begin"
        ),
    ),
    "REDIS_START_URLS_AS_ZSET": (
        _set,
        'push JSON seeds with a priority to the list: {"url": ..., "priority": 10}',
    ),
    "REDIS_CLS": (_set, "the frontier uses redis.asyncio; put client options in REDIS_PARAMS"),
    "REDIS_DECODE_RESPONSES": (_set, "the frontier reads Redis' replies as bytes"),
    "DUPEFILTER_KEY": (
        _set,
        "the fleet's seen-set is named by SCHEDULER_DUPEFILTER_KEY (%(spider)s:dupefilter)",
    ),
}

#: Scrapy's own scheduler settings, which the fleet's Redis queue replaces.
_SCRAPY_SCHEDULER = (
    "SCHEDULER_PRIORITY_QUEUE",
    "SCHEDULER_MEMORY_QUEUE",
    "SCHEDULER_DISK_QUEUE",
    "SCHEDULER_START_MEMORY_QUEUE",
    "SCHEDULER_START_DISK_QUEUE",
)


def check_settings(settings: BaseSettings) -> None:
    """Refuse what the fleet cannot honour (``NotConfigured``, naming the fleet's way)."""
    for name, (refused, instead) in REFUSED.items():
        value = settings.get(name)
        if refused(value):
            raise NotConfigured(f"{name} = {value!r} cannot work on the fleet: {instead}")
    scheduler = settings.get("SCHEDULER")
    try:
        cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, ValueError, NameError, AttributeError) as exc:
        raise NotConfigured(f"SCHEDULER {scheduler!r} cannot be loaded: {exc}") from exc
    from project.frontier.scheduler import FleetScheduler

    if not (isinstance(cls, type) and issubclass(cls, FleetScheduler)):
        raise NotConfigured(
            f"SCHEDULER = {scheduler!r} is not the fleet's: with FleetAddon the frontier"
            " schedules (project.frontier.scheduler.FleetScheduler); remove SCHEDULER from"
            " the project's settings"
        )
    default = SETTINGS_PRIORITIES["default"]
    for name in _SCRAPY_SCHEDULER:
        if (settings.getpriority(name) or 0) > default:
            raise NotConfigured(
                f"{name} is for Scrapy's own scheduler: the fleet's queue lives in Redis"
                " (FRONTIER_* settings, docs/settings.md)"
            )
    if settings.get("REDIS_DB") is not None and settings.get("REDIS_URL") is not None:
        raise NotConfigured(
            "REDIS_DB and REDIS_URL are both set: put the database in REDIS_URL"
            " (redis://host:6379/N)"
        )
