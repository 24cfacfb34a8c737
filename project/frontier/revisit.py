"""Revisits: seen URLs fetched again once their interval passed, conditionally.

``FRONTIER_REVISIT`` maps URL patterns (regular expressions searched in the URL) and callbacks
(``"@parse_product"``) to intervals (``"1h"``, ``"1d"``, seconds). A request it matches is
enqueued in revisit mode: dropped as seen, unless the interval since its last fetch passed
(lua/step/revisit.lua keeps, per such URL only, what that fetch left). With
``FRONTIER_KEEP_ALIVE`` the frontier also hands the due revisits out itself.

A revisit carries the last fetch's validators (``If-None-Match``, ``If-Modified-Since``).
``304 Not Modified`` is unchanged: nothing is parsed, and the items the page gave last time
get ``last_seen`` bumped. Otherwise the page is parsed, and its body's hash tells changed
from unchanged. ``revisit/not_modified``, ``revisit/changed``, ``revisit/unchanged`` count them.

``FRONTIER_REVISIT_ADAPTIVE``: a URL's interval shrinks by a fifth when its page changed and
grows by two fifths when it did not, within ``FRONTIER_REVISIT_MIN`` and ``FRONTIER_REVISIT_MAX``
(Nutch's AdaptiveFetchSchedule: ``inc_rate`` 0.4, ``dec_rate`` 0.2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured

from project.config import read_settings, setting
from project.frontier.meta import (
    REVISIT_META_KEY,
    REVISIT_OUT_META_KEY,
    REVISIT_UNSURE_META_KEY,
)
from project.frontier.signals import (
    item_stored_ref,
    items_gone,
    items_still_there,
    seen_set_opened,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from project.frontier.dupefilter import FleetDupeFilter

__all__ = [
    "NotModified",
    "RevisitConfig",
    "RevisitLinksMiddleware",
    "RevisitMiddleware",
    "RevisitParseGuard",
    "gone_refs",
    "mark_gone",
    "parse_duration",
    "revisit_entries",
    "touch_items",
]

logger = logging.getLogger(__name__)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
INC_RATE, DEC_RATE = 0.4, 0.2
#: Items a page's record names for a 304 to bump; a page with more is always fetched whole.
_MAX_ITEMS = 100
#: FRONTIER_REVISIT_MAX_RECORD_BYTES' default: what one URL's record may cost in Redis.
MAX_RECORD_BYTES = 8192
_MAX_VALIDATOR = 256
_MAX_REF = 512
#: A page answering these is gone: its URL is no longer revisited.
_FORGET_STATUSES = frozenset({404, 410})


def parse_duration(value: object, name: str = "duration") -> float:
    """Seconds in ``90``, ``"90"``, ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"`` or ``"2w"``."""
    if isinstance(value, bool):
        raise NotConfigured(f"{name}: {value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise NotConfigured(f"{name}: {str(value)[:50]!r} is not a duration (90, 30s, 1h, 1d)")
        seconds = float(match[1]) * _UNITS[(match[2] or "s").lower()]
    if not 0 <= seconds <= 10 * 365 * 86400:
        raise NotConfigured(f"{name}: {value!r} is not between 0 and 10 years")
    return seconds


#: FRONTIER_REVISIT_MIN's and FRONTIER_REVISIT_MAX's defaults, which ``bounds`` holds in seconds.
_MIN_INTERVAL, _MAX_INTERVAL = "1h", "14d"


class NotModified(IgnoreRequest):
    """The page did not change since its last fetch (304): nothing to parse."""


@dataclass(frozen=True)
class RevisitConfig:
    """FRONTIER_REVISIT_*: which URLs are fetched again, and how often."""

    policies: dict[str, Any] = setting("FRONTIER_REVISIT", {})
    adaptive: bool = setting("FRONTIER_REVISIT_ADAPTIVE", False)
    min_interval: str = setting("FRONTIER_REVISIT_MIN", _MIN_INTERVAL)
    max_interval: str = setting("FRONTIER_REVISIT_MAX", _MAX_INTERVAL)
    #: Before a crawl run ends, fetch the due pages it did not rediscover (a page no longer
    #: linked answers 404 or no longer yields its items: they are gone).
    sweep: bool = setting("FRONTIER_REVISIT_SWEEP", True)
    #: Revisit records in all and of one site: a new URL past either is fetched, not recorded
    #: (about 0.6 KB each: 10^7 records are about 6 GB of Redis).
    max_urls: int = setting("FRONTIER_REVISIT_MAX_URLS", 10_000_000)
    max_site_urls: int = setting("FRONTIER_REVISIT_MAX_SITE_URLS", 1_000_000)
    #: Bytes one record may take (its request and what its page gave): a page naming more
    #: items keeps none (fetched whole next time); a request bigger than this is not kept.
    max_record_bytes: int = setting("FRONTIER_REVISIT_MAX_RECORD_BYTES", MAX_RECORD_BYTES)
    #: A record no run rediscovered in more than this many runs in a row (the sweep fetched
    #: it each time), over at least FRONTIER_REVISIT_FORGET_AFTER, is forgotten. 0: never.
    forget_runs: int = setting("FRONTIER_REVISIT_FORGET_RUNS", 3)
    #: "": three times the longest FRONTIER_REVISIT interval (a page linked only from the
    #: slowest listing is rediscovered within it).
    forget_after: str = setting("FRONTIER_REVISIT_FORGET_AFTER", "")
    rules: tuple[tuple[re.Pattern[str] | str, float], ...] = field(default=())
    #: FRONTIER_REVISIT_FORGET_AFTER in seconds (its default worked out)
    forget_window: float = 0.0
    #: min_interval and max_interval in seconds
    bounds: tuple[float, float] = (
        parse_duration(_MIN_INTERVAL, "FRONTIER_REVISIT_MIN"),
        parse_duration(_MAX_INTERVAL, "FRONTIER_REVISIT_MAX"),
    )

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(cls, settings)
        rules: list[tuple[re.Pattern[str] | str, float]] = []
        for key, interval in values["policies"].items():
            seconds = parse_duration(interval, f"FRONTIER_REVISIT[{key!r}]")
            if not isinstance(key, str) or not key:
                raise NotConfigured(f"FRONTIER_REVISIT: {key!r} is not a URL pattern or @callback")
            if key.startswith("@"):
                rules.append((key[1:], seconds))
                continue
            try:
                rules.append((re.compile(key), seconds))
            except re.error as exc:
                raise NotConfigured(
                    f"FRONTIER_REVISIT[{key!r}]: not a regular expression ({exc})"
                ) from exc
        low = parse_duration(values["min_interval"], "FRONTIER_REVISIT_MIN")
        high = parse_duration(values["max_interval"], "FRONTIER_REVISIT_MAX")
        if not 0 < low <= high:
            raise NotConfigured(
                "FRONTIER_REVISIT_MIN must be above 0 and at most FRONTIER_REVISIT_MAX"
            )
        values["rules"], values["bounds"] = tuple(rules), (low, high)
        if values["forget_after"]:
            window = parse_duration(values["forget_after"], "FRONTIER_REVISIT_FORGET_AFTER")
        else:
            window = 3 * max((seconds for _, seconds in rules), default=0.0)
        values["forget_window"] = window
        for name in ("max_urls", "max_site_urls", "forget_runs", "max_record_bytes"):
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise NotConfigured(f"FRONTIER_REVISIT_{name.upper()}: {value!r} is not a count")
        return cls(**values)

    def limits(self) -> tuple[int, int, int, int]:
        """The step's ``revisit_limits`` (lua/step/revisit.lua): records in all, of a site,
        runs and milliseconds a record may go unrediscovered."""
        return (self.max_urls, self.max_site_urls, self.forget_runs, int(self.forget_window * 1000))

    def interval(self, request: Request) -> float:
        """Seconds between fetches of *request*'s URL: 0 when no policy names it."""
        callback = getattr(request.callback, "__name__", None) or "parse"
        for rule, seconds in self.rules:
            if isinstance(rule, str):
                if rule == callback:
                    return seconds
            elif rule.search(request.url):
                return seconds
        return 0.0

    def next_interval(self, last: float, base: float, changed: bool | None) -> float:
        """The interval after a fetch: adaptive within the bounds, else the policy's."""
        if not self.adaptive or changed is None or last <= 0:
            return base
        low, high = self.bounds
        factor = 1 - DEC_RATE if changed else 1 + INC_RATE
        return min(high, max(low, last * factor))


def _validator(value: bytes | None) -> str | None:
    """A header value fit to send back: printable ASCII, bounded, else None."""
    if not value or len(value) > _MAX_VALIDATOR:
        return None
    text = value.decode("latin-1")
    return text if text.isascii() and text.isprintable() else None


def _record(request: Request) -> dict[str, Any] | None:
    record = request.meta.get(REVISIT_META_KEY)
    return record if isinstance(record, dict) else None


def _out_of(response: Response | None) -> dict[str, Any] | None:
    """What the fetch of *response*'s request leaves for the next one (RevisitMiddleware
    put it in its meta), or None."""
    request = getattr(response, "request", None)
    out = request.meta.get(REVISIT_OUT_META_KEY) if request is not None else None
    return out if isinstance(out, dict) else None


def _mark_unsure(response: Response | None = None, **_: Any) -> None:
    """The page's items are not all known: its fetch is no evidence that any is gone."""
    out = _out_of(response)
    if out is not None:
        out["unsure"] = True


def _payload_without_record(payload: bytes) -> bytes:
    """The leased payload as first enqueued (a revisit's carries the last record)."""
    if b'"revisit":' not in payload:
        return payload
    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(data, dict):
        data.pop("revisit", None)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _original_payload(payload: bytes, url: str) -> bytes | None:
    """The request that was redirected to *payload*'s URL, as it first went."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data["url"] = url
    data.pop("revisit", None)
    meta = data.get("meta")
    if isinstance(meta, dict):
        data["meta"] = {k: v for k, v in meta.items() if not k.startswith("redirect_")}
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _refs(items: object) -> list[tuple[str, str]]:
    """(collection, _id) pairs of a record's items, whatever the record holds."""
    if not isinstance(items, list):
        return []
    return [(ref[0], ref[1]) for ref in items[:_MAX_ITEMS]
            if isinstance(ref, list) and len(ref) == 2 and all(isinstance(x, str) for x in ref)]  # fmt: skip


def touch_items(crawler: Crawler, records: list[bytes]) -> None:
    """Pages still linked but not due (or not fetched): their last items are still there."""
    refs: list[tuple[str, str]] = []
    for raw in records:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            refs += _refs(record.get("items"))
    if refs:
        # the store keeps them (project/frontier/signals.py): no store, nothing to keep
        crawler.signals.send_catch_log(items_still_there, refs=refs)


#: Statuses of a page that shows what it has (not 202 Accepted, 204 No Content, 206 Partial).
_WHOLE_STATUSES = frozenset({200, 203})


def gone_refs(request: Request) -> tuple[list[tuple[str, str]], float | None]:
    """Items of the page's last fetch that this fetch shows gone, and the moment that fetch
    was settled (Redis' time, the record's ``t``): no item seen after it anywhere is gone.

    All of them when it answered 404 or 410; those it no longer yielded when it answered 200
    or 203 and was parsed to its end, with every item it yielded stored and named. Anything
    else (a 304, an error, a retry, a parse that raised or said ``revisit_unsure``, an item
    dropped or not named, a record without ``t``) is no evidence: none."""
    out, last = request.meta.get(REVISIT_OUT_META_KEY), _record(request)
    if not isinstance(out, dict) or last is None:
        return [], None
    old, before, status = _refs(last.get("items")), last.get("t"), out.get("status")
    if not old or not isinstance(status, int) or not isinstance(before, int | float):
        return [], None
    if isinstance(before, bool) or not 0 < before < 1e11:
        return [], None
    if status in _FORGET_STATUSES:
        return old, float(before)
    if status not in _WHOLE_STATUSES or not out.get("parsed") or out.get("unsure"):
        return [], None
    if request.meta.get(REVISIT_UNSURE_META_KEY):
        return [], None
    yielded = set(_refs(out["record"].get("items")))
    return [ref for ref in old if ref not in yielded], float(before)


def mark_gone(crawler: Crawler, request: Request) -> int:
    """Tell the store which items of *request*'s page are gone (:func:`gone_refs`)."""
    refs, before = gone_refs(request)
    if refs:
        crawler.signals.send_catch_log(items_gone, refs=refs, before=before)
    return len(refs)


def revisit_entries(
    request: Request, site: str, payload: bytes, now: float, max_bytes: int = MAX_RECORD_BYTES
) -> list[tuple[bytes, int, bytes]] | None:
    """The revisit section entries (lua/step/revisit.lua) of a fetched request: its own, and
    the first URL of its redirects' (fetched again next time, that one leads here again).
    *now*: Redis' time as the request settles, after its items were stored (``t``).

    A record over *max_bytes* (FRONTIER_REVISIT_MAX_RECORD_BYTES) first loses its items and
    validators (the next fetch is a whole one, and tells nothing of gone items); None when
    even its request is bigger: it is not kept."""
    out = request.meta.get(REVISIT_OUT_META_KEY)
    if not isinstance(out, dict):
        return []
    record = out["record"]
    record["t"] = round(now, 3)
    head = f"{site}\n{request.priority}\n".encode()
    request_bytes = _payload_without_record(payload)
    entry = head + _compact(record) + b"\n" + request_bytes
    if len(entry) > max_bytes and (record.get("items") or "etag" in record or "lm" in record):
        record = {**record, "items": []}
        record.pop("etag", None)
        record.pop("lm", None)
        entry = head + _compact(record) + b"\n" + request_bytes
    if len(entry) > max_bytes:
        return None
    entries = [(out["fp"], int(out["interval"] * 1000), entry)]
    for fingerprint, interval, url in out.get("also", []):
        original = _original_payload(payload, url)
        if original is not None and len(original) + len(head) + 16 <= max_bytes:
            entries.append(
                (fingerprint, int(interval * 1000), head + b'{"redirect":1}\n' + original)
            )
    return entries


def _compact(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True).encode()


class RevisitLinksMiddleware:
    """Spider middleware: a page that led to other requests is not asked conditionally.

    A 304 is not parsed, so the links of a hub page (a category listing) would not be
    followed again and the pages behind them never rediscovered: such a page's record keeps
    no validators, and its next fetch is a whole one. Pages that only gave items are asked
    with ``If-None-Match`` / ``If-Modified-Since``.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not RevisitConfig.from_settings(crawler.settings).rules:
            raise NotConfigured  # FRONTIER_REVISIT names no URLs (no args: Scrapy logs no WARNING)
        return cls()

    @staticmethod
    def _saw(response: Response, output: Any) -> None:
        if not isinstance(output, Request):
            return
        out = _out_of(response)
        if out is None:
            return
        request = response.request
        assert request is not None  # _out_of found its meta
        if (output.url, output.method, output.body) == (
            request.url,
            request.method,
            request.body,
        ):
            # the page asked for itself again (through Chromium, say): that request yields
            # its items, so this parse is no evidence that any is gone
            out["unsure"] = True
        if not out["record"].get("links"):
            out["record"]["links"] = True
            out["record"].pop("etag", None)
            out["record"].pop("lm", None)

    @staticmethod
    def _parsed(response: Response) -> None:
        """The callback ran to its end: what the page yielded is all it has (gone_refs)."""
        out = _out_of(response)
        if out is not None:
            out["parsed"] = True

    def process_spider_output(
        self, response: Response, result: Iterable[Any], spider: Spider | None = None
    ) -> Iterable[Any]:
        for output in result:
            self._saw(response, output)
            yield output
        self._parsed(response)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        async for output in result:
            self._saw(response, output)
            yield output
        self._parsed(response)


class RevisitParseGuard:
    """Spider middleware next to the spider: a callback that raised is no evidence that its
    page's items are gone, even when a middleware further out swallows the exception (then
    the output ends as if the parse had finished, and no ``spider_error`` is sent)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not RevisitConfig.from_settings(crawler.settings).rules:
            raise NotConfigured
        return cls()

    def process_spider_exception(
        self, response: Response, exception: BaseException, spider: Spider | None = None
    ) -> None:
        _mark_unsure(response)


class RevisitMiddleware:
    """Sends a revisit's validators, turns a 304 into "unchanged", and records each fetch.

    A downloader middleware between HttpCompression (590) and the retries: it sees the
    decoded body of the final response of each request.
    """

    def __init__(self, crawler: Crawler, config: RevisitConfig, stats: StatsCollector) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = stats
        #: The scheduler's seen-set, once it opened one: revisits are keyed by its members.
        self._seen_set: FleetDupeFilter | None = None
        crawler.signals.connect(self._item_scraped, signal=signals.item_scraped)
        # an item of the page dropped or failed, or its callback raised: the page's items are
        # not all known, so its fetch is no evidence that any is gone
        for signal in (signals.item_dropped, signals.item_error, signals.spider_error):
            crawler.signals.connect(_mark_unsure, signal=signal)
        crawler.signals.connect(self._seen_set_opened, signal=seen_set_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = RevisitConfig.from_settings(crawler.settings)
        if not config.rules:
            raise NotConfigured  # FRONTIER_REVISIT names no URLs (no args: Scrapy logs no WARNING)
        assert crawler.stats is not None
        return cls(crawler, config, crawler.stats)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        record = _record(request)
        if record is None:
            return
        etag, modified = record.get("etag"), record.get("lm")
        if isinstance(etag, str) and etag and b"If-None-Match" not in request.headers:
            request.headers[b"If-None-Match"] = etag
        if isinstance(modified, str) and modified and b"If-Modified-Since" not in request.headers:
            request.headers[b"If-Modified-Since"] = modified

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        base = self.config.interval(request)
        last = _record(request)
        also = self._first_of_redirects(request)
        if base <= 0 and last is None and not also:
            return response
        fingerprint = self._fingerprint(request)
        if fingerprint is None:
            return response
        previous = (
            float(last.get("i", 0)) / 1000
            if last and isinstance(last.get("i"), int | float)
            else 0.0
        )
        if response.status == 304:
            if last is None:
                return response  # not asked by this node: nothing known of the page, say nothing
            self.stats.inc_value("revisit/not_modified")
            self.stats.inc_value("revisit/unchanged")
            interval = self.config.next_interval(previous, base, changed=False)
            record = {**last, "i": int(interval * 1000)}
            record.update(self._validators(response, record))
            request.meta[REVISIT_OUT_META_KEY] = {"fp": fingerprint, "interval": interval,
                                                  "record": record}  # fmt: skip
            # not awaited: the download slot goes on; the store has it before the run ends
            touch_items(self.crawler, [json.dumps(record).encode()])
            raise NotModified(f"{response.url[:200]}: not modified")
        ok = 200 <= response.status < 300
        changed: bool | None = None
        digest = hashlib.sha1(response.body, usedforsecurity=False).hexdigest()[:16]
        if last is not None and ok:
            changed = last.get("h") != digest
            self.stats.inc_value("revisit/changed" if changed else "revisit/unchanged")
        interval = self.config.next_interval(previous, base, changed)
        if response.status in _FORGET_STATUSES:
            interval = 0.0  # the page is gone: its URL leaves the revisits (its items go too)
        record = {"h": digest, "i": int(interval * 1000), "items": []}
        if ok:
            # validators go only with a page that led nowhere else (RevisitLinksMiddleware)
            record.update(self._validators(response, {}))
        out: dict[str, Any] = {"fp": fingerprint, "interval": interval, "record": record,
                               "status": response.status}  # fmt: skip
        if also and also[0] != fingerprint:
            out["also"] = [also]
        request.meta[REVISIT_OUT_META_KEY] = out
        return response

    def _first_of_redirects(self, request: Request) -> tuple[bytes, float, str] | None:
        """The URL the links named when this request is a redirect of it, under a policy."""
        redirected = request.meta.get("redirect_urls")
        if not (isinstance(redirected, list) and redirected and isinstance(redirected[0], str)):
            return None
        try:
            first = request.replace(url=redirected[0])
        except ValueError:  # not a URL (a redirect chain another component wrote)
            return None
        again = self.config.interval(first)
        fingerprint = self._fingerprint(first) if again > 0 else None
        # seen, and never fetched itself but through this one: recorded with it
        return (fingerprint, again, redirected[0]) if fingerprint is not None else None

    def _seen_set_opened(self, dupefilter: FleetDupeFilter) -> None:
        self._seen_set = dupefilter

    def _fingerprint(self, request: Request) -> bytes | None:
        # None without the fleet's scheduler: nothing to key a record by
        return self._seen_set.fingerprint(request) if self._seen_set is not None else None

    @staticmethod
    def _validators(response: Response, record: dict[str, Any]) -> dict[str, Any]:
        found = {
            "etag": _validator(response.headers.get(b"ETag")),
            "lm": _validator(response.headers.get(b"Last-Modified")),
        }
        return {name: value for name, value in found.items() if value} or {
            name: record[name] for name in ("etag", "lm") if name in record
        }

    def _item_scraped(self, item: Any, response: Response, spider: Spider) -> None:
        """Name the stored item in its page's record, for a later 304 to keep it alive."""
        out = _out_of(response)
        if out is None:
            return
        answers = self.crawler.signals.send_catch_log(item_stored_ref, item=item)
        if not answers:
            return  # no store: the page's record keeps what it had
        ref = next((a for _, a in answers if isinstance(a, tuple)), None)
        record = out["record"]
        if (
            ref is None
            or len(ref[1]) > _MAX_REF
            or len(ref[0]) > _MAX_REF
            or len(record["items"]) >= _MAX_ITEMS
        ):
            # an item it cannot name (a later pipeline made another object, an id too long,
            # too many): no validators, so the next fetch parses the page and stores the item
            # again; and the record's items are not all the page's (no evidence of gone)
            record.pop("etag", None)
            record.pop("lm", None)
            out["unsure"] = True
            return
        record["items"].append(list(ref))
