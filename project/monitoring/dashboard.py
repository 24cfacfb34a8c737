"""``fleetcrawl dashboard``: a small aiohttp app with live charts, tables and ``/metrics``."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import BasicAuth, web
from redis.exceptions import RedisError
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.monitoring.metrics import CONTENT_TYPE, render_metrics
from project.monitoring.status import StatusReader

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Self

    from scrapy.settings import BaseSettings

    from project.dataout.api import DataApi

__all__ = ["STATIC_DIR", "DashboardConfig", "host_allowed", "make_app", "serve"]

logger = logging.getLogger(__name__)

#: index.html, the hand-written canvas charts and the stylesheet.
STATIC_DIR = Path(__file__).with_name("static")
_READER = web.AppKey("reader", StatusReader)
_CACHE = web.AppKey("cache", dict)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class DashboardConfig:
    """``DASHBOARD_*`` settings of ``fleetcrawl dashboard`` (credentials: environment only)."""

    allowed_hosts: tuple[str, ...] = setting("DASHBOARD_ALLOWED_HOSTS", ())

    @classmethod
    def from_settings(cls, settings: BaseSettings, environ: Mapping[str, str] = os.environ) -> Self:
        """The settings, with ``DASHBOARD_ALLOWED_HOSTS`` from *environ* when no setting has it."""
        given: dict[str, Any] = {}
        if settings.get("DASHBOARD_ALLOWED_HOSTS") is None and environ.get(
            "DASHBOARD_ALLOWED_HOSTS"
        ):
            given["allowed_hosts"] = tuple(environ["DASHBOARD_ALLOWED_HOSTS"].split(","))
        config = cls(**read_settings(cls, settings, **given))
        names = []
        for given_entry in config.allowed_hosts:
            entry = given_entry.strip().lower()
            if not entry:
                continue
            name = entry if entry == "*" or entry.startswith(".") else _host_name(entry)
            if not name:
                raise NotConfigured(
                    f"DASHBOARD_ALLOWED_HOSTS: {entry!r} is not a host name, '.domain' or '*'"
                )
            names.append(name)
        return cls(allowed_hosts=tuple(names))


# -- Host header -------------------------------------------------------------


def _host_name(header: str) -> str | None:
    """The name in a Host header (``name``, ``name:port``, ``[v6]:port``), or None if malformed."""
    value = header.strip().lower()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None if not rest else "bad"
    else:
        if value.count(":") > 1:
            return None  # an IPv6 address without brackets
        name, colon, port_text = value.partition(":")
        closed, port = "]", (port_text if colon else None)
    if not closed or not name or (port is not None and not port.isdigit()):
        return None
    return name.rstrip(".")


def host_allowed(header: str | None, bound: str, allowed: Iterable[str] = ()) -> bool:
    """Whether a request with this Host header may be answered (DNS rebinding).

    A page of another site that got its name pointed at the dashboard's address
    sends its own name as Host. Answered: IP addresses, ``localhost`` (names
    that no outside DNS can point here), the address the dashboard is bound
    to, and the names in *allowed* (``name``, ``.domain`` for it and its
    subdomains, ``*`` for any). Ports are not compared, so SSH tunnels and
    reverse proxies on another port work.
    """
    name = _host_name(header) if header else None
    if name is None:
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        return True
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name == bound.strip("[]").lower().rstrip("."):
        return True
    return any(
        entry == "*" or entry == name or (entry.startswith(".") and f".{name}".endswith(entry))
        for entry in allowed
    )


_REFUSED_LOGGED = 100  # distinct refused Host names logged, so refusals cannot flood the log


def _host_check(bound: str, allowed: tuple[str, ...]) -> Any:
    logged: set[str] = set()

    @web.middleware
    async def check(request: web.Request, handler: _Handler) -> web.StreamResponse:
        header = request.headers.get("Host")
        if host_allowed(header, bound, allowed):
            return await handler(request)
        shown = (header or "")[:100]
        if shown not in logged and len(logged) < _REFUSED_LOGGED:
            logged.add(shown)
            logger.warning(
                "Refused a request for Host %r (DNS rebinding?); add the name the dashboard is"
                " reached by to DASHBOARD_ALLOWED_HOSTS if it is yours",
                shown,
            )
        raise web.HTTPBadRequest(
            text="This Host header is not allowed: set DASHBOARD_ALLOWED_HOSTS to the name the"
            " dashboard is reached by.\n"
        )

    return check


# -- the web app -------------------------------------------------------------


def _auth(username: str | None, password: str | None, tokens: tuple[str, ...]) -> Any:
    """Basic auth on every route (with a username and password), and read-only bearer tokens
    (DASHBOARD_API_TOKENS) on the data API, ``/api/v1/``: with tokens set, the API needs one
    (or the basic credentials) even where the dashboard is open."""
    expected = (username.encode(), password.encode()) if username and password else None
    keys = [token.encode() for token in tokens]

    @web.middleware
    async def check(request: web.Request, handler: _Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        api = request.path.startswith("/api/v1/")
        if keys and api and header[:7].lower() == "bearer ":
            given = header[7:].strip().encode()
            # every token compared: the time taken tells nothing of which is near
            matched = sum(hmac.compare_digest(given, key) for key in keys)
            if matched and request.method in ("GET", "HEAD"):
                return await handler(request)
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="fleetcrawl"'})
        if expected is None and not (keys and api):
            return await handler(request)
        try:
            given_basic = BasicAuth.decode(header) if header else None
        except ValueError:
            given_basic = None
        # compare_digest on both parts: timing tells nothing about either.
        if (
            expected is not None
            and given_basic is not None
            and (
                hmac.compare_digest(given_basic.login.encode(), expected[0])
                & hmac.compare_digest(given_basic.password.encode(), expected[1])
            )
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


async def _items_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "items.html")


async def _changes_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "changes.html")


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


async def _api_scale(request: web.Request) -> web.Response:
    """How many nodes are useful now (project/monitoring/scale.py): for KEDA's metrics-api
    trigger (``valueLocation: useful_nodes``) and ``fleetcrawl autoscale``."""
    status = await _status(request)
    return _json({"spider": status["spider"], **status["scale"]})


async def _metrics(request: web.Request) -> web.Response:
    body = render_metrics(await _status(request))
    return web.Response(
        body=body.encode(),
        headers={"Content-Type": CONTENT_TYPE, "X-Content-Type-Options": "nosniff"},
    )


async def _close_reader(app: web.Application) -> None:
    await asyncio.to_thread(app[_READER].close)


def make_app(
    reader: StatusReader,
    *,
    username: str | None = None,
    password: str | None = None,
    bound: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] = (),
    data_api: DataApi | None = None,
    api_tokens: tuple[str, ...] = (),
) -> web.Application:
    """The dashboard app; with *username* and *password*, every route needs basic auth;
    *data_api*'s routes (``/api/v1``) also take the read-only *api_tokens*.

    Requests whose Host header :func:`host_allowed` refuses get 400, before anything else.
    """
    middlewares = [_host_check(bound, allowed_hosts)]
    if (username and password) or api_tokens:
        middlewares.append(_auth(username, password, api_tokens))
    middlewares.append(_redis_errors)
    app = web.Application(middlewares=middlewares)
    app[_READER] = reader
    app[_CACHE] = {"lock": asyncio.Lock(), "at": -math.inf, "status": {}}
    app.router.add_get("/", _index)
    app.router.add_static("/static", STATIC_DIR)
    app.router.add_get("/api/status", _api_status)
    app.router.add_get("/api/history", _api_history)
    app.router.add_get("/api/dead-letters", _api_dead_letters)
    app.router.add_get("/api/v1/scale", _api_scale)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/items", _items_page)
    app.router.add_get("/changes", _changes_page)
    if data_api is not None:
        data_api.add_to(app)
    app.on_cleanup.append(_close_reader)
    return app


def _data_api(settings: BaseSettings, spider: str, reader: StatusReader) -> DataApi | None:
    """The data API on the spider's database (None, said once, when MONGO_* cannot work)."""
    from project.dataout.api import DataApi
    from project.dataout.clock import fleet_ms
    from project.dataout.config import DataOutConfig
    from project.storage.config import MongoConfig, StorageConfigError

    try:
        mongo = MongoConfig.from_settings(settings, spider_name=spider)
    except StorageConfigError as exc:
        logger.warning("No data API: %s", exc)
        return None

    async def now_ms() -> int:
        return await asyncio.to_thread(fleet_ms, reader.redis)

    return DataApi(mongo, DataOutConfig.from_settings(settings).settle_seconds, now_ms)


def serve(settings: BaseSettings, spider: str, host: str, port: int) -> int:
    """Run the dashboard and the data API until Ctrl-C (credentials from
    DASHBOARD_USERNAME/PASSWORD, read-only API tokens from DASHBOARD_API_TOKENS).

    Raises ``NotConfigured`` for bad settings, ``RedisError`` when Redis cannot
    be read at the start, and ``OSError`` when *host*:*port* cannot be listened on.
    """
    username = os.environ.get("DASHBOARD_USERNAME") or None
    password = os.environ.get("DASHBOARD_PASSWORD") or None
    if bool(username) != bool(password):
        raise NotConfigured("set both DASHBOARD_USERNAME and DASHBOARD_PASSWORD, or neither")
    config = DashboardConfig.from_settings(settings)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not username:
        logger.warning(
            "Dashboard on %s without DASHBOARD_USERNAME/PASSWORD: anyone can read it", host
        )
    reader = StatusReader.from_settings(settings, spider)
    try:
        reader.redis.ping()  # a wrong REDIS_URL is one line now, not a 503 on every poll
    except RedisError:
        reader.close()
        raise
    try:
        # Bound here, so a port in use is an error before the dashboard says it runs.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host.strip("[]"), port), family=family)
    except OSError:
        reader.close()
        raise
    logger.info(
        "Dashboard of %s (Redis %s) on http://%s:%d/",
        spider,
        reader.redis_name,
        host if family == socket.AF_INET else f"[{host.strip('[]')}]",
        port,
    )
    tokens = tuple(
        t.strip() for t in os.environ.get("DASHBOARD_API_TOKENS", "").split(",") if t.strip()
    )
    app = make_app(
        reader,
        username=username,
        password=password,
        bound=host,
        allowed_hosts=config.allowed_hosts,
        data_api=_data_api(settings, spider, reader),
        api_tokens=tokens,
    )
    web.run_app(app, sock=sock, access_log=None, print=None)
    return 0
