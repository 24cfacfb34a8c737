"""Adaptive rendering, a node's view: which pattern goes to the browser, which over plain HTTP.

The fleet's patterns live in Redis (lua/step/render.lua); each step of the frontier's loop
tells what this node's fetches taught and brings back the patterns that changed, so what
one node learns every node uses from its next round trip. A pattern is ``learn`` until a
few fetched both ways agree (``http``) or one plain fetch misses what the browser found
(``browser``); a share of every settled pattern is fetched both ways again, more while its
evidence is thin (:meth:`RenderPlan.decide`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from project.rendering.config import RenderingConfig
from project.rendering.evidence import fields_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.rendering.evidence import Summary

__all__ = [
    "MODE_BROWSER",
    "MODE_HTTP",
    "MODE_LEARN",
    "ROLE_BROWSER",
    "ROLE_HTTP",
    "ROLE_SAMPLE",
    "ROLE_WAIT",
    "Pattern",
    "RenderPlan",
    "plan_of",
]

logger = logging.getLogger(__name__)

MODE_LEARN, MODE_HTTP, MODE_BROWSER = "learn", "http", "browser"
#: What one fetch of a pattern is: plain and then its browser twin (a sample), plain HTTP,
#: or the browser.
ROLE_SAMPLE, ROLE_HTTP, ROLE_BROWSER = "sample", "http", "browser"
#: Not fetched yet: it waits for the fleet's answer on its pattern (see WAIT_SECONDS).
ROLE_WAIT = "wait"

#: The share of a settled pattern's fetches sampled again, more while it has few samples:
#: max(floor, thin / (1 + samples)), by what a re-check costs and what else guards it. A
#: re-check of a ``browser`` pattern is one plain fetch more (about a fifteenth of a
#: render's CPU), and the only way the fleet learns that the pattern no longer needs
#: Chromium: RECHECK_SHARE, at least 3 % (12.5 % after the one miss that can settle it).
#: A re-check of an ``http`` pattern is a render. When the pattern's renders yielded items,
#: its pages are guarded besides (a page that yields fewer, or items without a field they
#: all had, is a rescue: looks_short), and the re-check is left to find what a rescue cannot
#: see (the same fields with other values): GUARDED_RECHECK_SHARE, at least 1 %, 2.5 % after
#: the three samples that settle it. An ``http`` pattern whose renders yielded no item (a
#: listing that only yields links) has no rescue: its re-checks are RECHECK_SHARE.
RECHECK_SHARE = (0.03, 0.25)
GUARDED_RECHECK_SHARE = (0.01, 0.10)
#: Samples of a learning pattern one node has out before the fleet answered; its other
#: fetches meanwhile wait (ROLE_WAIT), or go to the browser (nothing lost while nothing is
#: known).
_LEARNING_OUT = 3
#: A leased request of a pattern whose samples are out goes back to the fleet, due again in
#: WAIT_SECONDS, at most MOST_WAITS times; then it is rendered. The fleet's answer usually
#: comes within a second or two (the samples' browser twins, then a round trip), and a
#: request put off costs a round trip where a render costs a browser's 75 ms of CPU: on a
#: mixed site the renders while patterns learnt were a fifth of all (52 of 253).
WAIT_SECONDS = 1.0
MOST_WAITS = 5
#: Seconds after which a node stops waiting for its samples' answer (a twin dead-lettered).
_SAMPLE_PATIENCE = 60.0
_MOST_OUT = 10_000
#: Patterns the fleet keeps (a site that makes a template per page must not grow Redis
#: without end), and how long one with no sample is kept.
MOST_PATTERNS = 2000
FORGET_PATTERN_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class Pattern:
    """The fleet's view of one pattern: its mode and its evidence."""

    mode: str = MODE_LEARN
    agree: int = 0
    miss: int = 0
    #: Fewest items a browser render of it yielded (-1: no render yet).
    items: int = -1
    #: Fields every item a browser render of it yielded had.
    fields: tuple[str, ...] = ()

    @property
    def samples(self) -> int:
        """Fetches of the pattern compared both ways."""
        return self.agree + self.miss


class RenderPlan:
    """Which patterns this node renders; told each step (project/frontier/loop.py)."""

    def __init__(self, stats: StatsCollector, draw: Callable[[], float] = random.random) -> None:
        self.stats = stats
        self.patterns: dict[str, Pattern] = {}
        #: The version of the fleet's patterns this node knows (-1: none yet).
        self.version = -1
        #: The fleet keeps MOST_PATTERNS: a pattern it does not know is rendered.
        self.full = False
        self._draw = draw
        self._entries: list[tuple[str, str, str]] = []
        #: samples out while learning, and since when (bounded: _MOST_OUT patterns)
        self._out: dict[str, tuple[int, float]] = {}

    def decide(self, key: str, can_wait: bool = False) -> str:
        """The role of the next fetch of pattern *key*: ROLE_SAMPLE, ROLE_HTTP or ROLE_BROWSER;
        ROLE_WAIT, when *can_wait*, while the pattern's samples are out."""
        pattern = self.patterns.get(key)
        if pattern is None and self.full:
            self.stats.inc_value("render/adaptive/unlearnt")
            return ROLE_BROWSER
        if pattern is None or pattern.mode == MODE_LEARN:
            out, since = self._out.get(key, (0, 0.0))
            now = time.monotonic()
            if out >= _LEARNING_OUT and now - since < _SAMPLE_PATIENCE:
                return ROLE_WAIT if can_wait else ROLE_BROWSER
            if len(self._out) >= _MOST_OUT:
                self._out.clear()  # patterns the fleet never answered for (it is full)
            self._out[key] = (0 if out >= _LEARNING_OUT else out) + 1, now
            return ROLE_SAMPLE
        guarded = pattern.mode == MODE_HTTP and pattern.items >= 1
        floor, thin = GUARDED_RECHECK_SHARE if guarded else RECHECK_SHARE
        share = max(floor, thin / (1 + pattern.samples))
        if self._draw() < share:
            self.stats.inc_value("render/adaptive/rechecks")
            return ROLE_SAMPLE
        return ROLE_HTTP if pattern.mode == MODE_HTTP else ROLE_BROWSER

    def looks_short(self, key: str, plain: Summary) -> bool:
        """Whether a plain page of a pattern settled on HTTP yielded less than a browser
        render of the pattern always did (fewer items, or items without a field they all
        had): the page may have turned into JavaScript, so it is fetched both ways."""
        pattern = self.patterns.get(key)
        if pattern is None or pattern.items < 1:
            return False
        if len(plain.get("i") or ()) < pattern.items:
            return True
        have = set(fields_of(plain))
        return not set(pattern.fields) <= have

    def told(self, key: str, agreed: bool, browser: Summary) -> None:
        """A pattern fetched both ways: the plain fetch found what the browser found, or not."""
        data = {"i": len(browser.get("i") or ()), "f": fields_of(browser)}
        self._entries.append((key, "a" if agreed else "m", json.dumps(data)))
        self.stats.inc_value(f"render/adaptive/{'agreed' if agreed else 'missed'}")

    @property
    def waiting(self) -> bool:
        """Outcomes wait to be told to the fleet."""
        return bool(self._entries)

    def take_entries(self) -> list[tuple[str, str, str]]:
        """The outcomes for the next step (lua/step/render.lua's section)."""
        entries, self._entries = self._entries, []
        return entries

    def options(self) -> dict[str, Any]:
        """options.render of the next step."""
        return {"known": self.version, "most": MOST_PATTERNS, "forget_ms": FORGET_PATTERN_MS}

    def apply(self, reply: tuple[int, bytes, bool] | None) -> None:
        """Take in the patterns that changed (the step's ``render`` reply)."""
        if reply is None:
            return
        version, changes, self.full = reply
        if changes:
            try:
                changed = json.loads(changes)
            except ValueError:
                changed = {}
            for key, value in changed.items() if isinstance(changed, dict) else ():
                self._take(key, value)
        self.version = version

    def _take(self, key: str, value: Any) -> None:
        if not isinstance(value, list) or len(value) != 5:
            self.patterns.pop(key, None)  # forgotten by the fleet
            return
        mode, agree, miss, items, fields = value
        before = self.patterns.get(key)
        pattern = Pattern(
            mode=mode if mode in (MODE_LEARN, MODE_HTTP, MODE_BROWSER) else MODE_LEARN,
            agree=_count(agree),
            miss=_count(miss),
            items=_count(items, -1),
            fields=tuple(f for f in fields if isinstance(f, str))
            if isinstance(fields, list)
            else (),
        )
        self.patterns[key] = pattern
        self._out.pop(key, None)
        if before is None or before.mode != pattern.mode:
            self.stats.inc_value(f"render/adaptive/settled/{pattern.mode}")
            if pattern.mode != MODE_LEARN:
                logger.info(
                    "Render pattern %s: %s (%d fetches agreed, %d missed what the browser found)",
                    key.replace("\t", " "),
                    "plain HTTP" if pattern.mode == MODE_HTTP else "the browser",
                    pattern.agree,
                    pattern.miss,
                )


def _count(value: Any, default: int = 0) -> int:
    """A count of the fleet's record (anyone may write Redis: not a number is *default*)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if not math.isfinite(value):
        return default
    return int(max(-1, min(value, 2**31)))


_PLANS: WeakKeyDictionary[Crawler, RenderPlan | None] = WeakKeyDictionary()


def plan_of(crawler: Crawler) -> RenderPlan | None:
    """The node's render plan, shared by the rendering middlewares and the frontier's loop;
    None when PLAYWRIGHT_ADAPTIVE is off."""
    if crawler not in _PLANS:
        adaptive = RenderingConfig.from_settings(crawler.settings).adaptive
        assert crawler.stats is not None
        _PLANS[crawler] = RenderPlan(crawler.stats) if adaptive else None
    return _PLANS[crawler]
