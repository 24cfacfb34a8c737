"""Settings of the shared frontier, its politeness limits and its retries, parsed once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object

from project.config import read_settings, setting

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["FrontierConfig", "RetryConfig", "SiteLimits", "default_node_id"]

_RETRY_HTTP_CODES = [500, 502, 503, 504, 522, 524, 408, 429]


def default_node_id() -> str:
    """host:pid:random, unique per process and readable in status output."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


@dataclass(frozen=True)
class SiteLimits:
    """Fleet-wide politeness defaults of every site; per-site caps live in Redis."""

    rate: float = setting("FLEET_SITE_RATE", 0.0)
    concurrency: int = setting("FLEET_SITE_CONCURRENCY", 32)
    burst_seconds: float = setting("FLEET_BURST_SECONDS", 0.1)
    adaptive: bool = setting("FLEET_AUTOTHROTTLE_ENABLED", False)
    target_concurrency: float = setting("FLEET_AUTOTHROTTLE_TARGET_CONCURRENCY", 4.0)
    min_rate: float = setting("FLEET_AUTOTHROTTLE_MIN_RATE", 0.5)
    start_rate: float = setting("FLEET_AUTOTHROTTLE_START_RATE", 2.0)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        limits = cls(**read_settings(cls, settings))
        if limits.rate < 0 or limits.concurrency < 0:
            raise NotConfigured("FLEET_SITE_RATE and FLEET_SITE_CONCURRENCY must be >= 0")
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
    seed_max_bytes: int = setting("FRONTIER_SEED_MAX_BYTES", 65536)
    idle_grace: float = setting("FRONTIER_IDLE_GRACE", 5.0)
    keep_alive: bool = setting("FRONTIER_KEEP_ALIVE", False)
    idle_poll_max: float = setting("FRONTIER_IDLE_POLL_MAX", 1.0)
    maintenance_seconds: float = setting("FRONTIER_MAINTENANCE_SECONDS", 1.0)
    max_lease_seconds: float = setting("FRONTIER_MAX_LEASE_SECONDS", 600.0)
    max_deliveries: int = setting("FRONTIER_MAX_DELIVERIES", 3)
    #: How long a starting node waits for Redis before it gives up.
    connect_timeout: float = setting("FRONTIER_CONNECT_TIMEOUT", 20.0)
    redis_url: str = setting("REDIS_URL", "redis://127.0.0.1:6379/0")
    site_key: str = setting("FLEET_SITE_KEY", "domain")
    site_ip_ttl: float = setting("FLEET_SITE_IP_TTL", 300.0)
    #: "seeds": requests found on pages stay on the seeds' sites; "any": they may go anywhere
    #: public (a spider's allowed_domains, when it has them, decide instead).
    follow: str = setting("FRONTIER_FOLLOW", "seeds")
    allowed_sites: list[str] = setting("FRONTIER_ALLOWED_SITES", [])
    site_limits: dict[str, dict[str, float]] = setting("FLEET_SITE_LIMITS", {})
    #: Scrapy's CONCURRENT_REQUESTS: what the node downloads at once.
    concurrency: int = 16
    limits: SiteLimits = field(default_factory=SiteLimits)

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
            raise NotConfigured(f"FLEET_SITE_KEY must be 'domain' or 'ip', not {config.site_key!r}")
        if "\n" in config.node_id:
            raise NotConfigured("FRONTIER_NODE_ID must not contain a newline")
        for site, spec in config.site_limits.items():
            if not isinstance(spec, dict) or set(spec) - {"rate", "concurrency"}:
                raise NotConfigured(
                    f"FLEET_SITE_LIMITS[{site!r}] must be like {{'rate': 2, 'concurrency': 4}}"
                )
        return config

    def site_caps(self) -> dict[str, str]:
        """``site -> "rate concurrency"`` for the limits hash; ``*`` is this fleet's default."""
        caps = {"*": f"{self.limits.rate} {self.limits.concurrency}"}
        for site, spec in self.site_limits.items():
            caps[site.lower()] = f"{float(spec.get('rate', 0))} {int(spec.get('concurrency', 0))}"
        return caps


@dataclass(frozen=True)
class RetryConfig:
    """Retry settings of the frontier's retry middleware."""

    max_retries: int = setting("FRONTIER_RETRY_TIMES", 3)
    http_codes: list[int] = setting("FRONTIER_RETRY_HTTP_CODES", _RETRY_HTTP_CODES)
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
        try:
            values["http_codes"] = [int(code) for code in values["http_codes"]]
        except ValueError as exc:
            raise NotConfigured(f"FRONTIER_RETRY_HTTP_CODES must be status codes: {exc}") from exc
        return cls(**values)
