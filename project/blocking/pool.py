"""SessionPool: this node's view of the fleet's sessions and proxies, and what it tells the fleet.

A session is a cookie jar, a proxy (or none) and a user agent, bound together so a site sees
one consistent visitor. The fleet's sessions live in Redis (lua/step/sessions.lua): any node
may use any of them. This node's view of a site's sessions comes with the step that follows
its first request of the site, and again whenever they change; what its downloads tell (a
page, a block, a cookie set) goes with its next step, which retires a worn session and
cools a banned (proxy, site) pair down for every node. Until then the node acts on what it
saw itself: a session it saw blocked too often is retired here at once, a pair it saw banned
is cooling here at once.

No I/O: the middleware (project/blocking/middleware.py) asks :meth:`SessionPool.pick` for a
session and reports each download's end; the frontier's loop sends :meth:`take_entries` and
:meth:`options` with each step and hands the reply to :meth:`apply`.

Which session a request gets: the sessions of the site's lowest tier with a proxy that is not
cooling down (PROXY_POOL's tiers: a site that banned the direct address and the datacenter
proxies goes through the residential ones, and back when the cool-downs end), the one this
node has the fewest downloads through, then the least used. A pair that never served the
site a page carries one download of this node at a time until it does: a proxy banned
before the crawl begins costs the fleet a request per node, not a burst of them. A site
without SESSION_POOL_SIZE sessions gets a new one on the proxy of that tier with the fewest.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import weakref
from dataclasses import dataclass, field
from http.cookiejar import Cookie
from typing import TYPE_CHECKING, Any

from scrapy.http.cookies import CookieJar

from project.blocking.config import Proxy, SessionConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

__all__ = ["Pick", "Session", "SessionPool", "SessionRetired", "pool_of"]

logger = logging.getLogger(__name__)

#: A site's view is asked for while this node used it within this many seconds.
_ASKED_FOR = 120.0
#: A ban this node saw outlives a reply for this long, the round trips its report takes.
_BAN_CARRIED = 5.0
#: A probe of a pair on probation is this node's for this long (or until its answer).
_PROBE_MS = 30_000
#: Probes asked for in one step, at most.
_PROBES_ASKED = 50
#: A node asks for the probes of a site while a request of it asked for a session within
#: this many seconds, and lets the others go: a node with nothing to download must not hold
#: a pair on probation that another node's request waits for.
_PROBES_WANTED = 2.0


class SessionRetired(Exception):
    """A request pinned to a session (``meta["session"]``) the fleet retired."""


@dataclass
class Session:
    """One session of a site, as this node sees it."""

    id: str
    site: str
    proxy: str  # the proxy's id (PROXY_POOL's URL, password masked); "" for none
    ua: int = 0
    uses: int = 0
    errors: float = 0.0
    #: The cookie jar as the fleet has it (JSON), and this node's jar built from it.
    cookies: str = ""
    jar: CookieJar = field(default_factory=CookieJar, repr=False)
    confirmed: bool = False  # the fleet has it (a step's reply listed it)


@dataclass
class _Pair:
    until_ms: int = 0  # its cool-down ends then (the fleet's clock)
    score: float = 0.0
    proven: bool = False
    banned_here: float = 0.0  # when this node banned it (monotonic), before the fleet knew
    blocked_here: float = 0.0  # when this node last saw it blocked (monotonic)


@dataclass
class _SiteView:
    version: int = -1
    sessions: dict[str, Session] = field(default_factory=dict)
    pairs: dict[str, _Pair] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)
    asked: float = 0.0
    wanted: float = 0.0  # a request of the site last asked for a session then (monotonic)


@dataclass(frozen=True)
class Pick:
    """What :meth:`SessionPool.pick` found: a session and its proxy, or how long to wait."""

    session: Session | None = None
    proxy: Proxy | None = None
    #: No session now: seconds until one may be had (every pair cooling down: the time the
    #: first cool-down ends; a pair on probation busy: a moment).
    wait: float = 0.0


class SessionPool:
    """This node's view of the fleet's sessions; see the module's text."""

    def __init__(self, config: SessionConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        #: The fleet's time in seconds (the frontier's FleetClock once the loop runs).
        self.clock = clock
        self.tiers: list[list[Proxy]] = [list(tier) for tier in config.tiers]
        if not self.tiers:
            self.tiers = [[Proxy("", "", 0)]]
        self.proxies = {proxy.id: proxy for tier in self.tiers for proxy in tier}
        self._views: dict[str, _SiteView] = {}
        self._entries: list[tuple[str, str, str, str, str]] = []
        self._inflight: dict[tuple[str, str], int] = {}  # (proxy, site) -> downloads
        self._by_session: dict[tuple[str, str], int] = {}  # (site, id) -> downloads
        #: Pairs on probation this node may try, as the last step granted (one node of the
        #: fleet at a time each)
        self._probes: set[tuple[str, str]] = set()
        #: A pick waited for a probe: the loop steps at its next tick.
        self.waiting = False
        #: The draws of cool-downs (equal jitter) and user agents.
        self.random = random.Random()  # noqa: S311 (jitter, not crypto)
        self.retired_seen = 0

    # -- the middleware's side ------------------------------------------------------

    def pick(self, site: str, pinned: str | None = None) -> Pick:
        """A session for a request of *site* (*pinned*: that one, made if need be);
        ``SessionRetired`` for a pinned one the fleet retired."""
        view = self._view(site)
        view.wanted = view.asked
        now_ms = self.clock() * 1000
        if pinned is not None:
            return self._pinned(view, site, pinned, now_ms)
        tier = self._tier(view, now_ms)
        if tier is None:
            soonest = min(pair.until_ms for pair in view.pairs.values())
            return Pick(wait=max(0.0, (soonest - now_ms) / 1000))
        ready = {p.id for p in tier}
        usable = [p for p in tier if self._may_carry(view, p.id, site)]
        alive = [
            s for s in view.sessions.values() if s.id not in view.retired and s.proxy in ready
        ]  # fmt: skip
        candidates = [s for s in alive if s.proxy in {p.id for p in usable}]
        if usable and len(alive) < self.config.pool_size:
            counts = {p.id: 0 for p in usable}
            for s in alive:
                if s.proxy in counts:
                    counts[s.proxy] += 1
            proxy = min(usable, key=lambda p: (counts[p.id], self._inflight.get((p.id, site), 0)))
            return Pick(self._new(view, site, os.urandom(6).hex(), proxy), proxy)
        if candidates:
            best = min(candidates, key=lambda s: (self._by_session.get((site, s.id), 0), s.uses))
            return Pick(best, self.proxies.get(best.proxy))
        self.waiting = True
        return Pick(wait=0.05)  # every pair on probation is tried by another download

    def started(self, session: Session) -> None:
        """A download through *session* went on its way."""
        pair = (session.proxy, session.site)
        self._inflight[pair] = self._inflight.get(pair, 0) + 1
        key = (session.site, session.id)
        self._by_session[key] = self._by_session.get(key, 0) + 1

    def left(self, session: Session) -> None:
        """A download through *session* left the downloader (or never reached it)."""
        pair = (session.proxy, session.site)
        self._inflight[pair] = max(0, self._inflight.get(pair, 0) - 1)
        key = (session.site, session.id)
        self._by_session[key] = max(0, self._by_session.get(key, 0) - 1)

    def ended(self, session: Session, blocked: bool | None) -> None:
        """What a download through *session* was: a page (``blocked`` False), a block (True),
        or neither (a download error, a redirect: None)."""
        if blocked is None:
            return
        view = self._view(session.site)
        health = view.pairs.setdefault(session.proxy, _Pair())
        session.uses += 1
        if blocked:
            jitter = self.random.random()
            session.errors += 1
            health.score += 1
            was_proven, health.proven = health.proven, False  # on probation again
            health.blocked_here = time.monotonic()
            self._probes.discard((session.site, session.proxy))
            if not was_proven or health.score >= self.config.ban_score:
                # as the step will: every session through it retires with the ban
                ceiling = min(self.config.cooldown_max, self.config.cooldown_base * 2)
                health.until_ms = int(self.clock() * 1000 + (0.5 + jitter / 2) * ceiling * 1000)
                health.score = 0
                health.banned_here = time.monotonic()
                for other in view.sessions.values():
                    if other.proxy == session.proxy:
                        view.retired.add(other.id)
            self._entries.append(("block", session.site, session.id, session.proxy, str(jitter)))
        else:
            session.errors = max(0.0, session.errors - 0.5)
            health.proven = True
            jar = _jar_json(session.jar)
            changed = jar != session.cookies and len(jar) <= self.config.max_cookie_bytes
            if changed:
                session.cookies = jar
            data = jar if changed else ""
            self._entries.append(("ok", session.site, session.id, session.proxy, data))
        if self._worn(session):
            view.retired.add(session.id)

    def usable(self, session: Session) -> bool:
        """Whether *session* may still carry a download: not retired, its pair not cooling."""
        view = self._views.get(session.site)
        if view is None:
            return True
        if session.id in view.retired:
            return False
        pair = view.pairs.get(session.proxy)
        return pair is None or pair.until_ms <= self.clock() * 1000

    def user_agent(self, session: Session) -> str | None:
        agents = self.config.user_agents
        return agents[session.ua % len(agents)] if agents else None

    # -- the loop's side --------------------------------------------------------------

    def take_entries(self) -> list[tuple[str, str, str, str, str]]:
        """What to tell the fleet with the next step (the step keeps them if it is sent
        again)."""
        entries, self._entries = self._entries, []
        return entries

    def options(self, entries: list[tuple[str, str, str, str, str]]) -> dict[str, Any]:
        """The step's ``sessions`` option: the limits, and the sites this node asks for;
        those it made sessions of in *entries* (the step's) always answered, so that one
        the fleet did not take is dropped."""
        c = self.config
        cutoff = time.monotonic() - _ASKED_FOR
        sites = {site: v.version for site, v in self._views.items() if v.asked >= cutoff}
        sites.update({entry[1]: -1 for entry in entries if entry[0] in ("new", "pin")})
        now_ms = self.clock() * 1000
        probes = []
        wanting = time.monotonic() - _PROBES_WANTED
        for site in sites:
            view = self._views.get(site)
            if view is None or view.wanted < wanting:
                continue  # no request of the site waits here: its probes are others' to take
            for proxy in self._tier(view, now_ms) or []:
                pair = view.pairs.get(proxy.id)
                if pair is None or not pair.proven:
                    probes.append(f"{site}\n{proxy.id}")
        asked = set(probes)
        release = [
            f"{site}\n{proxy}"
            for site, proxy in self._probes
            if f"{site}\n{proxy}" not in asked and self._inflight.get((proxy, site), 0) == 0
        ]
        self.waiting = False
        return {
            "size": c.pool_size,
            "max_errors": c.max_errors,
            "max_uses": c.max_uses,
            "max_age_ms": int(c.max_age * 1000),
            "ban_score": c.ban_score,
            "half_life_ms": int(c.half_life * 1000),
            "cool_base_ms": int(c.cooldown_base * 1000),
            "cool_max_ms": int(c.cooldown_max * 1000),
            "sites": sites,
            "probes": probes[:_PROBES_ASKED],
            "release": release[:_PROBES_ASKED],
            "probe_ms": _PROBE_MS,
        }

    def apply(
        self,
        views: list[tuple[str, int, bytes, bytes]],
        retired: int = 0,
        probes: list[tuple[str, str]] | None = None,
    ) -> None:
        """A step's reply: the sessions and pairs of the sites whose sessions changed, and
        the probes this node holds."""
        self.retired_seen += retired
        if probes is not None:
            self._probes = set(probes)
        for site, version, sessions_json, pairs_json in views:
            view = self._view(site, touch=False)
            listed = json.loads(sessions_json) if sessions_json else []
            pairs = json.loads(pairs_json) if pairs_json else {}
            if not isinstance(listed, list) or not isinstance(pairs, dict):
                continue
            fleet = {str(entry["id"]): entry for entry in listed if isinstance(entry, dict)}
            for sid, known in list(view.sessions.items()):
                if sid not in fleet and (known.confirmed or not self._pending(site, sid)):
                    # retired by the fleet, or never taken (the site had enough)
                    view.retired.add(sid)
                    del view.sessions[sid]
            for sid, entry in fleet.items():
                session = view.sessions.get(sid) or Session(sid, site, "")
                # the fleet's proxy and user agent: a session one visitor, whichever node
                # made it (a pin made on two nodes at once)
                session.proxy, session.ua = str(entry.get("p") or ""), int(entry.get("ua") or 0)
                view.sessions[sid] = session
                session.confirmed = True
                session.uses = max(session.uses, int(entry.get("u") or 0))
                session.errors = float(entry.get("e") or 0)
                cookies = entry.get("c") or ""
                if isinstance(cookies, str) and cookies != session.cookies:
                    session.cookies = cookies
                    _load_jar(session.jar, cookies)
                view.retired.discard(sid)
            # the fleet's pairs replace this node's (a reset in `fleetcrawl proxies` ends a
            # cool-down here too); what this node saw since the step was built comes again
            # with its next one
            fresh = {
                str(proxy): _Pair(
                    int(health.get("untl") or 0),
                    float(health.get("s") or 0),
                    bool(health.get("pv")),
                )
                for proxy, health in pairs.items()
                if isinstance(health, dict)
            }
            recent = time.monotonic() - _BAN_CARRIED
            for proxy, mine in view.pairs.items():
                theirs = fresh.get(proxy)
                if mine.banned_here >= recent and (
                    theirs is None or theirs.until_ms < mine.until_ms
                ):
                    fresh[proxy] = mine  # its block goes with the next step
                elif mine.blocked_here >= recent and theirs is not None:
                    # a reply built before this node's block: the pair is on probation here
                    theirs.proven = False
                    theirs.blocked_here = mine.blocked_here
            view.pairs = fresh
            view.version = int(version)

    def why_waiting(self, site: str) -> str:
        """Why no session of *site* can be had now, for a log line."""
        view = self._views.get(site)
        now_ms = self.clock() * 1000
        if view is None or self._tier(view, now_ms) is None:
            return "every proxy cooling down"
        busy = [
            p.id or "direct"
            for p in self._tier(view, now_ms) or []
            if not self._may_carry(view, p.id, site)
        ]
        held = sorted(proxy or "direct" for s, proxy in self._probes if s == site)
        return f"on probation, tried by other downloads: {busy}; probes held here: {held}"

    # -- status -----------------------------------------------------------------------

    def describe(self, site: str) -> dict[str, Any]:
        """The node's view of *site*: sessions alive, pairs cooling down, the tier in use."""
        view = self._views.get(site)
        if view is None:
            return {}
        now_ms = self.clock() * 1000
        tier = self._tier(view, now_ms)
        return {
            "sessions": sum(1 for s in view.sessions if s not in view.retired),
            "cooling": sorted(p for p, pair in view.pairs.items() if pair.until_ms > now_ms),
            "tier": None if tier is None else tier[0].tier,
        }

    # -- inside -----------------------------------------------------------------------

    def _view(self, site: str, touch: bool = True) -> _SiteView:
        view = self._views.get(site)
        if view is None:
            view = self._views[site] = _SiteView()
        if touch:
            view.asked = time.monotonic()
        return view

    def _tier(self, view: _SiteView, now_ms: float) -> list[Proxy] | None:
        """The lowest tier with a proxy not cooling down for the site (its proxies that are
        not), or None."""
        for tier in self.tiers:
            ready = [p for p in tier if view.pairs.get(p.id, _Pair()).until_ms <= now_ms]
            if ready:
                return ready
        return None

    def _may_carry(self, view: _SiteView, proxy: str, site: str) -> bool:
        """A proven pair carries any download; one on probation, one download of the fleet
        at a time: of the node the step granted its probe to."""
        pair = view.pairs.get(proxy)
        if pair is not None and pair.proven:
            return True
        return (site, proxy) in self._probes and self._inflight.get((proxy, site), 0) == 0

    def _pinned(self, view: _SiteView, site: str, pinned: str, now_ms: float) -> Pick:
        if pinned in view.retired:
            raise SessionRetired(pinned)
        session = view.sessions.get(pinned)
        if session is not None:
            return Pick(session, self.proxies.get(session.proxy))
        # a new pinned session: on a pair that may carry a download, as any session
        tier = self._tier(view, now_ms)
        if tier is None:
            soonest = min(pair.until_ms for pair in view.pairs.values())
            return Pick(wait=max(0.0, (soonest - now_ms) / 1000))
        usable = [p for p in tier if self._may_carry(view, p.id, site)]
        if not usable:
            self.waiting = True
            return Pick(wait=0.05)
        proxy = min(usable, key=lambda p: self._inflight.get((p.id, site), 0))
        return Pick(self._new(view, site, pinned, proxy, "pin"), proxy)

    def _new(
        self, view: _SiteView, site: str, sid: str, proxy: Proxy, kind: str = "new"
    ) -> Session:
        agents = len(self.config.user_agents)
        ua = self.random.randrange(agents) if agents else 0
        session = Session(sid, site, proxy.id, ua)
        view.sessions[sid] = session
        self._entries.append((kind, site, sid, proxy.id, json.dumps({"ua": ua})))
        return session

    def _pending(self, site: str, sid: str) -> bool:
        return any(e[0] in ("new", "pin") and e[1:3] == (site, sid) for e in self._entries)

    def _worn(self, session: Session) -> bool:
        c = self.config
        return session.errors >= c.max_errors or session.uses >= c.max_uses


def _jar_json(jar: CookieJar) -> str:
    """The cookies of *jar* as JSON: [[name, value, domain, path, expires, secure], ...]."""
    cookies = [
        [c.name, c.value, c.domain, c.path, c.expires, c.secure]
        for c in jar.jar
        if c.value is not None
    ]
    return (
        json.dumps(sorted(cookies, key=lambda c: (c[2], c[3], c[0])), separators=(",", ":"))
        if cookies
        else ""
    )


def _load_jar(jar: CookieJar, text: str) -> None:
    """*jar* as the fleet's JSON of it says (what does not parse is left out)."""
    jar.jar.clear()
    try:
        cookies = json.loads(text) if text else []
    except ValueError:
        return
    for entry in cookies if isinstance(cookies, list) else []:
        if not (isinstance(entry, list) and len(entry) == 6):
            continue
        name, value, domain, path, expires, secure = entry
        if not all(isinstance(v, str) for v in (name, value, domain, path)):
            continue
        jar.jar.set_cookie(
            Cookie(
                0, name, value, None, False, domain, bool(domain), domain.startswith("."),
                path, True, bool(secure), expires if isinstance(expires, int) else None,
                False, None, None, {},
            )
        )  # fmt: skip


_POOLS: weakref.WeakKeyDictionary[Crawler, SessionPool | None] = weakref.WeakKeyDictionary()


def pool_of(crawler: Crawler) -> SessionPool | None:
    """The node's session pool, shared by the block middleware and the frontier's loop;
    None without sessions (SESSION_ENABLED off and no PROXY_POOL)."""
    if crawler not in _POOLS:
        config = SessionConfig.from_settings(crawler.settings)
        _POOLS[crawler] = SessionPool(config) if config.enabled else None
    return _POOLS[crawler]
