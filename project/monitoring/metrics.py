"""The fleet's figures for Prometheus, in its text exposition format 0.0.4."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["render_metrics"]


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render_metrics(status: dict[str, Any]) -> str:
    """The :func:`project.monitoring.status.fleet_status` figures in Prometheus' text format 0.0.4."""
    out: list[str] = []
    spider = {"spider": status["spider"]}

    def metric(
        name: str, kind: str, text: str, samples: list[tuple[dict[str, Any], float]]
    ) -> None:
        out.append(f"# HELP fleetcrawl_{name} {text}")
        out.append(f"# TYPE fleetcrawl_{name} {kind}")
        for labels, value in samples:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in {**spider, **labels}.items())
            out.append(f"fleetcrawl_{name}{{{pairs}}} {_value(value)}")

    def gauge(name: str, text: str, value: float) -> None:
        metric(name, "gauge", text, [({}, value)])

    gauge("queue_depth", "Requests waiting in the shared queue.", status["queued"])
    metric(
        "queue_depth_by_priority",
        "gauge",
        "Requests waiting in the shared queue, by priority.",
        [({"priority": p}, n) for p, n in status["queued_by_priority"].items()],
    )
    gauge("delayed_retries", "Requests waiting for their retry time.", status["delayed_retries"])
    gauge("in_flight", "Requests leased by nodes.", status["in_flight"])
    gauge("seeds_waiting", "Seeds not yet taken by a node.", status["seeds_waiting"])
    gauge("seen_urls", "Fingerprints in the seen-set.", status["seen"])
    gauge("seen_bytes", "Memory of the seen-set in Redis.", status["seen_bytes"])
    gauge("dead_letters", "Dead-lettered requests and seeds.", status["dead_letters"])
    progress = status["progress"]
    gauge("progress_ratio", "Seen URLs that are no longer pending.", progress["fraction"])
    eta = progress["eta_seconds"]
    gauge("eta_seconds", "Estimated time until the frontier drains (NaN: unknown).",
          math.nan if eta is None else eta)  # fmt: skip
    backlog = status["journal_backlog"]
    gauge("journal_backlog", "Items journaled by nodes, not yet in MongoDB (NaN: unknown).",
          math.nan if backlog is None else backlog)  # fmt: skip
    metric(
        "nodes",
        "gauge",
        "Nodes by state.",
        [({"state": s}, status["fleet"][f"nodes_{s}"]) for s in ("alive", "dead", "finished")],
    )
    nodes = status["nodes"]

    def per_node(name: str, kind: str, text: str, key: str, scale: float = 1.0) -> None:
        samples = [({"node": n["id"]}, n[key] * scale if scale != 1.0 else n[key]) for n in nodes]
        metric(name, kind, text, samples)

    metric(
        "node_up",
        "gauge",
        "1 while the node heartbeats, 0 once dead or finished.",
        [({"node": n["id"], "host": n["host"]}, n["state"] == "alive") for n in nodes],
    )
    per_node("node_pages_total", "counter", "Responses received by the node.", "pages")
    per_node("node_items_total", "counter", "Items scraped by the node.", "items")
    per_node("node_errors_total", "counter", "Errors logged by the node.", "errors")
    per_node("node_download_errors_total", "counter", "Download exceptions.", "download_errors")
    per_node("node_retries_total", "counter", "Requests the node sent to retry.", "retries")
    per_node("node_dead_letters_total", "counter", "Requests it dead-lettered.", "dead_letters")
    per_node("node_pages_per_second", "gauge", "Recent page rate.", "pages_per_min", 1 / 60)
    per_node("node_items_per_second", "gauge", "Recent item rate.", "items_per_min", 1 / 60)
    per_node("node_in_flight", "gauge", "Leases Redis holds under the node.", "in_flight")
    metric(
        "node_memory_bytes",
        "gauge",
        "Resident memory of the node process and of its children (browsers).",
        [({"node": n["id"], "process": "self"}, n["rss_bytes"]) for n in nodes]
        + [({"node": n["id"], "process": "children"}, n["children_rss_bytes"]) for n in nodes],
    )
    mongo = status.get("mongo") or {}
    gauge("mongo_up", "1 if MongoDB answered the last count.", "error" not in mongo)
    metric(
        "mongo_documents",
        "gauge",
        "Documents in MongoDB, by collection.",
        [({"collection": k}, v) for k, v in mongo.items() if k != "error"],
    )
    return "\n".join(out) + "\n"
