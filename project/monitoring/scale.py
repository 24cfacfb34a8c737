"""How many nodes are useful now, read from the frontier.

A node is useful while it has downloads to run: the fleet can run, at once, what the sites
with work let it (each site's fleet-wide cap, its rate times its latency by Little's law, no
more than its work), and a node runs ``CONCURRENT_REQUESTS`` of them. Work that waits (a
site paused by a block or a Retry-After, retries not due yet) asks for no node, nor does a
site whose cap the nodes already fill. Shown as ``fleetcrawl_useful_nodes`` in ``/metrics``,
``scale`` in ``fleetcrawl status --json``, and ``/api/v1/scale`` (KEDA's metrics-api trigger).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DEFAULT_LATENCY", "DEFAULT_NODE_SLOTS", "SiteSlots", "scale_view"]

#: Seconds a download is taken to last at a site whose latency is not measured yet.
DEFAULT_LATENCY = 1.0
#: Downloads a node runs at once when no node says (Scrapy's CONCURRENT_REQUESTS default).
DEFAULT_NODE_SLOTS = 16


@dataclass
class SiteSlots:
    """What the fleet can run at once at the sites with work, summed as they are read."""

    slots: int = 0
    sites: int = 0
    #: sites whose cap (concurrency or rate) is what bounds them, not their work
    capped: int = 0
    paused: int = 0
    #: sites with work past those status reads (SITES_SCANNED), not counted
    beyond: int = 0

    def add(
        self, work: int, concurrency: int, rate: float, latency: float | None, paused: bool
    ) -> None:
        """A site with *work* requests queued or leased, its fleet-wide *concurrency* (0: no
        cap) and *rate* (requests a second, 0: none), its mean download *latency*."""
        if work <= 0:
            return
        if paused:
            self.paused += 1
            return
        usable = work
        if concurrency > 0:
            usable = min(usable, concurrency)
        if rate > 0:
            usable = min(usable, max(1, math.ceil(rate * (latency or DEFAULT_LATENCY))))
        self.sites += 1
        self.capped += usable < work
        self.slots += usable


def scale_view(
    site_slots: SiteSlots, nodes: Sequence[dict[str, Any]], seeds_waiting: int
) -> dict[str, Any]:
    """The ``scale`` of status: useful nodes, and what they were computed from."""
    alive = [n for n in nodes if n.get("state") == "alive"]
    reported = [int(n["concurrency"]) for n in alive if n.get("concurrency")]
    per_node = int(statistics.median(reported)) if reported else DEFAULT_NODE_SLOTS
    useful = math.ceil(site_slots.slots / per_node) if site_slots.slots else 0
    if not useful and seeds_waiting:
        useful = 1  # someone has to turn the seeds into work
    return {
        "useful_nodes": useful,
        "usable_slots": site_slots.slots,
        "node_slots": per_node,
        "sites_with_work": site_slots.sites,
        "sites_capped": site_slots.capped,
        "sites_paused": site_slots.paused,
        "sites_not_read": site_slots.beyond,
        "nodes_alive": len(alive),
    }
