"""Old settings on the fleet: Scrapy's and scrapy-redis' knobs, and the fleet's own former names.

A project moved from stock scrapy-redis keeps its settings. Those the fleet
honours are read where they act (``docs/settings.md`` says where); those it
cannot honour stop the node before it starts, with the fleet's way named, so
none is silently dead. ``tests/test_compat.py`` walks scrapy-redis' defaults
module against :data:`SCRAPY_REDIS_SETTINGS`.

A project written for an older fleetcrawl keeps its settings too: a renamed
setting (:data:`RENAMED`) is still read under its old name, with one WARNING
naming the new one (:func:`setting_name`, which every Config's ``from_settings``
goes through), and a setting that became a constant (:data:`RETIRED`) is
reported at start instead of silently ignored.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

__all__ = [
    "REFUSED",
    "RENAMED",
    "RETIRED",
    "SCRAPY_REDIS_SETTINGS",
    "check_settings",
    "setting_name",
]

logger = logging.getLogger(__name__)

#: The fleet's own settings under their former names -> their names now. Every fleet
#: setting is named after the component that reads it (docs/settings.md, first lines):
#: the politeness and revisit knobs belong to the frontier, the robots.txt cache is the
#: frontier's (``ROBOTSTXT_*`` is Scrapy's), the crawl id is the crawl run's.
RENAMED: dict[str, str] = {
    "FLEET_SITE_RATE": "FRONTIER_SITE_RATE",
    "FLEET_SITE_CONCURRENCY": "FRONTIER_SITE_CONCURRENCY",
    "FLEET_SITE_LIMITS": "FRONTIER_SITE_LIMITS",
    "FLEET_SITE_KEY": "FRONTIER_SITE_KEY",
    "FLEET_BURST_SECONDS": "FRONTIER_BURST_SECONDS",
    "FLEET_AUTOTHROTTLE_ENABLED": "FRONTIER_AUTOTHROTTLE_ENABLED",
    "FLEET_AUTOTHROTTLE_TARGET_CONCURRENCY": "FRONTIER_AUTOTHROTTLE_TARGET_CONCURRENCY",
    "FLEET_AUTOTHROTTLE_MIN_RATE": "FRONTIER_AUTOTHROTTLE_MIN_RATE",
    "FLEET_AUTOTHROTTLE_START_RATE": "FRONTIER_AUTOTHROTTLE_START_RATE",
    "FLEET_REVISIT": "FRONTIER_REVISIT",
    "FLEET_REVISIT_ADAPTIVE": "FRONTIER_REVISIT_ADAPTIVE",
    "FLEET_REVISIT_MIN": "FRONTIER_REVISIT_MIN",
    "FLEET_REVISIT_MAX": "FRONTIER_REVISIT_MAX",
    "ROBOTSTXT_CACHE_SECONDS": "FRONTIER_ROBOTSTXT_CACHE_SECONDS",
    "ROBOTSTXT_MAX_BYTES": "FRONTIER_ROBOTSTXT_MAX_BYTES",
    "CRAWL_ID": "RUNS_CRAWL_ID",
}
_FORMER = {new: old for old, new in RENAMED.items()}

#: Former settings that are constants now (no deployment needed another value): what
#: holds instead. Set, they are ignored with one WARNING at start.
RETIRED: dict[str, str] = {
    "FRONTIER_IDLE_POLL_MAX": "project.frontier.config.IDLE_POLL_MAX",
    "FRONTIER_SEED_MAX_BYTES": "project.frontier.config.SEED_MAX_BYTES",
    "FLEET_SITE_IP_TTL": "project.frontier.config.SITE_IP_TTL",
    "ROBOTSTXT_LOCK_SECONDS": "project.frontier.robots.LOCK_SECONDS",
}

#: ``id(settings) ->`` the names whose deprecation line those settings logged: one line per
#: name and node (its Configs are parsed several times), forgotten with the settings (a
#: mapping is unhashable, so no WeakKeyDictionary).
_warned: dict[int, set[str]] = {}


def _warn_once(settings: BaseSettings, name: str, message: str, *args: Any) -> None:
    key = id(settings)
    if key not in _warned:
        _warned[key] = set()
        weakref.finalize(settings, _warned.pop, key, None)
    said = _warned[key]
    if name not in said:
        said.add(name)
        logger.warning(message, *args)


def setting_name(settings: BaseSettings, name: str) -> str:
    """The name to read setting *name* under: its former name when only that one is set.

    A former name in use logs one WARNING naming the new one; both set, the new name wins
    and the WARNING says so.
    """
    old = _FORMER.get(name)
    if old is None or settings.get(old) is None:
        return name
    if settings.get(name) is not None:
        _warn_once(
            settings,
            old,
            "%s and %s are both set: %s wins (%s is its deprecated former name; remove it)",
            old,
            name,
            name,
            old,
        )
        return name
    _warn_once(settings, old, "%s is deprecated: it is now named %s (rename it)", old, name)
    return old


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


def _is_fleet_scheduler(cls: Any) -> bool:
    # by name, not issubclass: importing the scheduler here would close a cycle (every
    # Config reads its settings through this module, the scheduler reads Configs)
    return isinstance(cls, type) and any(
        (base.__module__, base.__qualname__) == ("project.frontier.scheduler", "FleetScheduler")
        for base in cls.__mro__
    )


def check_settings(settings: BaseSettings) -> None:
    """Refuse what the fleet cannot honour (``NotConfigured``, naming the fleet's way)."""
    for name, instead in RETIRED.items():
        if settings.get(name) is not None:
            _warn_once(
                settings,
                name,
                "%s is no longer a setting and is ignored: the constant %s holds",
                name,
                instead,
            )
    for name, (refused, instead) in REFUSED.items():
        value = settings.get(name)
        if refused(value):
            raise NotConfigured(f"{name} = {value!r} cannot work on the fleet: {instead}")
    scheduler = settings.get("SCHEDULER")
    try:
        cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, ValueError, NameError, AttributeError) as exc:
        raise NotConfigured(f"SCHEDULER {scheduler!r} cannot be loaded: {exc}") from exc
    if not _is_fleet_scheduler(cls):
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
