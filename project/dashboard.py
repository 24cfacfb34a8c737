"""``fleetcrawl dashboard``: a small aiohttp app with live charts, tables and ``/metrics``."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import BasicAuth, web
from redis.exceptions import RedisError

from project.services import mask_url
from project.status import StatusReader

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["STATIC_DIR", "make_app", "render_metrics", "serve"]

logger = logging.getLogger(__name__)

#: index.html, the hand-written canvas charts and the stylesheet.
STATIC_DIR = Path(__file__).with_name("dashboard_static")
_READER = web.AppKey("reader", StatusReader)
_CACHE = web.AppKey("cache", dict)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- Prometheus text exposition format -------------------------------------


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
    """The :func:`project.status.fleet_status` figures in Prometheus' text format 0.0.4."""
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


# -- the web app -------------------------------------------------------------


def _basic_auth(username: str, password: str) -> Any:
    expected = (username.encode(), password.encode())

    @web.middleware
    async def check(request: web.Request, handler: _Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        try:
            given = BasicAuth.decode(header) if header else None
        except ValueError:
            given = None
        # compare_digest on both parts: timing tells nothing about either.
        if given is not None and (
            hmac.compare_digest(given.login.encode(), expected[0])
            & hmac.compare_digest(given.password.encode(), expected[1])
        ):
            return await handler(request)
        raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Basic realm="fleetcrawl"'})

    return check


async def _status(request: web.Request) -> dict[str, Any]:
    """The status, read at most once a second however many browsers poll."""
    cache = request.app[_CACHE]
    async with cache["lock"]:
        if time.monotonic() - cache["at"] > 1.0:
            # redis-py and pymongo here are blocking clients: keep them off the loop.
            cache["status"] = await asyncio.to_thread(request.app[_READER].read)
            cache["at"] = time.monotonic()
        return dict(cache["status"])


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


@web.middleware
async def _redis_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RedisError as exc:
        return _json({"error": f"Redis unreachable: {exc}"}, status=503)


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def _api_status(request: web.Request) -> web.Response:
    return _json(await _status(request))


async def _api_history(request: web.Request) -> web.Response:
    since = request.query.get("since") or None
    if since is not None and not all(part.isdigit() for part in since.split("-", 1)):
        raise web.HTTPBadRequest(text="since must be a stream id such as 1700000000000-0")
    return _json(await asyncio.to_thread(request.app[_READER].history, since))


async def _api_dead_letters(request: web.Request) -> web.Response:
    try:
        limit = min(max(int(request.query.get("limit", "100")), 1), 10000)
    except ValueError as exc:
        raise web.HTTPBadRequest(text="limit must be an integer") from exc
    error = request.query.get("error")
    records = await asyncio.to_thread(
        request.app[_READER].dead_letters, limit if error is None else 10000
    )
    if error is not None:
        records = [r for r in records if str(r.get("error", ""))[:200] == error][:limit]
    return _json(records)


async def _metrics(request: web.Request) -> web.Response:
    body = render_metrics(await _status(request))
    return web.Response(text=body, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})  # fmt: skip


async def _close_reader(app: web.Application) -> None:
    await asyncio.to_thread(app[_READER].close)


def make_app(
    reader: StatusReader, *, username: str | None = None, password: str | None = None
) -> web.Application:
    """The dashboard app; with *username* and *password*, every route needs basic auth."""
    middlewares = [_redis_errors]
    if username and password:
        middlewares.insert(0, _basic_auth(username, password))
    app = web.Application(middlewares=middlewares)
    app[_READER] = reader
    app[_CACHE] = {"lock": asyncio.Lock(), "at": -math.inf, "status": {}}
    app.router.add_get("/", _index)
    app.router.add_static("/static", STATIC_DIR)
    app.router.add_get("/api/status", _api_status)
    app.router.add_get("/api/history", _api_history)
    app.router.add_get("/api/dead-letters", _api_dead_letters)
    app.router.add_get("/metrics", _metrics)
    app.on_cleanup.append(_close_reader)
    return app


def serve(settings: BaseSettings, spider: str, host: str, port: int) -> int:
    """Run the dashboard until Ctrl-C (credentials from DASHBOARD_USERNAME/PASSWORD)."""
    username = os.environ.get("DASHBOARD_USERNAME") or None
    password = os.environ.get("DASHBOARD_PASSWORD") or None
    if bool(username) != bool(password):
        logger.error("Set both DASHBOARD_USERNAME and DASHBOARD_PASSWORD, or neither")
        return 2
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not username:
        logger.warning(
            "Dashboard on %s without DASHBOARD_USERNAME/PASSWORD: anyone can read it", host
        )
    reader = StatusReader.from_settings(settings, spider)
    logger.info(
        "Dashboard of %s (Redis %s) on http://%s:%d/",
        spider,
        mask_url(settings.get("REDIS_URL")),
        host,
        port,
    )
    app = make_app(reader, username=username, password=password)
    web.run_app(app, host=host, port=port, access_log=None, print=None)
    return 0
