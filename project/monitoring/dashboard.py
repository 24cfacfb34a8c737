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

from project.monitoring.metrics import render_metrics
from project.monitoring.status import StatusReader
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["STATIC_DIR", "make_app", "serve"]

logger = logging.getLogger(__name__)

#: index.html, the hand-written canvas charts and the stylesheet.
STATIC_DIR = Path(__file__).with_name("static")
_READER = web.AppKey("reader", StatusReader)
_CACHE = web.AppKey("cache", dict)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        mask_url(reader.redis_url),
        host,
        port,
    )
    app = make_app(reader, username=username, password=password)
    web.run_app(app, host=host, port=port, access_log=None, print=None)
    return 0
