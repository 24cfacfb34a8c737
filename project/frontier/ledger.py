"""A node's download permits and the leased requests waiting for them, without I/O.

The fleet keeps every site's permits in Redis (lua/lib/permits.lua); a node keeps its
own side here: the permits it holds per site, the downloads using them, the requests
it leased and has not dispatched yet (best first), and those waiting for a permit of
their site to end. Each round trip the ledger says what to ask for (:meth:`plan`) and
takes in what the step granted or took back (:meth:`apply`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request

    from project.frontier.queue import StepBatch

__all__ = ["Lease", "PermitLedger"]


@dataclass(slots=True)
class Lease:
    """A request this node holds: its in-flight member, site and payload."""

    member: bytes
    site: str
    payload: bytes
    leased_at: float = 0.0  # monotonic time the node took it
    downloading: bool = False  # it holds one of its site's download permits


_Entry = tuple[float, int, "Request", Lease]


class PermitLedger:
    """Permits held, downloads running and leased requests, per site."""

    def __init__(self, concurrency: int, prefetch: int) -> None:
        #: CONCURRENT_REQUESTS: permits this node may hold over all sites.
        self.concurrency = concurrency
        #: FRONTIER_PREFETCH: requests leased ahead per site with permits (0: none).
        self.prefetch = prefetch
        self.permits: Counter[str] = Counter()  # held, per site
        self.busy: Counter[str] = Counter()  # downloading, per site
        #: permits the step under way gives back, per site: no download starts with them
        self._giving: Counter[str] = Counter()
        self.ready: Counter[str] = Counter()  # leased, not dispatched, per site
        self.ended: Counter[str] = Counter()  # downloads ended since the last round trip
        self.shares: dict[str, int] = {}  # this node's share of a site's cap (0: no cap)
        #: Requests dispatched to the engine and not settled yet.
        self.dispatched: dict[Request, Lease] = {}
        self._too_old: set[bytes] = set()  # leases past FRONTIER_MAX_LEASE_SECONDS
        self._heap: list[_Entry] = []
        self._blocked: dict[str, list[_Entry]] = {}  # waiting for a permit of their site
        self._counter = 0

    # -- requests --------------------------------------------------------------

    def add(self, score: float, request: Request, lease: Lease) -> None:
        """A request leased to this node, ordered by its queue score."""
        self._counter += 1
        heapq.heappush(self._heap, (score, self._counter, request, lease))
        self.ready[lease.site] += 1

    def pop(self) -> Request | None:
        """The best leased request whose site has a free permit, now dispatched."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            *_, request, lease = entry
            site = lease.site
            if self.busy[site] >= self.usable(site):
                # every permit of its site is downloading: it waits for one to end
                self._blocked.setdefault(site, []).append(entry)
                continue
            break
        else:
            return None
        self.busy[site] += 1
        self.ready[site] -= 1
        lease.downloading = True
        self.dispatched[request] = lease
        return request

    def end_download(self, lease: Lease) -> None:
        """*lease*'s download ended: its permit may start the next request of its site."""
        if not lease.downloading:
            return
        lease.downloading = False
        self.busy[lease.site] -= 1
        self.ended[lease.site] += 1
        self._unblock(lease.site)

    def settle(self, request: Request) -> Lease:
        """*request* left the engine: forget it (its download ended, if it had not)."""
        lease = self.dispatched.pop(request)
        self.end_download(lease)
        self._too_old.discard(lease.member)
        return lease

    def live(self, now: float, max_age: float) -> tuple[list[bytes], list[tuple[Request, float]]]:
        """Dispatched leases to heartbeat, and those that just became older than *max_age*
        seconds (FRONTIER_MAX_LEASE_SECONDS): let go, so another node retries them."""
        live: list[bytes] = []
        too_old: list[tuple[Request, float]] = []
        for request, lease in self.dispatched.items():
            if now - lease.leased_at <= max_age:
                live.append(lease.member)
            elif lease.member not in self._too_old:
                self._too_old.add(lease.member)
                too_old.append((request, now - lease.leased_at))
        return live, too_old

    def undispatched(self) -> list[Lease]:
        """Leases not handed to the engine yet."""
        leases = [lease for *_, lease in self._heap]
        for waiting in self._blocked.values():
            leases += [lease for *_, lease in waiting]
        return leases

    @property
    def pending(self) -> bool:
        """Leased requests not dispatched yet."""
        return bool(self._heap or self._blocked)

    @property
    def has_heap(self) -> bool:
        """Requests ready to try now (not waiting for a permit)."""
        return bool(self._heap)

    @property
    def undispatched_count(self) -> int:
        return sum(self.ready.values())

    @property
    def held(self) -> int:
        """Requests this node holds: leased but not yet settled."""
        return sum(self.ready.values()) + len(self.dispatched)

    @property
    def downloading(self) -> int:
        return sum(self.busy.values())

    # -- permits ---------------------------------------------------------------

    def usable(self, site: str) -> int:
        """Permits of *site* this node may download with: those above its share go back."""
        share = self.shares.get(site, 0)
        permits = self.permits[site] - self._giving[site]
        return min(permits, share) if share else permits

    def holds(self, site: str) -> bool:
        """Permits of *site*, or downloads of it (reclaimed permits leave those running)."""
        return bool(self.permits[site] or self.busy[site])

    def covered(self, site: str) -> bool:
        """Whether this node holds a permit of *site* for each of its downloads of it (not
        so after the fleet took its permits back while it stalled)."""
        return self.busy[site] <= self.permits[site]

    def slots(self) -> int:
        """New download permits this node could use (CONCURRENT_REQUESTS in all)."""
        return max(0, self.concurrency - sum(self.permits.values()))

    def _unblock(self, site: str) -> None:
        waiting = self._blocked.pop(site, None)
        if waiting:
            for entry in waiting:
                heapq.heappush(self._heap, entry)

    def plan(self, batch: StepBatch, most: int) -> None:
        """What to lease, per site and in all, and which permits to give back.

        A free permit above this node's share of the site's cap goes back; a spare one (free,
        no request to start) asks for a request of its site, and goes back in the same round
        trip if the site has none; requests waiting for a permit ask for one; and each site
        with permits keeps a few requests more than it can start (FRONTIER_PREFETCH, or three
        times the downloads that ended since the last round trip), so a download that ends
        starts the next at once. FRONTIER_PREFETCH = 0 leases only what starts at once, for
        strict priority order. *most*: requests one round trip leases at most.
        """
        held = 0
        more = 0
        # permits above the node's limit, once FLEET_AUTOTUNE lowered it: free ones go back
        excess = sum(self.permits.values()) - self.concurrency
        uncovered = (s for s, n in self.busy.items() if n > self.permits[s])
        for site in {*self.permits, *(s for s, n in self.ready.items() if n > 0), *uncovered}:
            permits, busy, ready = self.permits[site], self.busy[site], self.ready[site]
            over = permits - max(busy, self.usable(site))  # free, above this node's share
            if excess > 0:
                over = max(over, min(permits - busy, excess))
            if over > 0:
                batch.give_back.append((site, over))
                # not used for a download while the step that gives it back is under way
                self._giving[site] += over
                permits -= over
                excess -= over
            held += permits
            spare = max(0, permits - busy - ready)
            waiting = max(0, ready - (permits - busy))
            target = 0
            if self.prefetch and permits > 0:
                target = min(permits, max(self.prefetch, 3 * self.ended[site]))
            extra = spare + max(0, target - waiting)
            batch.ahead.append((site, extra, waiting, permits, spare))
            more += extra
        batch.slots = max(0, self.concurrency - held)
        batch.want = min(most, batch.slots + more)
        self.ended.clear()

    def runs_short(self) -> bool:
        """Whether a site needs a round trip now: a spare permit to lease a request for,
        requests leased ahead that would not last another tick, requests without a permit,
        or downloads without one (held back until they have one).
        """
        for site, permits in self.permits.items():
            ready, busy = self.ready[site], self.busy[site]
            if permits - busy > ready:
                return True  # a spare permit: lease a request for it
            if ready - (permits - busy) < max(1, self.ended[site]):
                return True  # what is leased ahead would not last another tick
        if any(n > self.permits[s] for s, n in self.busy.items()):
            return True
        return any(n > 0 and not self.permits[s] for s, n in self.ready.items())

    def apply(
        self,
        returned: Iterable[tuple[str, int]],
        granted: list[tuple[str, int]],
        shares: dict[str, int],
    ) -> None:
        """A step ran: permits given back (this node's and the spare ones the step sent
        back), granted, and this node's shares of the caps of the sites it named."""
        self._giving.clear()  # what this node gave back is in *returned*
        for site, n in returned:
            self.permits[site] -= n
            if self.permits[site] <= 0:
                del self.permits[site]
        self.shares.update(shares)
        for site, n in granted:
            self.permits[site] += n
            self._unblock(site)
        for site in [s for s, n in self.ready.items() if n <= 0 and not self.holds(s)]:
            # a site this node is done with: forget it (a crawl may see thousands)
            del self.ready[site]
            self.busy.pop(site, None)
            self.shares.pop(site, None)

    def table(self, give_back: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The permits this node holds, per site, once *give_back* went (a step's table)."""
        held = Counter(self.permits)
        for site, n in give_back:
            held[site] -= n
        return sorted((site, n) for site, n in held.items() if n > 0)

    def correct(
        self, counted: Iterable[tuple[str, int]], give_back: Iterable[tuple[str, int]]
    ) -> int:
        """Redis counts fewer permits for this node than it does (*counted*, after the
        step's *give_back*): it holds what Redis counts. Returns the permits dropped."""
        back = Counter(dict(give_back))
        dropped = 0
        for site, n in counted:
            keep = n + back[site]  # apply() takes the give-back off next
            if self.permits[site] > keep:
                dropped += self.permits[site] - keep
                self.permits[site] = keep
                if keep <= 0:
                    del self.permits[site]
        return dropped

    def reclaimed(self) -> int:
        """The fleet took every permit back (this node stalled past its lease): it holds
        none; downloads it started before count for no permit. Returns the permits lost."""
        lost = sum(self.permits.values())
        self.permits.clear()
        return lost

    def release(self) -> None:
        """Every permit went back to the fleet (the node closes)."""
        self.permits.clear()
