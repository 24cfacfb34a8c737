"""Every Redis key of one spider's crawl, built from the settings in one place.

Nodes, ``fleetcrawl status``, the dashboard and the admin commands all build
keys here, so a customised ``SCHEDULER_QUEUE_KEY``, ``SCHEDULER_DUPEFILTER_KEY``,
``REDIS_START_URLS_KEY`` or ``FRONTIER_KEY_PREFIX`` means the same keys to all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.spiderloader import get_spider_loader
from scrapy_redis import defaults

from project.config import read_settings, setting
from project.frontier import lua
from project.frontier.connection import list_setting
from project.frontier.spider_source import UNSURE, redis_key_in_source

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["FrontierKeys", "KeyTemplates", "hash_tag"]


def hash_tag(key: str) -> str | None:
    """The part of *key* Redis Cluster hashes, when it has one: ``{tag}`` rules."""
    open_ = key.find("{")
    close = key.find("}", open_ + 1) if open_ >= 0 else -1
    return key[open_ + 1 : close] if close > open_ + 1 else None


def _tagged(key: str, tag: str, spider: str) -> str:
    """*key* in the slot of *tag*: ``products:requests`` -> ``{products:start_urls}:requests``
    (the spider's name is in the tag already, so it is not repeated), ``{seeds}:products:requests``
    under another tag; a key with that tag stays as it is."""
    if hash_tag(key) == tag:
        return key
    if tag.startswith(f"{spider}:"):
        if key == spider:
            return f"{{{tag}}}"
        key = key.removeprefix(f"{spider}:")
    return f"{{{tag}}}:{key}"


@dataclass(frozen=True)
class KeyTemplates:
    """The key names' templates: scrapy-redis' three, and the prefix of the fleet's own keys."""

    queue: str = setting("SCHEDULER_QUEUE_KEY", defaults.SCHEDULER_QUEUE_KEY)
    dupefilter: str = setting("SCHEDULER_DUPEFILTER_KEY", defaults.SCHEDULER_DUPEFILTER_KEY)
    start_urls: str = setting("REDIS_START_URLS_KEY", defaults.START_URLS_KEY)
    prefix: str = setting("FRONTIER_KEY_PREFIX", "%(spider)s")
    #: Every key of a spider in the hash slot of its seeds' key (Redis Cluster); on by
    #: itself with REDIS_CLUSTER or REDIS_CLUSTER_NODES.
    tagged: bool = setting("FRONTIER_HASH_TAG", False, shown="on with a Redis Cluster")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(cls, settings)
        cluster = settings.getbool("REDIS_CLUSTER") or bool(
            list_setting(settings, "REDIS_CLUSTER_NODES")
        )
        if cluster:
            if settings.get("FRONTIER_HASH_TAG") is not None and not values["tagged"]:
                raise NotConfigured(
                    "FRONTIER_HASH_TAG = False cannot work on a Redis Cluster: a spider's"
                    " scripts touch all its keys at once, so they must share one hash slot"
                )
            values["tagged"] = True
        return cls(**values)


@dataclass(frozen=True)
class FrontierKeys:
    """Redis keys of one spider: scrapy-redis' names for the queue, seen-set and
    seeds, and ``<prefix>:<name>`` for everything else.

    A site's queue (:meth:`site_index`, :meth:`site_list`) is built from the queue key, so
    it shares the queue key's hash slot whenever that key carries a hash tag. Tagged
    (:attr:`KeyTemplates.tagged`, Redis Cluster), every key but the seeds' carries
    the seeds' key as its tag: ``products:start_urls`` keeps its name (``redis-cli -c
    lpush`` still seeds) and ``{products:start_urls}:requests`` hashes to its slot.
    """

    spider: str
    queue: str
    dupefilter: str
    start_urls: str
    inflight: str
    delayed: str
    dead: str
    seq: str
    throttled: str
    limits: str
    rates: str
    buckets: str
    active: str
    leases: str
    lat_sum: str
    lat_n: str
    queued: str
    robots: str
    nodes: str
    alive: str
    history: str
    history_leader: str
    layout: str
    deliveries: str
    allowed: str
    recent: str
    start: str
    capped: str
    holders: str
    revisit: str
    due: str
    runs: str
    #: Records waiting for MongoDB (project/storage/outbox.py), one list per database under it.
    outbox: str
    #: The fleet's sessions and the health of its (proxy, site) pairs (lua/step/sessions.lua).
    sessions: str
    proxies: str
    #: Which pages need a browser, by URL pattern (lua/step/render.lua).
    render: str
    templates: KeyTemplates = dataclasses.field(default=KeyTemplates(), repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider: str) -> Self:
        """The keys of *spider* under these settings."""
        return cls.for_spider(spider, KeyTemplates.from_settings(settings))

    @classmethod
    def for_spider(
        cls, spider: str, templates: KeyTemplates | None = None, start_urls: str | None = None
    ) -> Self:
        """The keys of *spider* (scrapy-redis' default names without *templates*); its seeds
        at *start_urls* when the spider names its own (``redis_key``)."""
        t = templates or KeyTemplates()
        try:
            prefix = t.prefix % {"spider": spider}
            queue = t.queue % {"spider": spider}
            dupefilter = t.dupefilter % {"spider": spider}
            start_urls = start_urls or t.start_urls % {"name": spider}
        except (KeyError, TypeError, ValueError) as exc:
            raise NotConfigured(
                "SCHEDULER_QUEUE_KEY, SCHEDULER_DUPEFILTER_KEY and FRONTIER_KEY_PREFIX may use"
                f" %(spider)s, REDIS_START_URLS_KEY %(name)s; nothing else ({exc!r})"
            ) from exc
        if t.tagged:
            tag = hash_tag(start_urls) or start_urls
            if "}" in tag:
                raise NotConfigured(
                    f"the seeds' key {start_urls!r} has a '}}' but no hash tag: with a Redis"
                    " Cluster the other keys cannot share its slot; rename it"
                )
            prefix, queue, dupefilter = (
                _tagged(key, tag, spider) for key in (prefix, queue, dupefilter)
            )
        own = {
            name: f"{prefix}:{name}"
            for name in (
                "inflight", "delayed", "dead", "seq", "throttled", "limits", "rates", "buckets",
                "active", "leases", "lat_sum", "lat_n", "queued", "robots", "nodes", "alive",
                "history", "layout", "deliveries", "allowed", "recent", "start", "capped",
                "holders", "revisit", "due", "runs", "outbox", "sessions", "proxies", "render",
            )
        }  # fmt: skip
        return cls(
            spider=spider,
            queue=queue,
            dupefilter=dupefilter,
            start_urls=start_urls,
            history_leader=f"{prefix}:history:leader",
            templates=t,
            **own,
        )

    def with_start_urls(self, start_urls: str) -> Self:
        """These keys with the seeds at *start_urls* (a spider's ``redis_key``); tagged, every
        other key follows it into its slot."""
        if start_urls == self.start_urls:
            return self
        if self.templates.tagged:
            return self.for_spider(self.spider, self.templates, start_urls)
        return dataclasses.replace(self, start_urls=start_urls)

    @classmethod
    def for_project_spider(cls, settings: BaseSettings, spider: str) -> Self:
        """The keys of *spider* as its nodes use them (``fleetcrawl status``, the dashboard):
        with its class's ``redis_key``, when the project has that spider and it names one."""
        keys = cls.from_settings(settings, spider)
        # read from the source when it tells: Scrapy's loader imports every spider module
        redis_key = redis_key_in_source(settings.getlist("SPIDER_MODULES"), spider)
        if redis_key == UNSURE:
            try:
                spidercls = get_spider_loader(settings).load(spider)
            except (KeyError, ImportError, ValueError, TypeError):
                return keys  # not a spider of this project (a reader of another project's)
            redis_key = getattr(spidercls, "redis_key", None)
        if not isinstance(redis_key, str) or not redis_key.strip():
            return keys
        try:
            start_urls = redis_key % {"name": spider}
        except (KeyError, TypeError, ValueError):
            start_urls = redis_key
        return keys.with_start_urls(start_urls)

    def site_index(self, site: str) -> str:
        """The sorted set of *site*'s priorities with requests queued, each scored by its
        band (``index_key`` in lib/site_queues.lua)."""
        return f"{self.queue}|i|{site}"

    def site_list(self, site: str, priority: str) -> str:
        """The list of *site*'s queued requests of *priority* (a member of :meth:`site_index`;
        ``list_key`` in lib/site_queues.lua)."""
        return f"{self.queue}|p{priority}|{site}"

    @property
    def site_counts(self) -> str:
        """The hash of requests each site has had queued (``sq.COUNTS`` in lib/site_queues.lua);
        less :attr:`leases`, its requests queued now."""
        return f"{self.queue}|n"

    @property
    def revisit_sites(self) -> str:
        """The hash of revisit records each site has (``SITES`` in lua/step/revisit.lua)."""
        return f"{self.revisit}:sites"

    @property
    def revisit_missed(self) -> str:
        """The hash of runs each revisit record went unrediscovered (``MISSED`` there)."""
        return f"{self.revisit}:missed"

    def older_site_queue(self, site: str) -> str:
        """The sorted set that held *site*'s requests before the priority lists, drained but
        never written (``site_key`` in lib/site_queues.lua)."""
        return f"{self.queue}:{site}"

    def permits_of(self, node: str) -> str:
        """The hash of the download permits *node* holds (``holder_key`` in lib/permits.lua)."""
        return f"{self.active}:{node}"

    def robots_lock(self, netloc: str) -> str:
        """The lock one node holds while it fetches *netloc*'s robots.txt for the fleet."""
        return f"{self.robots}:lock:{netloc}"

    def frontier(self) -> list[str]:
        """The keys of the queue itself: what the step script touches, site queues aside."""
        return lua.load("step").keys_from(self)
