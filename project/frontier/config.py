"""Settings of the shared frontier, its politeness limits and its retries, parsed once."""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from scrapy.exceptions import NotConfigured
from scrapy.settings import default_settings
from scrapy.utils.misc import load_object

from project.config import read_settings, setting
from project.frontier.connection import RedisTarget

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_REDIS_URL",
    "FLEET_RETRY_TIMES",
    "IDLE_POLL_MAX",
    "SEED_MAX_BYTES",
    "SITE_IP_TTL",
    "FrontierConfig",
    "RetryConfig",
    "SiteLimits",
    "default_node_id",
]

_RETRY_HTTP_CODES = [500, 502, 503, 504, 522, 524, 408, 429]

#: REDIS_URL's default: the one place it is written (the monitor and readers import it).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: RETRY_TIMES on the fleet, one more than Scrapy's 2: a retry waits in Redis, not in a node
#: (the add-on writes it into the settings unless the project sets RETRY_TIMES).
FLEET_RETRY_TIMES = 3

# Former settings, constants now (project.frontier.compat.RETIRED): no deployment set them.
#: Longest wait between two polls of an idle node (it backs off up to this), in seconds.
IDLE_POLL_MAX = 0.5
#: A larger seed is dead-lettered unread: what one entry of the seeds' key may cost.
SEED_MAX_BYTES = 65536
#: With FRONTIER_SITE_KEY = "ip", seconds a node keeps a host name's address.
SITE_IP_TTL = 300.0


def default_node_id() -> str:
    """host:pid:random, unique per process and readable in status output."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


@dataclass(frozen=True)
class SiteLimits:
    """Fleet-wide politeness defaults of every site; per-site caps live in Redis."""

    rate: float = setting("FRONTIER_SITE_RATE", 0.0)
    concurrency: int = setting("FRONTIER_SITE_CONCURRENCY", 32)
    burst_seconds: float = setting("FRONTIER_BURST_SECONDS", 0.1)
    adaptive: bool = setting("FRONTIER_AUTOTHROTTLE_ENABLED", False)
    target_concurrency: float = setting("FRONTIER_AUTOTHROTTLE_TARGET_CONCURRENCY", 4.0)
    min_rate: float = setting("FRONTIER_AUTOTHROTTLE_MIN_RATE", 0.5)
    start_rate: float = setting("FRONTIER_AUTOTHROTTLE_START_RATE", 2.0)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        limits = cls(**read_settings(cls, settings))
        if limits.rate < 0 or limits.concurrency < 0:
            raise NotConfigured("FRONTIER_SITE_RATE and FRONTIER_SITE_CONCURRENCY must be >= 0")
        return limits


@dataclass(frozen=True)
class FrontierConfig:
    """Frontier settings; docs/settings.md explains each."""

    node_id: str = setting("FRONTIER_NODE_ID", "", shown="host:pid:random")
    lease_seconds: float = setting("FRONTIER_LEASE_SECONDS", 60.0)
    # 0: a quarter of the lease
    heartbeat_seconds: float = setting("FRONTIER_HEARTBEAT_SECONDS", 0.0)
    tick_seconds: float = setting("FRONTIER_TICK_SECONDS", 0.1)
    prefetch: int = setting("FRONTIER_PREFETCH", 4)
    batch_max: int = setting("FRONTIER_BATCH_MAX", 500)
    seed_batch: int = setting("FRONTIER_SEED_BATCH", 4)
    seed_max_bytes: int = SEED_MAX_BYTES
    idle_grace: float = setting("FRONTIER_IDLE_GRACE", 5.0)
    keep_alive: bool = setting("FRONTIER_KEEP_ALIVE", False)
    idle_poll_max: float = IDLE_POLL_MAX
    maintenance_seconds: float = setting("FRONTIER_MAINTENANCE_SECONDS", 1.0)
    max_lease_seconds: float = setting("FRONTIER_MAX_LEASE_SECONDS", 600.0)
    max_deliveries: int = setting("FRONTIER_MAX_DELIVERIES", 3)
    #: How long a starting node waits for Redis before it gives up.
    connect_timeout: float = setting("FRONTIER_CONNECT_TIMEOUT", 20.0)
    redis_url: str = setting("REDIS_URL", DEFAULT_REDIS_URL)
    #: scrapy-redis' way to name the server, used when REDIS_URL is not set.
    redis_host: str = setting("REDIS_HOST", "", shown="unset (REDIS_URL)")
    redis_port: int = setting("REDIS_PORT", 0, shown="unset (REDIS_URL)")
    redis_db: int = setting("REDIS_DB", 0, shown="unset (REDIS_URL)")
    #: Keyword arguments of the Redis client (password, db, socket timeouts, ssl, ...).
    redis_params: dict[str, Any] = setting("REDIS_PARAMS", {})
    #: Seeds are pushed to a set (``redis-cli sadd``), not a list. The step reads the key as
    #: what it is either way; this says so at start.
    seeds_as_set: bool = setting("REDIS_START_URLS_AS_SET", False)
    #: False: when the fleet's crawl finished, its queue and seen-set are deleted.
    persist: bool = setting("SCHEDULER_PERSIST", True)
    #: scrapy-redis' idle close: 0 keeps the fleet up (FRONTIER_KEEP_ALIVE), N closes after N
    #: idle seconds (FRONTIER_IDLE_GRACE); also a spider's ``max_idle_time`` attribute.
    max_idle_time: int = setting("MAX_IDLE_TIME_BEFORE_CLOSE", -1, shown="unset")
    #: Scrapy's: log every request the seen-set filters, not only the first.
    dupefilter_debug: bool = setting("DUPEFILTER_DEBUG", False)
    site_key: str = setting("FRONTIER_SITE_KEY", "domain")
    site_ip_ttl: float = SITE_IP_TTL
    #: "seeds": requests found on pages stay on the seeds' sites; "any": they may go anywhere
    #: public (a spider's allowed_domains, when it has them, decide instead).
    follow: str = setting("FRONTIER_FOLLOW", "seeds")
    allowed_sites: list[str] = setting("FRONTIER_ALLOWED_SITES", [])
    site_limits: dict[str, dict[str, float]] = setting("FRONTIER_SITE_LIMITS", {})
    #: Scrapy's per-slot concurrency and delay: fleet-wide caps of those sites too.
    download_slots: dict[str, dict[str, Any]] = setting("DOWNLOAD_SLOTS", {})
    #: Scrapy's CONCURRENT_REQUESTS: what the node downloads at once.
    concurrency: int = default_settings.CONCURRENT_REQUESTS
    limits: SiteLimits = field(default_factory=SiteLimits)
    #: One server, a Redis Cluster or Sentinel's master (REDIS_CLUSTER*, REDIS_SENTINEL*).
    target: RedisTarget = field(default_factory=lambda: RedisTarget(DEFAULT_REDIS_URL))

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(
            cls,
            settings,
            concurrency=settings.getint("CONCURRENT_REQUESTS"),
            limits=SiteLimits.from_settings(settings),
        )
        values["node_id"] = values["node_id"] or default_node_id()
        values["heartbeat_seconds"] = values["heartbeat_seconds"] or values["lease_seconds"] / 4
        params = dict(values["redis_params"])
        for name in ("host", "port"):
            if name in params:
                raise NotConfigured(
                    f"REDIS_PARAMS[{name!r}]: name the server with REDIS_URL (or REDIS_HOST and"
                    " REDIS_PORT)"
                )
        if "db" in params:
            if settings.get("REDIS_URL") is not None:
                raise NotConfigured(
                    "REDIS_PARAMS['db'] and REDIS_URL are both set: put the database in"
                    " REDIS_URL (redis://host:6379/N)"
                )
            values["redis_db"] = int(params.pop("db"))
        values["redis_params"] = params
        if settings.get("REDIS_URL") is None and (
            values["redis_db"] != 0
            or any(settings.get(name) is not None for name in ("REDIS_HOST", "REDIS_PORT"))
        ):
            host, port = values["redis_host"] or "127.0.0.1", values["redis_port"] or 6379
            host = f"[{host}]" if ":" in host else host
            values["redis_url"] = f"redis://{host}:{port}/{values['redis_db']}"
        values["redis_params"] = _redis_params(values["redis_url"], values["redis_params"])
        values["target"] = RedisTarget.from_settings(
            settings, values["redis_url"], values["redis_params"]
        )
        config = cls(**values)
        if config.heartbeat_seconds >= config.lease_seconds:
            raise NotConfigured(
                f"FRONTIER_HEARTBEAT_SECONDS ({config.heartbeat_seconds}) must be below"
                f" FRONTIER_LEASE_SECONDS ({config.lease_seconds}), or leases expire while held"
            )
        if not config.max_lease_seconds > 0 or config.max_deliveries < 1:
            raise NotConfigured(
                "FRONTIER_MAX_LEASE_SECONDS must be > 0 and FRONTIER_MAX_DELIVERIES at least 1"
            )
        if config.batch_max < 1 or config.batch_max > 2000:
            raise NotConfigured("FRONTIER_BATCH_MAX must be between 1 and 2000")
        if config.follow not in {"seeds", "any"}:
            raise NotConfigured(f"FRONTIER_FOLLOW must be 'seeds' or 'any', not {config.follow!r}")
        if config.site_key not in {"domain", "ip"}:
            raise NotConfigured(
                f"FRONTIER_SITE_KEY must be 'domain' or 'ip', not {config.site_key!r}"
            )
        if "\n" in config.node_id:
            raise NotConfigured("FRONTIER_NODE_ID must not contain a newline")
        for slot, spec in config.download_slots.items():
            try:
                float(spec.get("delay", 0) or 0), int(spec.get("concurrency", 1))
            except (AttributeError, TypeError, ValueError) as exc:
                raise NotConfigured(
                    f"DOWNLOAD_SLOTS[{slot!r}] must be like {{'concurrency': 2, 'delay': 0.5}}"
                ) from exc
        for site, spec in config.site_limits.items():
            if not isinstance(spec, dict) or set(spec) - {"rate", "concurrency"}:
                raise NotConfigured(
                    f"FRONTIER_SITE_LIMITS[{site!r}] must be like {{'rate': 2, 'concurrency': 4}}"
                )
        return config

    def client(self, **defaults: Any) -> redis.asyncio.Redis:
        """A client of the fleet's Redis (no I/O until used): *defaults*, then REDIS_PARAMS."""
        return self.target.client(**defaults)

    def sync_client(self, **defaults: Any) -> redis.Redis:
        """A blocking client of the fleet's Redis, for the commands and the dashboard."""
        return self.target.sync_client(**defaults)

    @property
    def redis_name(self) -> str:
        """The fleet's Redis for log lines, password masked."""
        return self.target.describe()

    def for_spider(self, spider: Spider) -> Self:
        """The settings as *spider* adjusts them: scrapy-redis' ``max_idle_time`` and
        ``redis_batch_size`` attributes, when its class sets them."""
        values: dict[str, Any] = {}
        idle = getattr(type(spider), "max_idle_time", None)
        if idle is None and self.max_idle_time >= 0:
            idle = self.max_idle_time
        if idle is not None:
            seconds = int(idle)
            values = {"keep_alive": True} if seconds == 0 else {"idle_grace": float(seconds)}
        batch = getattr(type(spider), "redis_batch_size", None)
        if batch is not None:
            values["seed_batch"] = max(1, int(batch))
        return dataclasses.replace(self, **values) if values else self

    def site_caps(self) -> dict[str, str]:
        """``site -> "rate concurrency"`` for the limits hash; ``*`` is this fleet's default."""
        caps = {"*": f"{self.limits.rate} {self.limits.concurrency}"}
        for slot, spec in self.download_slots.items():
            delay = float(spec.get("delay", 0) or 0)
            concurrency = int(spec.get("concurrency", self.limits.concurrency))
            caps[slot.lower()] = f"{1 / delay if delay > 0 else 0.0} {concurrency}"
        for site, spec in self.site_limits.items():
            caps[site.lower()] = f"{float(spec.get('rate', 0))} {int(spec.get('concurrency', 0))}"
        return caps


#: REDIS_PARAMS the frontier cannot work with: it reads replies as bytes, with redis.asyncio.
_REFUSED_PARAMS = {
    "decode_responses": "the frontier reads replies as bytes",
    "redis_cls": "the frontier uses redis.asyncio",
    "connection_pool": "a pool cannot be given in settings",
}


def _redis_params(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """REDIS_PARAMS, checked by building (not connecting) a client with them."""
    refused = sorted(set(params) & set(_REFUSED_PARAMS))
    if refused:
        raise NotConfigured(
            f"REDIS_PARAMS[{refused[0]!r}] cannot be used: {_REFUSED_PARAMS[refused[0]]}"
        )
    # scrapy-redis' own defaults, which redis-py does anyway (encodes text as UTF-8, retries
    # on timeouts) and since 6.0 warns about
    params = {
        k: v
        for k, v in params.items()
        if (k, v) not in (("encoding", "utf-8"), ("retry_on_timeout", True))
    }
    if not params or not url.startswith(("redis://", "rediss://", "unix://")):
        return params  # a URL that is not one is refused where it is used, saying so
    try:
        # a connection object, never connected: its constructor checks every keyword
        redis.asyncio.ConnectionPool.from_url(url, **params).make_connection()  # type: ignore[no-untyped-call]
    except (TypeError, ValueError) as exc:
        raise NotConfigured(f"REDIS_PARAMS {sorted(params)} do not fit the client: {exc}") from exc
    return params


@dataclass(frozen=True)
class RetryConfig:
    """Retry settings of the frontier's retry middleware."""

    #: Scrapy's retry settings; the add-on writes FLEET_RETRY_TIMES unless the project sets it.
    enabled: bool = setting("RETRY_ENABLED", True)
    max_retries: int = setting("RETRY_TIMES", FLEET_RETRY_TIMES)
    http_codes: list[int] = setting("RETRY_HTTP_CODES", _RETRY_HTTP_CODES)
    priority_adjust: int = setting("RETRY_PRIORITY_ADJUST", -1)
    backoff_base: float = setting("FRONTIER_RETRY_BACKOFF_BASE", 1.0)
    backoff_max: float = setting("FRONTIER_RETRY_BACKOFF_MAX", 60.0)
    #: A Retry-After pauses its site fleet-wide for at most this long.
    retry_after_max_pause: float = setting("FRONTIER_RETRY_AFTER_MAX_PAUSE", 60.0)
    #: A request told to wait longer than this is dead-lettered at once.
    retry_after_max_wait: float = setting("FRONTIER_RETRY_AFTER_MAX_WAIT", 3600.0)
    #: Scrapy's RETRY_EXCEPTIONS, loaded.
    exceptions: tuple[type[BaseException], ...] = ()

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(
            cls,
            settings,
            exceptions=tuple(
                load_object(e) if isinstance(e, str) else e
                for e in settings.getlist("RETRY_EXCEPTIONS")
            ),
        )
        for old, new in (("FRONTIER_RETRY_TIMES", "RETRY_TIMES"),
                         ("FRONTIER_RETRY_HTTP_CODES", "RETRY_HTTP_CODES")):  # fmt: skip
            if settings.get(old) is not None:
                raise NotConfigured(f"{old} is now Scrapy's own {new}: set {new} instead")
        try:
            values["http_codes"] = [int(code) for code in values["http_codes"]]
        except ValueError as exc:
            raise NotConfigured(f"RETRY_HTTP_CODES must be status codes: {exc}") from exc
        if not values["enabled"]:
            values["max_retries"] = 0  # a failure is a dead letter at once, never lost
        return cls(**values)
