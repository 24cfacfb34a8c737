"""The seen-set's form (FRONTIER_SEEN_MODE): a plain set, compact exact buckets, or a Bloom filter.

lua/lib/seen.lua reads and writes the three forms; this module sizes them from
FRONTIER_SEEN_EXPECTED and FRONTIER_SEEN_ERROR_RATE, records the form a crawl uses in
``<dupefilter>:conf`` (so every node, whatever its settings, uses the same one), and moves an
existing set into another form (``fleetcrawl seen migrate``).

A Bloom filter answers "seen" for about one never-seen URL in 1/error_rate: that URL is
skipped, and nothing can tell which one it was. Use it where that is acceptable.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.frontier import lua

if TYPE_CHECKING:
    from typing import Self

    from redis.asyncio import Redis
    from scrapy.settings import BaseSettings

    from project.frontier.keys import FrontierKeys

__all__ = [
    "MODES",
    "BloomFill",
    "SeenConfig",
    "SeenFormError",
    "bloom_expected",
    "ensure_form",
    "migrate",
    "nodes_holding",
    "stored_form",
]

logger = logging.getLogger(__name__)

MODES = ("set", "exact", "bloom")
#: Members an exact bucket is sized for at the expected count (Redis keeps a set of
#: integers as an intset up to set-max-intset-entries, 512 by default).
_BUCKET_MEMBERS = 192
#: Most buckets (lib/seen.lua cuts a bucket number from 24 bits of the fingerprint).
_MAX_BUCKETS = 1 << 24
#: Bits of one Bloom part: SETBIT's largest offset is 2^32 - 1 (a 512 MiB string).
_MAX_PART_BITS = 1 << 32
#: Bytes Redis adds to a string's own (sds header, terminator) within one allocation.
_STRING_HEADER = 16
_SCAN_COUNT = 1000
_MIGRATE_BATCH = 1000


class SeenFormError(NotConfigured):
    """The seen-set in Redis is in another form than the settings ask for."""


@dataclass(frozen=True)
class SeenConfig:
    """FRONTIER_SEEN_*: which form, sized for how many URLs."""

    mode: str = setting("FRONTIER_SEEN_MODE", "set")
    expected: int = setting("FRONTIER_SEEN_EXPECTED", 10_000_000)
    error_rate: float = setting("FRONTIER_SEEN_ERROR_RATE", 1e-6)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        config = cls(**read_settings(cls, settings))
        config.check()
        return config

    def check(self) -> None:
        """Refuse values no form can be built from."""
        if self.mode not in MODES:
            raise NotConfigured(
                f"FRONTIER_SEEN_MODE must be one of {', '.join(MODES)}, not {self.mode!r}"
            )
        if not 1000 <= self.expected <= 1 << 36:
            raise NotConfigured(f"FRONTIER_SEEN_EXPECTED ({self.expected}) must be 1000 to 2^36")
        if not 1e-12 <= self.error_rate <= 0.1:
            raise NotConfigured(
                f"FRONTIER_SEEN_ERROR_RATE ({self.error_rate}) must be 1e-12 to 0.1"
            )

    def form(self) -> dict[str, Any]:
        """The form as lib/seen.lua takes it."""
        if self.mode == "exact":
            buckets = 1 << max(0, math.ceil(math.log2(self.expected / _BUCKET_MEMBERS)))
            return {"mode": "exact", "buckets": min(buckets, _MAX_BUCKETS)}
        if self.mode == "bloom":
            bits = math.ceil(-self.expected * math.log(self.error_rate) / math.log(2) ** 2)
            k = max(1, round(bits / self.expected * math.log(2)))
            sizes = [part * 8 for part in _part_bytes(math.ceil(bits / 8))]
            return {"mode": "bloom", "k": k, "sizes": sizes, "total": sum(sizes),
                    "parts": len(sizes), "expected": self.expected}  # fmt: skip
        return {"mode": "set"}


def _part_bytes(need: int) -> list[int]:
    """Bloom parts of *need* bytes in all, each the size of one of jemalloc's size classes
    (Redis' allocator rounds a string up to one: 25 % more at worst) less a string's header.

    jemalloc's classes past 16 KiB are four per doubling (1, 1.25, 1.5, 1.75 x 2^n); the
    largest that fits is taken until what is left is smaller than any.
    """
    classes = [2**n * i // 4 for n in range(14, 30) for i in (4, 5, 6, 7)]
    classes = [c for c in classes if c <= _MAX_PART_BITS // 8]
    parts, left = [], need
    while left > 0:
        fits = [c - _STRING_HEADER for c in classes if c - _STRING_HEADER <= left]
        part = max(fits) if fits else left
        parts.append(part)
        left -= part
    return parts


def bloom_expected(form: dict[str, Any]) -> int:
    """The URL count a Bloom form was sized for (older records lack it: from its bits and k)."""
    expected = form.get("expected")
    if isinstance(expected, int) and expected > 0:
        return int(expected)
    return max(1, round(float(form["total"]) * math.log(2) / max(1, int(form["k"]))))


class BloomFill:
    """How full the crawl's Bloom seen-set is, from the counts of the node's steps.

    Past its expected count a filter answers "seen" for more and more new URLs (about 7 % at
    3x, half at 5x), and each is skipped without a trace: a WARNING at 80 % and at 100 %
    (once each per node), the share in the stats (``frontier/seen/fill_percent``).
    """

    LEVELS = (0.8, 1.0)

    def __init__(self, form: dict[str, Any], stats: Any, spider: Any = None) -> None:
        self.expected = bloom_expected(form)
        self.stats, self.spider = stats, spider
        self.warned = 0  # levels passed

    def update(self, count: int) -> None:
        share = count / self.expected
        self.stats.set_value("frontier/seen/fill_percent", round(share * 100, 1))
        while self.warned < len(self.LEVELS) and share >= self.LEVELS[self.warned]:
            level = self.LEVELS[self.warned]
            self.warned += 1
            logger.warning(
                "The Bloom seen-set holds %d URLs, %d%% of the %d it was sized for"
                " (FRONTIER_SEEN_EXPECTED when the crawl began): %s",
                count, round(share * 100), self.expected,
                "past it, new URLs are skipped as seen ever more often (about 7% at 3x);"
                " start the next crawl with a larger FRONTIER_SEEN_EXPECTED"
                if level >= 1.0 else "new URLs will soon be skipped as seen more often",
                extra={"spider": self.spider},
            )  # fmt: skip


def _sized(form: dict[str, Any]) -> dict[str, Any]:
    """A form less what older records lack (the count a Bloom filter was sized for)."""
    return {name: value for name, value in form.items() if name != "expected"}


def _conf_key(keys: FrontierKeys) -> str:
    return keys.dupefilter + ":conf"


async def _prepare(server: Redis, keys: FrontierKeys, form: dict[str, Any]) -> None:
    """Allocate a Bloom filter at its size at once (lua/lib/seen.lua's seen_prepare)."""
    if form["mode"] == "bloom":
        script = server.register_script(lua.load("seen").source)
        await script(keys=[keys.dupefilter], args=[json.dumps({**form, "do": "prepare"})])


async def stored_form(server: Redis, keys: FrontierKeys) -> dict[str, Any] | None:
    """The form recorded for this crawl's seen-set, or None (a plain set, or none yet)."""
    raw = await server.get(_conf_key(keys))
    if raw is None:
        return None
    try:
        form = json.loads(raw)
    except ValueError:
        form = None
    if not isinstance(form, dict) or form.get("mode") not in MODES:
        raise SeenFormError(f"{_conf_key(keys)} holds {raw[:100]!r}, not a seen-set form")
    return form


async def ensure_form(server: Redis, keys: FrontierKeys, config: SeenConfig) -> dict[str, Any]:
    """The form this node must use: the one recorded, else the settings' (recorded now).

    A recorded form of another mode, or a plain set with members when the settings ask for
    another form, stops the node: ``fleetcrawl seen migrate`` moves the set.
    """
    wanted = config.form()
    form = await stored_form(server, keys)
    if form is None and wanted["mode"] != "set":
        if await server.exists(keys.dupefilter):
            raise SeenFormError(
                f"the seen-set {keys.dupefilter} is a plain set and FRONTIER_SEEN_MODE is"
                f" {wanted['mode']!r}: move it with `fleetcrawl seen migrate {keys.spider}"
                f" --to {wanted['mode']}` (nodes stopped), or set FRONTIER_SEEN_MODE = 'set'"
            )
        if await server.set(_conf_key(keys), json.dumps(wanted), nx=True):
            await _prepare(server, keys, wanted)
        form = await stored_form(server, keys)
    if form is None:
        return {"mode": "set"}
    if form["mode"] != wanted["mode"]:
        raise SeenFormError(
            f"this crawl's seen-set is in {form['mode']!r} form ({_conf_key(keys)}) and"
            f" FRONTIER_SEEN_MODE is {wanted['mode']!r}: set FRONTIER_SEEN_MODE ="
            f" {form['mode']!r}, or move it with `fleetcrawl seen migrate`"
        )
    if _sized(form) != _sized(wanted):
        logger.warning(
            "the seen-set is sized %s (recorded when the crawl began); these settings ask for %s:"
            " the recorded size is used",
            json.dumps(form), json.dumps(wanted),
        )  # fmt: skip
    return form


async def nodes_holding(server: Redis, keys: FrontierKeys) -> list[str]:
    """Nodes whose presence or permit holding has not expired yet (by Redis' clock)."""
    seconds, micros = await server.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    found: set[str] = set()
    for key in (keys.alive, keys.holders):
        for member in await server.zrangebyscore(key, f"({now_ms}", "+inf"):
            found.add(
                member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
            )
    return sorted(found)


async def migrate(server: Redis, keys: FrontierKeys, config: SeenConfig) -> int:
    """Move a plain seen-set into *config*'s form; return how many fingerprints moved.

    Run with every node of the crawl stopped: a node that adds to the old set meanwhile
    adds a URL the new form does not hold.
    """
    form = config.form()
    if form["mode"] == "set":
        raise SeenFormError("a seen-set moves from a plain set into 'exact' or 'bloom' only")
    holding = await nodes_holding(server, keys)
    if holding:
        raise SeenFormError(
            f"{len(holding)} node(s) still hold this crawl ({', '.join(sorted(holding)[:5])}):"
            " stop them first (a URL one adds to the old set meanwhile is lost to the new form)"
        )
    current = await stored_form(server, keys)
    if current is not None:
        raise SeenFormError(f"the seen-set is already in {current['mode']!r} form")
    script = server.register_script(lua.load("seen").source)
    encoded = json.dumps(form)
    await _prepare(server, keys, form)
    moved, batch = 0, []
    async for member in server.sscan_iter(keys.dupefilter, count=_SCAN_COUNT):
        batch.append(member)
        if len(batch) >= _MIGRATE_BATCH:
            await script(keys=[keys.dupefilter], args=[encoded, *batch])
            moved += len(batch)
            batch = []
    if batch:
        await script(keys=[keys.dupefilter], args=[encoded, *batch])
        moved += len(batch)
    # the form is recorded before the set goes: a failure between the two leaves both
    await server.set(_conf_key(keys), encoded)
    await server.delete(keys.dupefilter)
    return moved
