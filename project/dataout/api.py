"""The items and changes API, ``/api/v1/...``, served by the dashboard (same server, same auth).

- ``GET /api/v1/collections``: the database's collections with their counts;
- ``GET /api/v1/items/{collection}?limit&cursor&fields&omit&format&run&since``: a page of
  items in ``_id`` order (Apify's parameter names where they mean the same thing);
- ``GET /api/v1/changes?since&field&item&collection&limit&cursor&format``: a page of changes
  in the order they were written;
- ``GET /api/v1/changes/feed?since|cursor&format=ndjson|sse&...``: the changes as they are
  stored, streamed; each carries the cursor that resumes right after it (an SSE client's
  ``Last-Event-ID`` does the same);
- ``GET /api/v1/runs``, ``GET /api/v1/runs/{id}``: the crawl runs' reports;
- ``GET /api/v1/openapi.json``: this API described.

A page's ``cursor`` (JSON ``cursor``, or the ``X-Next-Cursor`` header and a ``Link: rel=next``)
continues the same read, at the same watermark; its ``token`` is what ``since`` takes later to
read what was written after (project/dataout/query.py). A parameter that cannot be used is a
400 with ``{"error": ...}``; ``limit`` is capped at MAX_PAGE; MongoDB away is a 503. Every
read is asynchronous and holds one page: a slow client slows only its own response, and a
feed client that stops reading is dropped after _WRITE_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from project.dataout.formats import CONTENT_TYPES, FORMATS, dumps, writer_for
from project.dataout.query import (
    MAX_PAGE,
    BadParameterError,
    ChangeQuery,
    Cursor,
    ItemQuery,
    make_token,
    pages,
    read_token,
    split_fields,
    watermark_ms,
    window_of,
)
from project.storage.config import collection_name_error
from project.storage.counts import count_of_async

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from project.storage.config import MongoConfig

    _Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

__all__ = ["OPENAPI", "DataApi"]

logger = logging.getLogger(__name__)

_DEFAULT_LIMIT = 100
#: Seconds between the feed's reads of new changes, and between its keep-alives.
_FEED_POLL = 1.0
_KEEPALIVE = 15.0
#: A feed client that takes no bytes for this long is dropped.
_WRITE_TIMEOUT = 30.0
#: Feeds streaming at once, at most.
_MAX_FEEDS = 100


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": message}, status=status)


class DataApi:
    """The routes of ``/api/v1``, reading MongoDB through one asynchronous client."""

    def __init__(
        self, mongo: MongoConfig, settle_seconds: float, now_ms: Callable[[], Awaitable[int]]
    ) -> None:
        self.mongo = mongo
        self.settle_seconds = settle_seconds
        self.now_ms = now_ms
        self._client: AsyncMongoClient[dict[str, Any]] | None = None
        self._feeds = 0

    # -- wiring --------------------------------------------------------------------

    def add_to(self, app: web.Application) -> None:
        """Mount the routes on *app*, and close the client with it."""
        routes = [
            ("/api/v1/openapi.json", self.openapi),
            ("/api/v1/collections", self.collections),
            ("/api/v1/items/{collection}", self.items),
            ("/api/v1/changes", self.changes),
            ("/api/v1/changes/feed", self.feed),
            ("/api/v1/runs", self.runs),
            ("/api/v1/runs/{run}", self.run),
        ]
        for path, handler in routes:
            app.router.add_get(path, self._guarded(handler))
        app.on_cleanup.append(self._close)

    def _guarded(self, handler: _Handler) -> _Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except BadParameterError as exc:
                return _error(str(exc))
            except PyMongoError as exc:
                return _error(f"MongoDB unreachable or refused the read: {exc}", 503)

        return guarded

    @property
    def database(self) -> Any:
        if self._client is None:
            self._client = AsyncMongoClient(
                self.mongo.uri, tz_aware=True, appname="fleetcrawl-api",
                serverSelectionTimeoutMS=int(self.mongo.server_selection_timeout * 1000),
            )  # fmt: skip
        return self._client[self.mongo.database]

    async def _close(self, app: web.Application) -> None:
        if self._client is not None:
            await self._client.close()

    async def _watermark(self) -> int:
        return watermark_ms(await self.now_ms(), self.settle_seconds)

    # -- routes --------------------------------------------------------------------

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(OPENAPI)

    async def collections(self, request: web.Request) -> web.StreamResponse:
        names = sorted(await self.database.list_collection_names())
        counts = [await count_of_async(self.database[name]) for name in names]
        return web.json_response(
            {"collections": [{"name": n, "count": c} for n, c in zip(names, counts, strict=True)]}
        )

    async def items(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["collection"]
        problem = collection_name_error(name, self.mongo.database)
        if problem is not None:
            raise BadParameterError(f"collection: {problem}")
        if name not in await self.database.list_collection_names():
            return _error(f"no collection {name[:100]!r} (GET /api/v1/collections lists them)", 404)
        q = request.query
        limit, fmt, cursor = _limit(q), _format(q), _cursor(q)
        until, since = await self._bounds(q, cursor)
        window = None
        if q.get("run"):
            report = await self.database[self.mongo.runs_collection].find_one({"_id": q["run"]})
            if report is None:
                return _error(f"no report of run {q['run'][:100]!r}", 404)
            window = window_of(report)
        query = ItemQuery(
            until, since, window, split_fields(q.get("fields")), split_fields(q.get("omit"), "omit")
        )
        return await self._page(request, self.database[name], query, limit, fmt, cursor, "items")

    async def changes(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        limit, fmt, cursor = _limit(q), _format(q), _cursor(q)
        query = await self._change_query(q, cursor)
        collection = self.database[self.mongo.changes_collection]
        return await self._page(request, collection, query, limit, fmt, cursor, "changes")

    async def feed(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        sse = q.get("format", "ndjson") == "sse" or "text/event-stream" in request.headers.get(
            "Accept", ""
        )
        if q.get("format", "ndjson") not in ("ndjson", "sse"):
            raise BadParameterError("format: ndjson or sse")
        last_event = request.headers.get("Last-Event-ID")
        cursor = Cursor.decode(last_event) if last_event else _cursor(q)
        since = _since(q)
        if cursor is None and since is None:
            since = await self._watermark()  # from now on
        if self._feeds >= _MAX_FEEDS:
            return _error(f"{_MAX_FEEDS} feeds stream already: try again later", 503)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream" if sse else CONTENT_TYPES["jsonl"],
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        collection = self.database[self.mongo.changes_collection]
        after = cursor.after if cursor is not None else None
        self._feeds += 1
        quiet_since = time.monotonic()
        try:
            while True:
                until = await self._watermark()
                query = ChangeQuery(
                    until, since, q.get("collection"), q.get("field"), q.get("item")
                )
                try:
                    async for docs, _ in pages(collection, query, after=after, size=MAX_PAGE):
                        chunks = []
                        for doc in docs:
                            after = str(doc["_id"])
                            token = Cursor(after, 0).encode()
                            if sse:
                                chunks.append(f"id: {token}\nevent: change\ndata: {dumps(doc)}\n\n")
                            else:
                                chunks.append(dumps({"cursor": token, "change": doc}) + "\n")
                        await _write(response, "".join(chunks).encode("utf-8"))
                        quiet_since = time.monotonic()
                except PyMongoError as exc:  # MongoDB away a moment: the feed waits for it
                    logger.info("change feed: MongoDB unavailable (%s), trying again", exc)
                else:
                    # every change up to the watermark is read: a filtered feed need not read
                    # the others again ("}" sorts after the "|" that ends an _id's time)
                    floor = f"{max(until, since or 0):013d}}}"
                    after = max(after, floor) if after is not None else floor
                if time.monotonic() - quiet_since >= _KEEPALIVE:
                    await _write(response, b": keep-alive\n\n" if sse else b"\n")
                    quiet_since = time.monotonic()
                await asyncio.sleep(_FEED_POLL)
        except (ConnectionResetError, TimeoutError, asyncio.CancelledError):
            logger.debug("a change feed client left")
        finally:
            self._feeds -= 1
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    async def runs(self, request: web.Request) -> web.StreamResponse:
        limit = _limit(request.query, default=20)
        found = (
            await self.database[self.mongo.runs_collection]
            .find({})
            .sort("ended", -1)
            .limit(limit)
            .to_list(limit)
        )
        return _json({"runs": found})

    async def run(self, request: web.Request) -> web.StreamResponse:
        report = await self.database[self.mongo.runs_collection].find_one(
            {"_id": request.match_info["run"]}
        )
        if report is None:
            return _error(f"no report of run {request.match_info['run'][:100]!r}", 404)
        return _json(report)

    # -- inside --------------------------------------------------------------------

    async def _bounds(self, q: Any, cursor: Cursor | None) -> tuple[int, int | None]:
        """A read's watermark (its cursor's, else now's) and its ``since`` (None: from the
        start)."""
        until = cursor.until_ms if cursor is not None else await self._watermark()
        return until, _since(q)

    async def _change_query(self, q: Any, cursor: Cursor | None) -> ChangeQuery:
        until, since = await self._bounds(q, cursor)
        for name in ("collection", "field", "item"):
            if len(q.get(name) or "") > 2048:
                raise BadParameterError(f"{name}: too long")
        return ChangeQuery(until, since, q.get("collection"), q.get("field"), q.get("item"))

    async def _page(
        self, request: web.Request, collection: Any, query: ItemQuery | ChangeQuery, limit: int,
        fmt: str, cursor: Cursor | None, key: str,
    ) -> web.StreamResponse:  # fmt: skip
        docs: list[dict[str, Any]] = []
        last = None
        async for page, read_to in pages(
            collection, query, after=cursor.after if cursor else None, size=limit, ahead=False
        ):
            docs, last = page, read_to
            break
        following = (
            Cursor(last, query.until_ms).encode()
            if last is not None and len(docs) == limit
            else None
        )
        # never behind the since it was asked with: a reader that keeps it reads nothing twice
        token = make_token(max(query.until_ms, query.since_ms or 0))
        headers = {"X-Token": token}
        if following is not None:
            headers["X-Next-Cursor"] = following
            url = request.rel_url.update_query({"cursor": following})
            headers["Link"] = f'<{url}>; rel="next"'
        if fmt == "json":
            body = {key: docs, "count": len(docs), "limit": limit, "cursor": following,
                    "token": token}  # fmt: skip
            return _json(body, headers)
        writer = writer_for(fmt, getattr(query, "fields", ()))
        data = writer.start() + writer.page(docs) + writer.end()
        return web.Response(body=data, headers={**headers, "Content-Type": CONTENT_TYPES[fmt]})


async def _write(response: web.StreamResponse, data: bytes) -> None:
    await asyncio.wait_for(response.write(data), _WRITE_TIMEOUT)


def _json(data: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=dumps(data), headers={**(headers or {}), "Content-Type": CONTENT_TYPES["json"]}
    )


def _limit(q: Any, default: int = _DEFAULT_LIMIT) -> int:
    text = q.get("limit")
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadParameterError(f"limit: {text[:20]!r} is not a number") from None
    if value < 1:
        raise BadParameterError("limit: at least 1")
    return min(value, MAX_PAGE)


def _format(q: Any) -> str:
    fmt = q.get("format", "json")
    if fmt not in FORMATS:
        raise BadParameterError(f"format: {fmt[:20]!r} is not one of {', '.join(FORMATS)}")
    return str(fmt)


def _since(q: Any) -> int | None:
    text = q.get("since")
    return read_token(text) if text else None


def _cursor(q: Any) -> Cursor | None:
    text = q.get("cursor")
    return Cursor.decode(text) if text else None


_PAGE_PARAMS = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
     "maximum": MAX_PAGE, "default": _DEFAULT_LIMIT}, "description": "documents in the page (capped)"},
    {"name": "cursor", "in": "query", "schema": {"type": "string"},
     "description": "the cursor of the previous page: the page after it, at its watermark"},
    {"name": "format", "in": "query", "schema": {"type": "string", "enum": list(FORMATS)}},
    {"name": "since", "in": "query", "schema": {"type": "string", "pattern": "^w[0-9]+$"},
     "description": "a token (a page's token, an export's): only what was written after it"},
]  # fmt: skip
_PAGE = {
    "200": {"description": "a page; the next one's cursor in cursor, X-Next-Cursor and Link"},
    "400": {"description": "a parameter that cannot be used: {error}"},
    "503": {"description": "MongoDB unreachable"},
}
#: The OpenAPI document of ``/api/v1`` (served at /api/v1/openapi.json).
OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "fleetcrawl data API", "version": "1"},
    "components": {
        "securitySchemes": {
            "basic": {"type": "http", "scheme": "basic"},
            "token": {
                "type": "http",
                "scheme": "bearer",
                "description": "a read-only token of DASHBOARD_API_TOKENS",
            },
        }
    },
    "security": [{"basic": []}, {"token": []}],
    "paths": {
        "/api/v1/collections": {
            "get": {
                "summary": "collections and their counts",
                "responses": {"200": {"description": "collections"}},
            }
        },
        "/api/v1/items/{collection}": {
            "get": {
                "summary": "a page of a collection's items, in _id order",
                "parameters": [
                    {
                        "name": "collection",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    *_PAGE_PARAMS,
                    {
                        "name": "fields",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "only these fields, comma-separated (dotted for nested ones)",
                    },
                    {"name": "omit", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "run",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "only items last seen in this crawl run",
                    },
                ],
                "responses": {**_PAGE, "404": {"description": "no such collection or run"}},
            }
        },
        "/api/v1/changes": {
            "get": {
                "summary": "a page of changes, in the order they were written",
                "parameters": [
                    *_PAGE_PARAMS,
                    *[
                        {"name": n, "in": "query", "schema": {"type": "string"}}
                        for n in ("field", "item", "collection")
                    ],
                ],
                "responses": _PAGE,
            }
        },
        "/api/v1/changes/feed": {
            "get": {
                "summary": "changes as they are stored (NDJSON, or server-sent events), resumable",
                "parameters": [
                    {"name": "since", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "a change's cursor: the feed resumes right after it",
                    },
                    {
                        "name": "format",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["ndjson", "sse"]},
                    },
                    *[
                        {"name": n, "in": "query", "schema": {"type": "string"}}
                        for n in ("field", "item", "collection")
                    ],
                ],
                "responses": {"200": {"description": "a stream"}, "400": _PAGE["400"]},
            }
        },
        "/api/v1/runs": {
            "get": {
                "summary": "the crawl runs' reports, newest first",
                "responses": {"200": {"description": "reports"}},
            }
        },
        "/api/v1/runs/{run}": {
            "get": {
                "summary": "one run's report",
                "parameters": [
                    {"name": "run", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "the report"},
                    "404": {"description": "no such run"},
                },
            }
        },
    },
}
