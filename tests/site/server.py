"""The test shop's Twisted web resource, and ``ShopServer``, which runs it in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self, cast

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests import forkserver
from tests.site.api import CATEGORIES_PATH, MAX_BODY_BYTES, PRODUCTS_PATH, CatalogueApi
from tests.site.articles import generate_journal
from tests.site.books import generate_library
from tests.site.catalogue import KINDS, generate_catalogue
from tests.site.conditional import entity_tag, http_date, last_modified, not_modified
from tests.site.defense import Defense
from tests.site.epochs import CatalogueHistory, EpochShares
from tests.site.hostile import HugeBody, stall
from tests.site.mixed import BEACON_PATH, CONTROL_PATH, EXPECTED_PATH, MixedSite, generate_mixed
from tests.site.pages import (
    HOSTILE_PAGES,
    PNG,
    STRAY_PATHS,
    category_pages,
    hostile_hrefs,
    hostile_page_parts,
    render_error,
    render_listing,
    render_product,
    render_robots,
    render_root,
)
from tests.site.reply import HTML, JSON, TEXT, Reply
from tests.site.sitemaps import INDEX_PATH, Sitemaps
from tests.site.stats import ShopStats

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from email.message import Message
    from types import TracebackType

    from twisted.internet.base import DelayedCall
    from twisted.internet.posixbase import PosixReactorBase
    from twisted.python.failure import Failure
    from twisted.web.server import Request

    from tests.site.articles import Journal
    from tests.site.books import Library
    from tests.site.catalogue import Catalogue
    from tests.site.config import ShopConfig
    from tests.site.stats import Timed

__all__ = ["Fetched", "ShopResource", "ShopServer", "end_child", "run"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_PRODUCT_PATH = re.compile(r"/product/(\d+)")
_CATEGORY_PATH = re.compile(r"/category/([a-z0-9-]+)")
_IMAGE_PATH = re.compile(r"/img/(\d+)-(\d+)\.jpg")
_HOSTILE_NAMES = {path: name for name, path in HOSTILE_PAGES.items()}
#: Path prefixes of the sections beyond the shop (:meth:`ShopResource._section`).
_SECTIONS = ("/api/", "/sitemap", "/articles/", "/books/", "/mixed/")
#: Product kinds whose pages carry no validators (see :class:`ShopResource`).
_UNVALIDATED_KINDS = frozenset({"js", "flaky", "broken"})


class ShopResource(Resource):
    """Serves every page of the shop; control endpoints start with ``/_`` and are not counted.

    The catalogue served is that of one epoch (:mod:`tests.site.epochs`), ``--epoch`` at start,
    another from ``/_epoch?set=N`` on. Validators and 304s (:mod:`tests.site.conditional`) are
    on the home page, every listing page, the product pages of the plain and malformed kinds
    (slow or not) and the sitemaps. Without them: js product pages (Chromium renders them, and
    its cache must not turn a test's second render into a 304), flaky and broken ones (their
    answer changes from one request to the next), the 429s of the burst, every error, robots.txt,
    the images, the API, the book, article and mixed sites and the hostile pages (the mixed
    site's pages also say ``cache-control: no-store``).
    """

    isLeaf = True

    def __init__(self, config: ShopConfig, catalogue: Catalogue, clock: PosixReactorBase) -> None:
        super().__init__()
        self._config = config
        self._clock = clock
        self._stats = ShopStats()
        shares = EpochShares(
            price=config.epoch_price_share,
            stock=config.epoch_stock_share,
            added=config.epoch_added,
            removed=config.epoch_removed,
        )
        self._history = CatalogueHistory(catalogue, shares)
        # The book and article sites, the sitemaps and the API: nothing of the shop links them.
        self._library = generate_library(config.books, config.seed)
        self._journal = generate_journal(config.articles, config.seed)
        self._sitemaps = Sitemaps(self._journal, self._library)
        self._mixed: MixedSite | None = None
        if config.mixed:
            mixed = generate_mixed(
                config.mixed,
                config.seed,
                js_share=config.mixed_js_share,
                deal_share=config.mixed_deal_share,
            )
            self._mixed = MixedSite(mixed, config.page_size, config.mixed_switch_after)
        self._hostile_links = hostile_hrefs(config.hostile_ports) if config.hostile else []
        #: The last ``/_catalogue`` answered, by (epoch, since): tests ask for it again and again.
        self._payload: tuple[tuple[int, int | None], bytes] | None = None
        #: Paths answered with an error status until told otherwise (``/_fail``): a site in
        #: maintenance for one crawl.
        self._failing: dict[str, int] = {}
        #: --knee: requests being served, and those waiting their turn
        self._knee_busy = 0
        self._knee_waiting: deque[list[Any]] = deque()
        self._defense = Defense(
            config.bans,
            config.ban_after,
            config.ban_answer,
            config.block_first,
            config.block_first_answer,
        )
        self._serve(config.epoch)

    def _serve(self, epoch: int) -> None:
        """Serve the catalogue of *epoch* from now on; a ``ValueError`` if there is none."""
        catalogue = self._history.at(epoch)
        self._epoch = epoch
        self._catalogue = catalogue
        self._root_html = render_root(catalogue).encode()
        self._api = CatalogueApi(catalogue, self._config.page_size)
        self._expected = {kind: catalogue.ids_of_kind(kind) for kind in KINDS}
        self._expected["slow"] = [p.id for p in catalogue.products if p.slow]

    def render(self, request: Request) -> bytes | int:
        """Answer one request, after the configured latency."""
        path = request.path.decode("utf-8", "replace")
        if path.startswith("/_") and (control := self._control(request, path)) is not None:
            return control

        match = _PRODUCT_PATH.fullmatch(path)
        product_id = int(match.group(1)) if match else None
        headers = request.requestHeaders
        agent = (headers.getRawHeaders(b"user-agent") or [b""])[0].decode("utf-8", "replace")
        timed = self._stats.record_request(
            request.uri.decode("utf-8", "replace"), product_id, agent[:100]
        )
        if headers.hasHeader(b"if-none-match") or headers.hasHeader(b"if-modified-since"):
            self._stats.conditional += 1
        # Fires once the response is written to its end (at once without latency, in _finish
        # after it, when a hostile page ends) or when the client went away first (_cancel).
        request.notifyFinish().addBoth(_ended, timed)
        if (status := self._failing.get(path)) is not None:
            self._stats.record_status(status)
            return self._respond(request, Reply(status, render_error(status, "Failing").encode()))
        address = request.getClientAddress()
        visitor = (request.getCookie(b"visitor") or b"").decode("ascii", "replace")[:40]
        if not visitor and path != "/robots.txt":
            visitor = self._defense.new_visitor()
            request.addCookie(b"visitor", visitor.encode(), path=b"/")
        defended = self._defense.answer(getattr(address, "host", ""), path, visitor=visitor)
        if defended is not None:
            reply = self._defense.reply(defended, request.uri.decode("utf-8", "replace"))
            self._stats.record_status(reply.status)
            return self._respond(request, reply)
        hostile = self._hostile_name(path)
        if hostile is not None:
            return self._hostile(request, hostile)
        reply = (
            self._product(request, product_id)
            if product_id is not None
            else self._page(request, path)
        )
        reply = self._validated(request, reply)
        self._stats.record_status(reply.status)
        return self._respond(request, reply)

    def _control(self, request: Request, path: str) -> bytes | None:
        """Answer a control endpoint; ``None`` if *path* is none (it is served as a page)."""
        if path == "/_stats":
            payload = {"products": len(self._catalogue.products), **self._stats.as_dict()}
            payload.update(config=self._config.as_dict(), expected=self._expected)
            payload["hostile_links"] = [href for _, href in self._hostile_links]
            payload["epoch"] = self._epoch
            payload.update(self._defense.as_dict())
            return self._json(request, payload)
        if path == "/_ban":
            # /_ban?address=127.0.0.3&answer=403 (off=1: lift the ban)
            target = request.args.get(b"address", [b""])[0].decode("utf-8", "replace")
            answer = request.args.get(b"answer", [b"challenge"])[0].decode("utf-8", "replace")
            try:
                if request.args.get(b"off"):
                    self._defense.unban(target)
                else:
                    self._defense.ban(target, answer)
            except ValueError as exc:
                request.setResponseCode(400)
                return self._json(request, {"error": str(exc)})
            return self._json(request, {"banned": self._defense.banned})
        if path == "/_reset":
            self._stats.reset()
            self._defense.reset()
            if self._mixed is not None:
                self._mixed.reset()
            return self._json(request, {"reset": True})
        if path == "/_timeline":
            return self._json(request, self._stats.timeline_dict())
        if path == "/_fail":
            # /_fail?path=/&status=503 (status 0: answer it again)
            target = request.args.get(b"path", [b""])[0].decode("utf-8", "replace")
            status = _int_arg(request, b"status", default=0) or 0
            if status:
                self._failing[target] = status
            else:
                self._failing.pop(target, None)
            return self._json(request, {"failing": self._failing})
        if path in (CONTROL_PATH, BEACON_PATH, EXPECTED_PATH):
            return self._mixed_control(request, path)
        if path not in ("/_catalogue", "/_changes", "/_epoch"):
            return None
        try:
            if path == "/_epoch":
                if (target := _epoch_arg(request, b"set")) is not None:
                    self._serve(target)
                return self._json(request, {"epoch": self._epoch})
            epoch = _epoch_arg(request, b"epoch")
            epoch = self._epoch if epoch is None else epoch
            since = _epoch_arg(request, b"since")
            since = epoch - 1 if since is None and epoch > 0 else since
            if path == "/_changes":
                return self._json(request, {"epoch": epoch, **self._changes(epoch, since)})
            return self._catalogue_json(request, epoch, since)
        except ValueError as exc:  # a bad argument, or an epoch out of range
            request.setResponseCode(400)
            return self._json(request, {"error": str(exc)})

    def _mixed_control(self, request: Request, path: str) -> bytes:
        """``/_mixed`` (``?switch=1``: deal pages JavaScript-only from now on, ``0``: static),
        ``/_mixed/expected`` and ``/_mixed/beacon?path=...``, a render of a page served."""
        if self._mixed is None:
            request.setResponseCode(404)
            return self._json(request, {"error": "the mixed site is off (--mixed 0)"})
        if path == EXPECTED_PATH:
            return self._json(request, self._mixed.expected(_base_url(request)))
        name = b"path" if path == BEACON_PATH else b"switch"
        values = request.args.get(name, []) if request.args else []
        if len(values) > 1:
            request.setResponseCode(400)
            return self._json(request, {"error": f"{name.decode()} is given {len(values)} times"})
        value = values[0].decode("utf-8", "replace") if values else None
        if path == CONTROL_PATH:
            if value not in (None, "0", "1"):
                request.setResponseCode(400)
                return self._json(request, {"error": f"switch must be 0 or 1, got {value[:40]!r}"})
            if value is not None:
                self._mixed.switch(value == "1")
            return self._json(request, self._mixed.state())
        # Only a page the site served can be rendered: a stranger's paths cannot grow the count.
        if value is None or value not in self._stats.mixed_hits:
            request.setResponseCode(400)
            shown = "nothing" if value is None else repr(value[:80])
            return self._json(request, {"error": f"path names no page served: {shown}"})
        self._stats.mixed_renders[value] += 1
        return self._json(request, {"renders": self._stats.mixed_renders[value]})

    def _changes(self, epoch: int, since: int | None) -> dict[str, object]:
        """``{"since": since, "price": [...], "availability": ..., "added": ..., "removed": ...}``:
        what changed from epoch *since* to *epoch*, nothing if *since* is ``None``."""
        changes = self._history.changes(epoch if since is None else since, epoch)
        return {"since": since, **changes.as_dict()}

    def _catalogue_json(self, request: Request, epoch: int, since: int | None) -> bytes:
        if self._payload is None or self._payload[0] != (epoch, since):
            changes = self._changes(epoch, since)  # a ValueError for an epoch out of range
            catalogue = self._history.at(epoch)
            payload = _catalogue_payload(
                catalogue, self._config.page_size, self._library, self._journal
            )
            payload.update(epoch=epoch, changes=changes)
            self._payload = ((epoch, since), json.dumps(payload).encode())
        request.setHeader(b"content-type", JSON)
        return self._payload[1]

    def _changed(self, page: Hashable, content: Callable[[Catalogue], object]) -> int:
        """The epoch since which *page* (what ``content`` renders of a catalogue) is the same."""
        return self._history.changed_at(page, self._epoch, content)

    def _validated(self, request: Request, reply: Reply) -> Reply:
        """*reply* with its validators if it has some, or a 304 if the client's are current."""
        if reply.changed is None or reply.status != 200:
            return reply
        etag = entity_tag(reply.body)
        modified = last_modified(reply.changed)
        reply.headers.update(
            {b"etag": etag, b"last-modified": http_date(modified), b"cache-control": b"no-cache"}
        )
        headers = request.requestHeaders
        if request.method in (b"GET", b"HEAD") and not_modified(
            etag,
            modified,
            headers.getRawHeaders(b"if-none-match", []),
            headers.getRawHeaders(b"if-modified-since", []),
        ):
            return Reply(304, b"", reply.content_type, reply.headers, reply.extra_delay)
        return reply

    def _listing(self, catalogue: Catalogue, slug: str, page: int) -> str | None:
        """A listing page of *catalogue*, or ``None`` if it has no such page."""
        category = catalogue.category(slug)
        size = self._config.page_size
        if category is None or not 1 <= page <= category_pages(category, size):
            return None
        return render_listing(catalogue, category, page, size, self._hostile_links)

    def _page(self, request: Request, path: str) -> Reply:
        if path == "/":
            return Reply(200, self._root_html, changed=self._changed(("root",), render_root))
        if path == "/robots.txt":
            sitemap = _base_url(request) + INDEX_PATH
            config = self._config
            robots = render_robots(config.robots_crawl_delay, list(config.robots_disallow), sitemap)
            return Reply(200, robots.encode(), TEXT)
        if path.startswith(_SECTIONS) and (reply := self._section(request, path)) is not None:
            return reply
        if match := _CATEGORY_PATH.fullmatch(path):
            slug, page = match.group(1), _int_arg(request, b"page", default=1)
            if page is not None and (html := self._listing(self._catalogue, slug, page)):
                changed = self._changed(
                    ("listing", slug, page), lambda c: self._listing(c, slug, page)
                )
                return Reply(200, html.encode(), changed=changed)
        elif match := _IMAGE_PATH.fullmatch(path):
            product_id = int(match.group(1))
            product = self._catalogue.product(product_id) or (
                self._mixed.product(product_id) if self._mixed is not None else None
            )
            if product is not None and 1 <= int(match.group(2)) <= len(product.images):
                return Reply(200, PNG, b"image/png")
        return Reply(404, render_error(404, "Not Found").encode())

    def _section(self, request: Request, path: str) -> Reply | None:
        """The API, the sitemaps, the article, book and mixed sites; ``None`` for a 404."""
        base_url = _base_url(request)
        if path.startswith("/mixed/"):
            page = _int_arg(request, b"page", default=1)
            html = self._mixed.render(path, page, base_url) if self._mixed is not None else None
            if html is None:
                return None
            if request.method == b"GET":
                self._stats.mixed_hits[request.uri.decode("utf-8", "replace")] += 1
            return Reply(200, html.encode(), headers={b"cache-control": b"no-store"})
        if path == CATEGORIES_PATH:
            self._stats.api_hits["categories"] += 1
            return self._api.categories(base_url)
        if path == PRODUCTS_PATH:
            body = request.content.read(MAX_BODY_BYTES + 1) if request.content else b""
            reply, key = self._api.products(request.method, body, base_url)
            if key is not None:
                self._stats.api_hits[key] += 1
            return reply
        if (sitemap := self._sitemaps.render(path, base_url)) is not None:
            return Reply(200, *sitemap, changed=0)  # the same in every epoch
        if path.startswith("/articles/"):
            html = self._journal.render(path)
            if self._journal.article_at(path) is not None:
                self._stats.article_hits[path] += 1
        elif path.startswith("/books/"):
            html = self._library.render(path)
            if self._library.book_at(path) is not None:
                self._stats.book_hits[path] += 1
        else:
            return None
        return None if html is None else Reply(200, html.encode())

    def _hostile_name(self, path: str) -> str | None:
        if not self._config.hostile:
            return None
        if path in STRAY_PATHS:
            return "stray:" + path
        if not path.startswith("/hostile/"):
            return None
        long_url = HOSTILE_PAGES["long-url"]
        return "long-url" if path.startswith(long_url) else _HOSTILE_NAMES.get(path)

    def _hostile(self, request: Request, name: str) -> bytes | int:
        """The pages of ``--hostile``: each answers the way its name says, for ever; a stray
        path (a hostile link misread) is a 404, counted under ``stray:<path>``."""
        self._stats.hostile[name] += 1
        if name in ("retry-after-huge", "retry-after-garbage"):
            value = b"99999999999" if name == "retry-after-huge" else b"soon"
            reply = Reply(503, render_error(503, "Service Unavailable").encode())
            reply.headers[b"retry-after"] = value
        elif name == "throttled":
            reply = Reply(429, render_error(429, "Too Many Requests").encode())
        elif name.startswith("stray:"):
            reply = Reply(404, render_error(404, "Not Found").encode())
        else:
            head, tail = hostile_page_parts(name, _base_url(request))
            self._stats.record_status(200)
            request.setHeader(b"content-type", HTML)
            if name == "huge":
                # No Content-Length: the client only learns the size by reading it.
                HugeBody(request, head, tail, self._config.huge_bytes, self._stats).start()
                return NOT_DONE_YET
            if name == "stall":
                stall(request, head, tail, self._config.stall_seconds, self._clock, self._stats)
                return NOT_DONE_YET
            self._stats.body_bytes += len(head) + len(tail)
            return head + tail  # long-url: a whole page, if a client ever asks for it
        self._stats.record_status(reply.status)
        return self._respond(request, reply)

    def _product(self, request: Request, product_id: int) -> Reply:
        product = self._catalogue.product(product_id)
        if product is None:
            return Reply(404, render_error(404, "Not Found").encode())
        extra = self._config.slow_ms / 1000.0 if product.slow else 0.0
        if self._stats.product_requests <= self._config.retry_after_burst:
            headers = {b"retry-after": str(self._config.retry_after).encode()}
            return Reply(
                429,
                render_error(429, "Too Many Requests").encode(),
                headers=headers,
                extra_delay=extra,
            )
        if product.kind == "flaky":
            self._stats.flaky_fetches[product_id] += 1
        if product.kind == "broken" or (
            product.kind == "flaky"
            and self._stats.flaky_fetches[product_id] <= self._config.flaky_failures
        ):
            return Reply(503, render_error(503, "Service Unavailable").encode(), extra_delay=extra)
        html = render_product(product, _base_url(request))
        changed = None
        if product.kind not in _UNVALIDATED_KINDS:
            changed = self._changed(("product", product_id), lambda c: c.product(product_id))
        return Reply(200, html.encode(), extra_delay=extra, changed=changed)

    def _respond(self, request: Request, reply: Reply) -> bytes | int:
        request.setResponseCode(reply.status)
        if reply.status != 304:
            request.setHeader(b"content-type", reply.content_type)
        for name, value in reply.headers.items():
            request.setHeader(name, value)
        delay = self._config.latency_ms / 1000.0 + reply.extra_delay
        if request.uri.decode("utf-8", "replace") in self._config.slow_paths:
            delay += self._config.slow_ms / 1000.0
        if delay <= 0 and reply.status != 304:
            self._stats.body_bytes += _sent(request, reply.body)
            return reply.body
        # A 304 has no body and no Content-Length: Twisted would send 0, not the 200's length.
        if reply.status != 304:
            request.setHeader(b"content-length", b"%d" % len(reply.body))
        if delay <= 0:
            _finish(request, reply.body, self._stats)
            return NOT_DONE_YET
        if self._config.knee:
            self._queue_for_knee(request, reply.body, delay)
            return NOT_DONE_YET
        call = self._clock.callLater(delay, _finish, request, reply.body, self._stats)
        request.notifyFinish().addErrback(_cancel, call)
        return NOT_DONE_YET

    def _queue_for_knee(self, request: Request, body: bytes, delay: float) -> None:
        """--knee: at most that many requests are served at once; the others wait in turn."""
        waiting = self._knee_waiting

        def serve(entry: list[Any]) -> None:
            self._knee_busy += 1
            entry[2] = self._clock.callLater(delay, done, entry)

        def done(entry: list[Any]) -> None:
            self._knee_busy -= 1
            _finish(entry[0], entry[1], self._stats)
            while waiting and self._knee_busy < self._config.knee:
                serve(waiting.popleft())

        def gone(_: object, entry: list[Any]) -> None:
            call = entry[2]
            if call is None:
                with contextlib.suppress(ValueError):
                    waiting.remove(entry)
            elif call.active():
                call.cancel()
                self._knee_busy -= 1
                while waiting and self._knee_busy < self._config.knee:
                    serve(waiting.popleft())

        entry: list[Any] = [request, body, None]
        request.notifyFinish().addErrback(gone, entry)
        if self._knee_busy < self._config.knee:
            serve(entry)
        else:
            waiting.append(entry)

    @staticmethod
    def _json(request: Request, payload: object) -> bytes:
        request.setHeader(b"content-type", JSON)
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(payload).encode()


def end_child(process: subprocess.Popen[bytes] | None, stderr: IO[bytes] | None) -> None:
    """Terminate *process* (kill it if it does not exit in 10 s), close its pipe and *stderr*."""
    if process is not None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
    if stderr is not None:
        stderr.close()


def _finish(request: Request, body: bytes, stats: ShopStats) -> None:
    request.write(body)
    stats.body_bytes += _sent(request, body)
    request.finish()


def _sent(request: Request, body: bytes) -> int:
    """Body bytes that answering *request* with *body* puts on the wire."""
    return 0 if request.method == b"HEAD" else len(body)


def _ended(result: Failure | None, timed: Timed) -> None:
    # Returns None: a client that went away is an end like any other, not an error to log.
    timed.end()


def _cancel(failure: Failure, call: DelayedCall) -> None:
    # The client went away before the latency elapsed: nothing left to answer.
    if call.active():
        call.cancel()


def _int_arg(request: Request, name: bytes, default: int) -> int | None:
    values = request.args.get(name) if request.args else None
    if not values:
        return default
    try:
        return int(values[0])
    except ValueError:
        return None


def _epoch_arg(request: Request, name: bytes) -> int | None:
    """An epoch argument of a control endpoint, ``None`` if absent; a ``ValueError`` (a 400)
    if it is not an integer."""
    values = request.args.get(name) if request.args else None
    if not values:
        return None
    try:
        return int(values[0])
    except ValueError as exc:
        raise ValueError(f"{name.decode()} must be an integer, got {values[0][:40]!r}") from exc


def _base_url(request: Request) -> str:
    host = request.getHeader(b"host")
    if host:
        return f"http://{host.decode('ascii', 'replace')}"
    address = request.getHost()
    return f"http://{address.host}:{address.port}"


def _catalogue_payload(
    catalogue: Catalogue, page_size: int, library: Library, journal: Journal
) -> dict[str, object]:
    products = [
        {
            "id": p.id,
            "name": p.name,
            "price": p.price,
            "currency": p.currency,
            "sku": p.sku,
            "availability": p.availability,
            "description": p.description,
            "breadcrumb": list(p.breadcrumb),
            "images": list(p.images),
            "categories": list(p.categories),
            "kind": p.kind,
            "slow": p.slow,
            "page_price": p.page_price,
            "url": p.url,
        }
        for p in catalogue.products
    ]
    categories = [
        {
            "slug": c.slug,
            "name": c.name,
            "url": f"/category/{c.slug}?page=1",
            "pages": category_pages(c, page_size),
            "product_ids": list(c.product_ids),
        }
        for c in catalogue.categories
    ]
    return {
        "seed": catalogue.seed,
        "products": products,
        "categories": categories,
        **library.as_dict(),
        **journal.as_dict(),
    }


def run(config: ShopConfig) -> None:
    """Serve the shop until the reactor stops (SIGTERM, SIGINT); print the bound URL first."""
    from twisted.internet import reactor as installed

    # The interfaces are zope ones that mypy cannot read; the default reactor is a posix one.
    reactor = cast("PosixReactorBase", installed)
    catalogue = generate_catalogue(
        config.products,
        config.seed,
        js_share=config.js_share,
        malformed_share=config.malformed_share,
        flaky_share=config.flaky_share,
        broken_share=config.broken_share,
        slow_share=config.slow_share,
    )
    site = Site(ShopResource(config, catalogue, reactor))
    port = reactor.listenTCP(config.port, site, backlog=1024, interface=config.host)
    address = port.getHost()
    sys.stdout.write(f"LISTENING http://{address.host}:{address.port}\n")
    sys.stdout.flush()
    reactor.run()


@dataclass(frozen=True)
class Fetched:
    """A page of the shop as :meth:`ShopServer.fetch` got it; header names in lower case."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode()

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class ShopServer:
    """Runs ``python -m tests.site`` on a free port for the duration of a ``with`` block.

    Keyword options become command-line flags: ``js_share=0.1`` is ``--js-share 0.1``, a list is
    repeated (``robots_disallow=["/a", "/b"]``), ``True`` is the bare flag (``hostile=True``),
    ``None`` and ``False`` are left out.
    """

    def __init__(
        self,
        products: int = 200,
        *,
        seed: int = 0,
        latency_ms: float = 0,
        page_size: int = 20,
        startup_timeout: float = 20.0,
        **options: object,
    ) -> None:
        options.update(products=products, seed=seed, latency_ms=latency_ms, page_size=page_size)
        self.args: list[str] = ["--port", "0", *_flags(options)]
        self.base_url: str = ""
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | forkserver.Forked | None = None
        self._stderr: IO[bytes] | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def port(self) -> int:
        """The port the shop listens on."""
        return int(self.base_url.rsplit(":", 1)[1])

    def url(self, path: str = "/") -> str:
        """Absolute URL of ``path`` on the shop."""
        if not self.base_url:
            raise RuntimeError("the shop is not running")
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def stats(self) -> dict[str, Any]:
        """Current ``/_stats``."""
        return self._get_json("/_stats")

    def timeline(self) -> list[list[Any]]:
        """``[arrival, finish or None, path, user agent]`` of every counted request since start or reset."""
        requests: list[list[Any]] = self._get_json("/_timeline")["requests"]
        return requests

    def catalogue(self, epoch: int | None = None, *, since: int | None = None) -> dict[str, Any]:
        """Ground truth from ``/_catalogue``: the catalogue of *epoch* (default: the one served),
        with ``"epoch"`` and the ``"changes"`` since epoch *since* (default: the one before)."""
        return self._get_json("/_catalogue" + _query(epoch=epoch, since=since))

    def epoch(self) -> int:
        """The epoch the shop serves."""
        epoch: int = self._get_json("/_epoch")["epoch"]
        return epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve the catalogue of *epoch* from the next request on (one that arrived before
        keeps its epoch); a ``ValueError`` if there is none (see ``tests.site.epochs``)."""
        self._get_json("/_epoch" + _query(set=epoch))

    def changes(self, since: int | None = None, epoch: int | None = None) -> dict[str, Any]:
        """What changed from epoch *since* (default: the one before) to *epoch* (default: the
        one served): ``{"epoch", "since", "price", "availability", "added", "removed"}``."""
        return self._get_json("/_changes" + _query(since=since, epoch=epoch))

    def book_urls(self) -> set[str]:
        """Absolute URL of every book page: what a complete crawl of ``/books/`` fetches."""
        return {self.url(book["url"]) for book in self.catalogue()["books"]}

    def article_urls(self) -> set[str]:
        """Absolute URL of every article page: what a complete crawl of ``/articles/`` fetches."""
        return {self.url(article["url"]) for article in self.catalogue()["articles"]}

    def reset(self) -> None:
        """Clear the counters and the flaky/burst progress (and the mixed site's deal switch)."""
        self._get_json("/_reset")

    def mixed_expected(self) -> dict[str, Any]:
        """Ground truth of the mixed site (``--mixed``): ``{"products": {absolute URL: {"name",
        "price", "currency", "sku", "availability", "description", "pattern"}}, "switched",
        "deal_served"}``."""
        return self._get_json("/_mixed/expected")

    def mixed_switch(self, on: bool) -> dict[str, Any]:
        """Serve the mixed site's deal pages JavaScript-only (*on*) or static from now on;
        returns ``{"switched", "deal_served"}``."""
        return self._get_json("/_mixed?switch=" + ("1" if on else "0"))

    def ban(self, address: str, answer: str = "challenge", *, off: bool = False) -> None:
        """Ban the client *address* with *answer* from now on (tests.site.defense); *off*: lift
        its ban."""
        query = {"address": address, "answer": answer, **({"off": "1"} if off else {})}
        self._get_json("/_ban?" + urllib.parse.urlencode(query))

    def fail(self, path: str, status: int) -> None:
        """Answer *path* (as linked, without its query) with *status* from now on; 0: as
        before."""
        self._get_json("/_fail?" + urllib.parse.urlencode({"path": path, "status": status}))

    def fetch(
        self,
        path: str,
        data: bytes | None = None,
        *,
        method: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Fetched:
        """Request *path* (a POST of *data* if given) as any client would: it is counted."""
        request = urllib.request.Request(
            self.url(path), data=data, headers=headers or {}, method=method
        )
        try:
            with self._opener.open(request, timeout=30) as response:
                return Fetched(response.status, _lower(response.headers), response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return Fetched(exc.code, _lower(exc.headers), exc.read())

    def _get_json(self, path: str) -> dict[str, Any]:
        try:
            with self._opener.open(self.url(path), timeout=30) as response:
                payload: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code != 400:
                    raise
                raise ValueError(json.load(exc)["error"]) from exc
        return payload

    def start(self) -> Self:
        """Start the subprocess and wait for the port it bound."""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._process = forkserver.spawn(
            "tests.site",
            self.args,
            cwd=_REPO_ROOT,
            env=os.environ,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        try:
            self.base_url = self._read_url(self._process)
        except BaseException:
            self.stop()
            raise
        return self

    def _read_url(self, process: subprocess.Popen[bytes] | forkserver.Forked) -> str:
        assert process.stdout is not None
        deadline = time.monotonic() + self._startup_timeout
        remaining = self._startup_timeout
        while remaining > 0:
            ready, _, _ = select.select([process.stdout], [], [], remaining)
            if ready:
                line = process.stdout.readline().decode("utf-8", "replace").split()
                if len(line) == 2 and line[0] == "LISTENING":
                    return line[1]
                _wait_quietly(process, timeout=5)
                break
            remaining = deadline - time.monotonic()
        raise RuntimeError(f"the test shop did not start ({' '.join(self.args)}): {self._errors()}")

    def _errors(self) -> str:
        if self._stderr is None:
            return ""
        if self._process is not None and self._process.poll() is None:
            return "no LISTENING line"
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-2000:]

    def stop(self) -> None:
        """Terminate the subprocess (kill it if it does not exit)."""
        process, self._process = self._process, None
        stderr, self._stderr = self._stderr, None
        end_child(process, stderr)
        self.base_url = ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _query(**arguments: int | None) -> str:
    """``?name=value&...`` of the arguments that are not ``None``; ``""`` if none is."""
    given = {name: value for name, value in arguments.items() if value is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""


def _lower(headers: Message) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _wait_quietly(process: subprocess.Popen[bytes] | forkserver.Forked, timeout: float) -> None:
    # A process that is still running after that is killed by stop().
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)


def _flags(options: dict[str, object]) -> list[str]:
    flags: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags += [flag] if value else []
            continue
        values = value if isinstance(value, list | tuple) else [value]
        for item in values:
            if item is not None:
                flags += [flag, str(item)]
    return flags
