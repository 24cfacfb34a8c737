"""One politeness knob: the fleet-wide site cap, never silently undercut by a node's own limits.

Scrapy's ``CONCURRENT_REQUESTS_PER_DOMAIN`` (8), ``CONCURRENT_REQUESTS_PER_IP``,
``DOWNLOAD_DELAY`` and AutoThrottle act per process: on a fleet they say nothing
about the site, only about one node. The fleet limits a site in Redis
(``FRONTIER_SITE_CONCURRENCY``, ``FRONTIER_SITE_RATE``, ``FRONTIER_SITE_LIMITS``). So the add-on
derives the node's own limits from the fleet's (:func:`derive`), and a node whose
project set them lower says so at start, with the numbers (:func:`unreachable`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scrapy.settings import default_settings

from project.config import read_field
from project.frontier.config import FrontierConfig, SiteLimits

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["MAX_DERIVED_CONCURRENCY", "derive", "fleet_cap", "unreachable"]

#: A node never derives more downloads at once than this from the fleet's caps.
MAX_DERIVED_CONCURRENCY = 256
_SCRAPY_CONCURRENCY: int = default_settings.CONCURRENT_REQUESTS


def _unset(settings: BaseSettings, name: str) -> bool:
    return (settings.getpriority(name) or 0) <= 0


def fleet_cap(settings: BaseSettings) -> int:
    """The largest fleet-wide concurrency of any one site (0: some site has none)."""
    caps = [read_field(SiteLimits, "concurrency", settings)]
    for name in ("site_limits", "download_slots"):
        specs = (read_field(FrontierConfig, name, settings) or {}).values()
        caps += [
            int(s["concurrency"] or 0) for s in specs if isinstance(s, dict) and "concurrency" in s
        ]
    return 0 if any(cap <= 0 for cap in caps) else max(caps)


def derive(settings: BaseSettings, priority: str) -> None:
    """The node's limits from the fleet's, where the project did not set them itself.

    ``CONCURRENT_REQUESTS``: enough for one node to reach the largest site cap (at least
    Scrapy's 16, at most :data:`MAX_DERIVED_CONCURRENCY`); ``CONCURRENT_REQUESTS_PER_DOMAIN``:
    the node's ``CONCURRENT_REQUESTS``, so only the fleet's cap limits a site.
    """
    cap = fleet_cap(settings)
    if _unset(settings, "CONCURRENT_REQUESTS"):
        wanted = min(MAX_DERIVED_CONCURRENCY, max(_SCRAPY_CONCURRENCY, cap))
        settings.set("CONCURRENT_REQUESTS", wanted, priority=priority)
    if _unset(settings, "CONCURRENT_REQUESTS_PER_DOMAIN"):
        settings.set(
            "CONCURRENT_REQUESTS_PER_DOMAIN",
            settings.getint("CONCURRENT_REQUESTS"),
            priority=priority,
        )


def unreachable(settings: BaseSettings, config: FrontierConfig) -> list[str]:
    """Why this node's own settings keep a site below the fleet's cap, one line each.

    A node's ``CONCURRENT_REQUESTS`` below the cap is how fleets work (more nodes reach
    it) and is not listed; per-site limits of the node are, with the nodes they would take.
    """
    cap = config.limits.concurrency
    lines = []
    node = settings.getint("CONCURRENT_REQUESTS")
    per_site = {
        "CONCURRENT_REQUESTS_PER_DOMAIN": settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        "CONCURRENT_REQUESTS_PER_IP": settings.getint("CONCURRENT_REQUESTS_PER_IP"),
    }
    for name, value in per_site.items():
        if value <= 0 or value >= min(node, cap or node):
            continue
        if cap:
            need = f"{math.ceil(cap / value)} such nodes reach FRONTIER_SITE_CONCURRENCY={cap}"
        else:
            need = "FRONTIER_SITE_CONCURRENCY=0 sets no fleet cap at all"
        lines.append(
            f"{name}={value} lets this node download only {value} request(s) of a site at"
            f" once ({need}); the fleet's cap limits the site for every node: drop {name}"
            " and set FRONTIER_SITE_CONCURRENCY (or FRONTIER_SITE_LIMITS per site) instead"
        )
    delay = settings.getfloat("DOWNLOAD_DELAY")
    if delay > 0:
        lines.append(
            f"DOWNLOAD_DELAY={delay:g} spaces this node's requests to a site by {delay:g}s"
            f" (at most {1 / delay:.3g} request(s)/s per site per node, and N nodes send N times"
            " that): drop it and set FRONTIER_SITE_RATE (requests/s for the whole fleet) instead"
        )
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        lines.append(
            "AUTOTHROTTLE_ENABLED throttles each node on its own: use FRONTIER_AUTOTHROTTLE_ENABLED,"
            " which adapts one rate per site for the fleet"
        )
    return lines
