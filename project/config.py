"""Settings of the shared frontier, parsed once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from project.queue import SiteLimits

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["FrontierConfig", "default_node_id"]


def default_node_id() -> str:
    """host:pid:random, unique per process and readable in status output."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


@dataclass(frozen=True)
class FrontierConfig:
    """Frontier settings; see the README's settings table."""

    node_id: str
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 15.0
    tick_seconds: float = 0.1
    prefetch: int = 4
    concurrency: int = 16
    batch_max: int = 500
    seed_batch: int = 4
    seed_max_bytes: int = 65536
    idle_grace: float = 5.0
    keep_alive: bool = False
    idle_poll_max: float = 1.0
    maintenance_seconds: float = 1.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    limits: SiteLimits = field(default_factory=SiteLimits)
    site_limits: tuple[tuple[str, float, int], ...] = ()
    site_key: str = "domain"

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        lease = settings.getfloat("FRONTIER_LEASE_SECONDS", cls.lease_seconds)
        heartbeat = settings.getfloat("FRONTIER_HEARTBEAT_SECONDS", 0.0) or lease / 4
        if heartbeat >= lease:
            raise NotConfigured(
                f"FRONTIER_HEARTBEAT_SECONDS ({heartbeat}) must be below"
                f" FRONTIER_LEASE_SECONDS ({lease}), or leases expire while held"
            )
        try:
            site_specs = settings.getdict("FLEET_SITE_LIMITS")
        except ValueError as exc:
            raise NotConfigured(f"FLEET_SITE_LIMITS must be a dict or JSON object: {exc}") from exc
        config = cls(
            node_id=settings.get("FRONTIER_NODE_ID") or default_node_id(),
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            tick_seconds=settings.getfloat("FRONTIER_TICK_SECONDS", cls.tick_seconds),
            prefetch=settings.getint("FRONTIER_PREFETCH", cls.prefetch),
            concurrency=settings.getint("CONCURRENT_REQUESTS", cls.concurrency),
            batch_max=settings.getint("FRONTIER_BATCH_MAX", cls.batch_max),
            seed_batch=settings.getint("FRONTIER_SEED_BATCH", cls.seed_batch),
            seed_max_bytes=settings.getint("FRONTIER_SEED_MAX_BYTES", cls.seed_max_bytes),
            idle_grace=settings.getfloat("FRONTIER_IDLE_GRACE", cls.idle_grace),
            keep_alive=settings.getbool("FRONTIER_KEEP_ALIVE", cls.keep_alive),
            idle_poll_max=settings.getfloat("FRONTIER_IDLE_POLL_MAX", cls.idle_poll_max),
            maintenance_seconds=settings.getfloat(
                "FRONTIER_MAINTENANCE_SECONDS", cls.maintenance_seconds
            ),
            redis_url=settings.get("REDIS_URL") or cls.redis_url,
            limits=SiteLimits(
                rate=settings.getfloat("FLEET_SITE_RATE", 0.0),
                concurrency=settings.getint("FLEET_SITE_CONCURRENCY", 0),
                burst_seconds=settings.getfloat("FLEET_BURST_SECONDS", 0.1),
                adaptive=settings.getbool("FLEET_AUTOTHROTTLE_ENABLED", False),
                target_concurrency=settings.getfloat("FLEET_AUTOTHROTTLE_TARGET_CONCURRENCY", 4.0),
                min_rate=settings.getfloat("FLEET_AUTOTHROTTLE_MIN_RATE", 0.5),
                start_rate=settings.getfloat("FLEET_AUTOTHROTTLE_START_RATE", 2.0),
            ),
            site_key=settings.get("FLEET_SITE_KEY", "domain"),
            site_limits=tuple(
                (site.lower(), float(spec.get("rate", 0)), int(spec.get("concurrency", 0)))
                for site, spec in site_specs.items()
            ),
        )
        if config.batch_max < 1 or config.batch_max > 2000:
            raise NotConfigured("FRONTIER_BATCH_MAX must be between 1 and 2000")
        if config.site_key not in {"domain", "ip"}:
            raise NotConfigured(f"FLEET_SITE_KEY must be 'domain' or 'ip', not {config.site_key!r}")
        if "\n" in config.node_id:
            raise NotConfigured("FRONTIER_NODE_ID must not contain a newline")
        return config
