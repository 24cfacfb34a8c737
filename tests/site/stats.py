"""Request counters of the test shop, served as ``/_stats`` (and its request timeline as
``/_timeline``) and cleared by ``/_reset``."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["ShopStats", "Timed", "open_at_once"]


@dataclass
class Timed:
    """One counted request: when it arrived and when it ended (wall clock, ``time.time()``).

    ``finish`` is when the response was written to its end or the client went away, ``None``
    while the request is open.
    """

    path: str
    arrival: float
    finish: float | None = None
    agent: str = ""  # the client's User-Agent: which node sent it, when nodes set their own

    def end(self) -> None:
        """The request is over: answered, or dropped by its client."""
        self.finish = time.time()

    def as_list(self) -> list[float | str | None]:
        """``[arrival, finish, path, agent]``, as ``/_timeline`` serves it."""
        return [self.arrival, self.finish, self.path, self.agent]


class ShopStats:
    """What the shop has served since start or the last reset."""

    hits: Counter[str]
    product_hits: Counter[int]
    statuses: Counter[int]
    per_second: Counter[int]
    total: int
    #: Product requests seen, for the 429 burst.
    product_requests: int
    #: Requests per flaky product that got past the 429 burst.
    flaky_fetches: Counter[int]
    #: Requests per hostile page (``--hostile``), by name (``huge``, ``stall``, ...).
    hostile: Counter[str]
    #: Body bytes each hostile page sent, by name: the huge page stops when its client goes.
    hostile_sent: Counter[str]
    #: Hostile pages answered to their end: a huge page sent whole, a stall that ran its course.
    hostile_completed: Counter[str]
    #: Requests per book page and per article page, by path (query strings left out).
    book_hits: Counter[str]
    article_hits: Counter[str]
    #: Valid API requests: ``categories``, and ``<slug>/<page>`` for each page of products.
    api_hits: Counter[str]
    #: GETs of each page of the mixed site (``--mixed``), by path and query as asked for, and
    #: its renders: beacons a browser that ran the page sent. Plain fetches are the difference.
    mixed_hits: Counter[str]
    mixed_renders: Counter[str]
    #: Every counted request in arrival order, with its duration.
    timeline: list[Timed]
    #: Requests with If-None-Match or If-Modified-Since, and those answered 304 Not Modified.
    conditional: int
    not_modified: int
    #: Bytes of response bodies sent (headers left out), hostile streams included.
    body_bytes: int

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything, including flaky and burst progress."""
        self.hits = Counter()
        self.product_hits = Counter()
        self.statuses = Counter()
        self.per_second = Counter()
        self.total = 0
        self.product_requests = 0
        self.flaky_fetches = Counter()
        self.hostile = Counter()
        self.hostile_sent = Counter()
        self.hostile_completed = Counter()
        self.book_hits = Counter()
        self.article_hits = Counter()
        self.api_hits = Counter()
        self.mixed_hits = Counter()
        self.mixed_renders = Counter()
        self.timeline = []
        self.conditional = 0
        self.not_modified = 0
        self.body_bytes = 0

    def record_request(
        self, path_with_query: str, product_id: int | None, agent: str = ""
    ) -> Timed:
        """Count one request as it arrives; the caller ends the returned entry."""
        timed = Timed(path_with_query, time.time(), agent=agent)
        self.timeline.append(timed)
        self.total += 1
        self.hits[path_with_query] += 1
        self.per_second[int(time.time())] += 1
        if product_id is not None:
            self.product_hits[product_id] += 1
            self.product_requests += 1
        return timed

    def record_status(self, status: int) -> None:
        """Count the status a request is answered with."""
        self.statuses[status] += 1
        if status == 304:
            self.not_modified += 1

    def as_dict(self) -> dict[str, object]:
        """The counters, JSON-ready (keys as strings)."""
        return {
            "hits": dict(self.hits),
            "product_hits": {str(k): v for k, v in sorted(self.product_hits.items())},
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "per_second": {str(k): v for k, v in sorted(self.per_second.items())},
            "total": self.total,
            "hostile": dict(self.hostile),
            "hostile_sent": dict(self.hostile_sent),
            "hostile_completed": dict(self.hostile_completed),
            "book_hits": dict(self.book_hits),
            "article_hits": dict(self.article_hits),
            "api_hits": dict(self.api_hits),
            "mixed_hits": dict(self.mixed_hits),
            "mixed_renders": dict(self.mixed_renders),
            "conditional": self.conditional,
            "not_modified": self.not_modified,
            "body_bytes": self.body_bytes,
        }

    def timeline_dict(self) -> dict[str, object]:
        """``{"requests": [[arrival, finish_or_null, path, agent], ...]}``, in arrival order."""
        return {"requests": [timed.as_list() for timed in self.timeline]}


def open_at_once(timeline: list[list[Any]]) -> int:
    """Most requests a ``/_timeline`` had open at one instant (one still open counts as ending
    where it began)."""
    events = []
    for arrival, finish, *_ in timeline:
        events += [(arrival, 1), (finish if finish is not None else arrival, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most
