"""The fleet's figures for Prometheus, written by prometheus-client in text format 0.0.4."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = ["CONTENT_TYPE", "render_metrics"]

#: What ``/metrics`` answers with: the text format prometheus-client writes by default.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StatusCollector(Collector):
    """One :func:`project.monitoring.status.fleet_status` result as metric families."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        status = self.status
        spider = {"spider": str(status["spider"])}
        nodes = status["nodes"]

        def family(
            name: str, kind: str, text: str, samples: Iterable[tuple[dict[str, Any], float]]
        ) -> Metric:
            rows = [({**spider, **labels}, float(value)) for labels, value in samples]
            names = list(rows[0][0]) if rows else ["spider"]
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            metric: CounterMetricFamily | GaugeMetricFamily = cls(
                f"fleetcrawl_{name}", text, labels=names
            )
            for labels, value in rows:
                metric.add_metric([str(labels[n]) for n in names], value)
            return metric

        def gauge(name: str, text: str, value: float) -> Metric:
            return family(name, "gauge", text, [({}, value)])

        def per_node(name: str, kind: str, text: str, key: str, scale: float = 1.0) -> Metric:
            return family(
                name, kind, text, [({"node": n["id"]}, n.get(key, 0) * scale) for n in nodes]
            )

        yield gauge("queue_depth", "Requests waiting in the shared queue.", status["queued"])
        yield family(
            "queue_depth_by_priority",
            "gauge",
            "Requests waiting in the queues of the sites status lists, by priority.",
            [({"priority": p}, n) for p, n in status["queued_by_priority"].items()],
        )
        yield gauge(
            "delayed_retries", "Requests waiting for their retry time.", status["delayed_retries"]
        )
        yield gauge("in_flight", "Requests leased by nodes.", status["in_flight"])
        yield gauge("seeds_waiting", "Seeds not yet taken by a node.", status["seeds_waiting"])
        yield gauge("seen_urls", "Fingerprints in the seen-set.", status["seen"])
        yield gauge("seen_bytes", "Memory of the seen-set in Redis.", status["seen_bytes"])
        yield gauge("dead_letters", "Dead-lettered requests and seeds.", status["dead_letters"])
        if "site_count" in status:
            yield gauge(
                "sites_with_work",
                "Sites with requests queued or in flight.",
                status["site_count"]["with_work"],
            )
        if "scale" in status:
            scale = status["scale"]
            yield gauge(
                "useful_nodes",
                "Nodes the work ready now can keep busy, within the sites' caps and rates.",
                scale["useful_nodes"],
            )
            yield gauge(
                "usable_slots",
                "Downloads the fleet could run at once at the sites with work.",
                scale["usable_slots"],
            )
        progress = status["progress"]
        yield gauge("progress_ratio", "Seen URLs that are no longer pending.", progress["fraction"])
        eta = progress["eta_seconds"]
        yield gauge(
            "eta_seconds",
            "Estimated time until the frontier drains (NaN: unknown).",
            math.nan if eta is None else eta,
        )
        backlog = status["journal_backlog"]
        yield gauge(
            "journal_backlog",
            "Items journaled by nodes, not yet in MongoDB (NaN: unknown).",
            math.nan if backlog is None else backlog,
        )
        yield family(
            "nodes",
            "gauge",
            "Nodes by state.",
            [({"state": s}, status["fleet"][f"nodes_{s}"]) for s in ("alive", "dead", "finished")],
        )
        yield family(
            "node_up",
            "gauge",
            "1 while the node heartbeats, 0 once dead or finished.",
            [({"node": n["id"], "host": n["host"]}, n["state"] == "alive") for n in nodes],
        )
        yield per_node("node_pages_total", "counter", "Responses received by the node.", "pages")
        yield per_node("node_items_total", "counter", "Items scraped by the node.", "items")
        yield per_node("node_errors_total", "counter", "Errors logged by the node.", "errors")
        yield per_node(
            "node_download_errors_total", "counter", "Download exceptions.", "download_errors"
        )
        yield per_node(
            "node_retries_total", "counter", "Requests the node sent to retry.", "retries"
        )
        yield per_node(
            "node_dead_letters_total", "counter", "Requests it dead-lettered.", "dead_letters"
        )
        yield per_node(
            "node_mongo_errors_total", "counter", "Permanent MongoDB errors.", "mongo_errors"
        )
        yield per_node(
            "node_journal_errors_total", "counter", "Journal writes that failed.", "journal_errors"
        )
        yield per_node(
            "node_pages_per_second", "gauge", "Recent page rate.", "pages_per_min", 1 / 60
        )
        yield per_node(
            "node_items_per_second", "gauge", "Recent item rate.", "items_per_min", 1 / 60
        )
        yield per_node("node_in_flight", "gauge", "Leases Redis holds under the node.", "in_flight")
        yield family(
            "node_memory_bytes",
            "gauge",
            "Resident memory of the node process and of its children (browsers).",
            [({"node": n["id"], "process": "self"}, n["rss_bytes"]) for n in nodes]
            + [({"node": n["id"], "process": "children"}, n["children_rss_bytes"]) for n in nodes],
        )
        mongo = status.get("mongo") or {}
        yield gauge("mongo_up", "1 if MongoDB answered the last count.", "error" not in mongo)
        yield family(
            "mongo_documents",
            "gauge",
            "Documents in MongoDB, by collection.",
            [({"collection": k}, v) for k, v in mongo.items() if k != "error"],
        )


def render_metrics(status: dict[str, Any]) -> str:
    """The :func:`project.monitoring.status.fleet_status` figures in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(status))
    return generate_latest(registry).decode()
