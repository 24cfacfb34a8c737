"""Node heartbeats and the fleet status: real crawls against the figures status reports."""

from __future__ import annotations

import itertools
import math
import re
import signal
import time
from typing import Any

import pytest
from rich.console import Console
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from project.monitoring.console import human_bytes, human_duration, render
from project.monitoring.metrics import render_metrics
from project.monitoring.node import MonitorConfig, windowed_rate
from project.monitoring.status import StatusReader, drain_eta, failure_summary, node_view
from tests.fleet import WAIT_FOR_SEED, wait_for

# -- a strict reader of Prometheus' text format 0.0.4 ---------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})?"
    r" (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|Inf|NaN))$"
)
_LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples by (name, labels); fails on any line that is not valid exposition format."""
    assert text.endswith("\n")
    typed: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            assert re.match(rf"^# HELP {_NAME} \S", line), line
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge"}, line
            assert name not in typed, f"{name} typed twice"
            typed[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name = match["name"]
            assert name in typed, f"{name} has no TYPE line before it"
            if typed[name] == "counter":
                assert name.endswith("_total"), name
            labels = {
                k: v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
                for k, v in _LABELS.findall(match["labels"] or "")
            }
            key = (name, frozenset(labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = float(match["value"])
    return samples


def metric(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset({"spider": "products", **labels}.items()))]


# -- units ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("points", "rate"),
    [
        ([], 0.0),
        ([(10.0, 5)], 0.0),
        ([(10.0, 0), (12.0, 10)], 5.0),
        ([(0.0, 0), (5.0, 1), (10.0, 30)], 3.0),
        ([(3.0, 7), (3.0, 9)], 0.0),
    ],
)
def test_windowed_rate(points: list[tuple[float, float]], rate: float) -> None:
    assert windowed_rate(points) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("samples", "drain", "eta"),
    [
        ([], None, None),
        ([(0.0, 0)], None, 0.0),
        ([(0.0, 12)], None, None),
        ([(0.0, 100), (5.0, 75), (10.0, 50)], 5.0, 10.0),  # linear: 5/s, 50 left
        ([(0.0, 10), (1.0, 20), (2.0, 30)], -10.0, None),  # growing: no ETA
        ([(0.0, 30), (1.0, 30)], 0.0, None),  # stalled
        ([(0.0, 40), (2.0, 0)], 20.0, 0.0),  # done
        ([(0.0, 100), (1.0, 95), (2.0, 85), (3.0, 80)], 7.0, 80 / 7.0),  # least squares
        ([(0.0, 0), (1.0, 50), (2.0, 100), (3.0, 80), (4.0, 60)], 20.0, 3.0),  # since the peak
        ([(0.0, 10), (1.0, 30), (2.0, 30)], -10.0, None),  # at its peak: still growing
    ],
)
def test_drain_eta(samples: list[tuple[float, float]], drain: float | None, eta: float | None):
    got_drain, got_eta = drain_eta(samples)
    assert got_drain == (None if drain is None else pytest.approx(drain))
    assert got_eta == (None if eta is None else pytest.approx(eta))


def test_monitor_config_defaults_and_overrides() -> None:
    assert MonitorConfig.from_settings(Settings()) == MonitorConfig()
    config = MonitorConfig.from_settings(
        Settings({"MONITOR_INTERVAL": "0.5", "MONITOR_NODE_TIMEOUT": 3, "REDIS_URL": "redis://r/1"})
    )
    assert (config.interval, config.node_timeout, config.redis_url) == (0.5, 3.0, "redis://r/1")


@pytest.mark.parametrize(
    "settings",
    [
        {"MONITOR_INTERVAL": 0},
        {"MONITOR_INTERVAL": 5, "MONITOR_NODE_TIMEOUT": 5},
        {"MONITOR_HISTORY_SECONDS": 1},
        {"MONITOR_RATE_WINDOW": 1},
        {"MONITOR_INTERVAL": "nan"},
    ],
)
def test_monitor_config_rejects_settings_that_cannot_work(settings: dict[str, Any]) -> None:
    with pytest.raises(NotConfigured):
        MonitorConfig.from_settings(Settings(settings))


@pytest.mark.parametrize(
    ("state", "present", "shown"),
    [("running", True, "alive"), ("running", False, "dead"), ("finished", False, "finished")],
)
def test_node_state(state: str, present: bool, shown: str) -> None:
    record = {"id": "n1", "state": state, "last_seen": 100.0, "pages_per_min": 60.0}
    view = node_view(record, present, in_flight=3, now=104.0)
    assert view["state"] == shown
    assert view["age_seconds"] == pytest.approx(4.0)
    assert view["pages_per_min"] == (60.0 if shown == "alive" else 0.0)
    assert view["in_flight"] == 3


def test_failure_summary_groups_by_error_most_frequent_first() -> None:
    records = [
        {"url": "http://a/1", "error": "HTTP 503", "kind": "request", "time": 1, "node": "n1"},
        {"url": "http://a/2", "error": "HTTP 503", "kind": "request", "time": 3, "node": "n2"},
        {"url": "not a url", "error": "bad seed", "kind": "seed", "time": 2, "node": "n1"},
    ]
    groups = failure_summary(records)
    assert [(g["error"], g["count"]) for g in groups] == [("HTTP 503", 2), ("bad seed", 1)]
    assert (groups[0]["last_url"], groups[0]["node"]) == ("http://a/2", "n2")


def _status(**overrides: Any) -> dict[str, Any]:
    node = {
        "id": 'host:1:a"b\\c\nd',
        "host": "host",
        "state": "alive",
        "finish_reason": None,
        "age_seconds": 0.4,
        "pages": 120,
        "items": 100,
        "pages_per_min": 600.0,
        "items_per_min": 480.0,
        "errors": 1,
        "download_errors": 2,
        "retries": 3,
        "dead_letters": 4,
        "in_flight": 5,
        "rss_bytes": 100 << 20,
        "children_rss_bytes": 0,
        "retry_reasons": {"HTTP 503": 3},
    }
    status = {
        "spider": "products",
        "time": time.time(),
        "queued": 42,
        "queued_by_priority": {10: 2, 0: 40},
        "delayed_retries": 3,
        "in_flight": 5,
        "in_flight_by_node": {node["id"]: 5},
        "seeds_waiting": 0,
        "seen": 200,
        "seen_bytes": 9000,
        "dead_letters": 4,
        "sites": [
            {
                "site": "shop.test:8080",
                "state": "throttled",
                "allowed_rate": 20.0,
                "achieved_rate": 19.5,
                "queued": 40,
                "in_flight": 5,
                "leases": 100,
                "concurrency": 32,
            }
        ],
        "nodes": [node, {**node, "id": "host:2:b", "state": "dead", "pages_per_min": 0.0}],
        "fleet": {
            "nodes_alive": 1,
            "nodes_dead": 1,
            "nodes_finished": 0,
            "pages_per_min": 600.0,
            "items_per_min": 480.0,
            "errors": 2,
            "download_errors": 4,
            "retries": 6,
            "seeds_rejected": 1,
            "retry_reasons": {"HTTP 503": 6},
        },
        "progress": {
            "done": 150,
            "total": 200,
            "fraction": 0.75,
            "pending": 50,
            "drain_per_s": 2.5,
            "eta_seconds": 20.0,
        },
        "failures": [{"count": 4, "error": "HTTP 503", "kind": "request", "last_url": "http://x"}],
        "journal_backlog": None,
        "mongo": {"products": 100, "rejects": 2, "failures": 4},
    }
    status.update(overrides)
    return status


def test_prometheus_output_is_valid_text_format() -> None:
    samples = parse_prometheus(render_metrics(_status()))
    node = 'host:1:a"b\\c\nd'  # quotes, backslashes and newlines survive escaping
    assert metric(samples, "fleetcrawl_queue_depth") == 42
    assert metric(samples, "fleetcrawl_queue_depth_by_priority", priority="10") == 2
    assert metric(samples, "fleetcrawl_node_up", node=node, host="host") == 1
    assert metric(samples, "fleetcrawl_node_up", node="host:2:b", host="host") == 0
    assert metric(samples, "fleetcrawl_node_pages_total", node=node) == 120
    assert metric(samples, "fleetcrawl_node_pages_per_second", node=node) == pytest.approx(10.0)
    assert metric(samples, "fleetcrawl_node_memory_bytes", node=node, process="self") == 100 << 20
    assert metric(samples, "fleetcrawl_mongo_documents", collection="products") == 100
    assert metric(samples, "fleetcrawl_mongo_up") == 1
    assert metric(samples, "fleetcrawl_eta_seconds") == 20.0
    assert math.isnan(metric(samples, "fleetcrawl_journal_backlog"))  # no node reported one
    down = parse_prometheus(render_metrics(_status(mongo={"error": "MongoDB unreachable"})))
    assert metric(down, "fleetcrawl_mongo_up") == 0


def test_watch_renders_every_figure() -> None:
    console = Console(record=True, width=160, color_system=None)
    console.print(render(_status()))
    text = console.export_text()
    for expected in ("queued", "42 (p10: 2, p0: 40)", "host:2:b", "dead", "ETA 20s", "150/200",
                     "100.0 MiB", "journal backlog", "n/a", "HTTP 503", "8.8 KiB",
                     "shop.test:8080", "throttled", "20/s", "19.5/s"):  # fmt: skip
        assert expected in text, expected


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 B"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB"), (3 << 40, "3072.0 GiB")],
)
def test_human_bytes(value: int, text: str) -> None:
    assert human_bytes(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "unknown"), (4.4, "4s"), (95, "1m 35s"), (7260, "2h 01m")]
)
def test_human_duration(seconds: float | None, text: str) -> None:
    assert human_duration(seconds) == text


# -- real crawls ------------------------------------------------------------------

MONITORED = {"MONITOR_INTERVAL": 0.5, "MONITOR_NODE_TIMEOUT": 2.0}


def _nodes(fleet, count: int, **settings: Any) -> None:
    for index in range(count):
        # Each node its own MongoDB journal (they share the working directory here).
        journal = fleet.log_dir / f"journal{index}"
        fleet.start_node(**MONITORED, MONGO_JOURNAL_DIR=str(journal), **settings)


def _reader(fleet) -> StatusReader:
    """The reader ``fleetcrawl status`` builds, under the nodes' settings."""
    settings = Settings(
        {**fleet.space.settings, "REDIS_URL": fleet.redis_url, "MONGO_URI": fleet.mongo_url,
         "MONGO_DATABASE": fleet.mongo_db}
    )  # fmt: skip
    return StatusReader.from_settings(settings, "products")


def _poll(reader: StatusReader, until, timeout: float) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status = reader.read()
        return status if until(status) else None

    return wait_for(ready, timeout, "the status", interval=0.1)


@pytest.mark.crawl
def test_status_matches_a_finished_two_node_crawl(fleet, make_shop, mongo, redis_client) -> None:
    # 200 ms a page: the crawl lasts several monitor intervals, and both nodes are up for it
    shop = make_shop(products=300, latency_ms=200)
    _nodes(fleet, 2, **WAIT_FOR_SEED)
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]

    reader = _reader(fleet)
    try:
        status = reader.read()
        samples = reader.history()
    finally:
        reader.close()
    hits = shop.stats()["hits"]
    pages = {path for path in hits if path != "/robots.txt"}  # robots.txt is not in the seen-set
    assert status["seen"] == len(pages), "seen-set size != distinct pages the shop served"
    assert all(hits[path] == 1 for path in pages)
    assert (status["queued"], status["delayed_retries"], status["in_flight"]) == (0, 0, 0)
    assert status["mongo"]["products"] == mongo.products.count_documents({}) == 300
    assert status["fleet"]["pages"] == sum(hits.values())
    assert status["fleet"]["items"] == 300
    assert [n["state"] for n in status["nodes"]] == ["finished", "finished"]
    assert {n["finish_reason"] for n in status["nodes"]} == {"finished"}
    assert all(n["pages"] > 0 and n["rss_bytes"] > 10 << 20 for n in status["nodes"])
    assert status["progress"]["fraction"] == 1.0
    assert status["progress"]["eta_seconds"] == 0.0
    assert status["journal_backlog"] == 0
    assert redis_client.zcard(fleet.keys.alive) == 0, "finished nodes left the alive set"

    # The leader lock: one fleet sample per interval, not one per node.
    assert len(samples) >= 3
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(samples)]
    assert min(gaps) >= 0.9 * MONITORED["MONITOR_INTERVAL"] * 1000 - 5
    assert max(s["alive"] for s in samples) == 2
    assert max(s["seen"] for s in samples) <= len(pages)
    assert samples[-1]["pages"] <= status["fleet"]["pages"]


@pytest.mark.crawl
def test_killed_node_shows_dead_and_stopped_node_finished(fleet, make_shop) -> None:
    shop = make_shop(products=2000, latency_ms=100)
    _nodes(fleet, 2, FRONTIER_KEEP_ALIVE=True)
    fleet.seed(shop.url("/"))
    reader = _reader(fleet)
    try:
        status = _poll(reader, lambda s: s["fleet"]["nodes_alive"] == 2, timeout=40)
        node0 = next(n["id"] for n in status["nodes"] if n["pid"] == fleet.procs[0].pid)
        node1 = next(n["id"] for n in status["nodes"] if n["pid"] == fleet.procs[1].pid)
        fleet.kill(0)
        killed = time.monotonic()
        status = _poll(reader, lambda s: _state(s, node0) == "dead", timeout=10)
        assert time.monotonic() - killed <= MONITORED["MONITOR_NODE_TIMEOUT"] + 1.5
        assert _state(status, node1) == "alive"
        assert status["fleet"]["nodes_dead"] == 1

        fleet.procs[1].send_signal(signal.SIGINT)  # Scrapy's graceful shutdown
        assert fleet.procs[1].wait(30) == 0
        status = reader.read()
        node = next(n for n in status["nodes"] if n["id"] == node1)
        assert (node["state"], node["finish_reason"]) == ("finished", "shutdown")
        assert _state(status, node0) == "dead"
        assert status["in_flight_by_node"].get(node1, 0) == 0, "leases left after a clean stop"
    finally:
        reader.close()


def _state(status: dict[str, Any], node_id: str) -> str | None:
    return next((n["state"] for n in status["nodes"] if n["id"] == node_id), None)
