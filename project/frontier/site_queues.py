"""The per-site queues as their readers see them (lua/lib/site_queues.lua writes them).

A site's requests wait in one list per priority, in arrival order, and the site's sorted set
of those priorities scores each by its band (a list it holds may be empty until the next pop
finds it so); an entry is the payload packed with its arrival; a site's size is the requests
it has had queued less those leased (the header of lib/site_queues.lua). ``fleetcrawl
status``, the admin commands, the tests and the benchmarks read them through these
functions, never by key themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import redis

    from project.frontier.keys import FrontierKeys

__all__ = [
    "OLDER",
    "PRIORITY_BAND",
    "SiteQueue",
    "queued_requests",
    "read_site_queues",
    "site_queue_bytes",
    "site_queue_keys",
    "site_queue_patterns",
    "site_queue_size",
    "site_queue_sizes",
    "sites_queued",
    "unpack_entry",
]

#: The member of a site's index that stands for its sorted set of the older layout.
OLDER = b"z"
#: Queue scores are -priority * PRIORITY_BAND + arrival: the band lib/site_queues.lua scores
#: with, the one Python copy (readers and tests import it from here or from status).
PRIORITY_BAND = 10_000_000_000
_FORM_A = 0x41  # the form byte: "A" + 2 * url (0 none, 1 https, 2 http) + 1 with an id
_ARRIVAL_BYTES = 5
_ID_BYTES = 6
_GLOB_SPECIAL = re.compile(rb"([*?\[\]\\])")


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def unpack_entry(entry: bytes, site: bytes | str) -> tuple[bytes, int]:
    """The payload and arrival of one entry of *site*'s priority lists (``unpack_entry``)."""
    form = entry[0] - _FORM_A if entry else -1
    if not 0 <= form <= 5 or len(entry) < 1 + _ARRIVAL_BYTES + _ID_BYTES * (form % 2):
        return entry, 0  # not written by the scripts: a payload of its own
    arrival = int.from_bytes(entry[1 : 1 + _ARRIVAL_BYTES], "big")
    start, tail = 1 + _ARRIVAL_BYTES, b""
    if form % 2:
        delivery = entry[start : start + _ID_BYTES].hex().encode()
        tail = b',"id":"' + delivery + b'"}'
        start += _ID_BYTES
    url = form // 2
    opening = b'{"url":"' + (b"https://", b"http://")[url - 1] + _bytes(site) if url else b""
    return opening + entry[start:] + tail, arrival


@dataclass(frozen=True)
class SiteQueue:
    """One site's queue: its priorities with requests (and the older layout's sorted set,
    :data:`OLDER`), best first, each with its index score and its size."""

    site: bytes
    heads: list[tuple[bytes, float]]
    sizes: dict[bytes, int]

    @property
    def size(self) -> int:
        """Requests queued."""
        return sum(self.sizes.values())


def _keys(keys: FrontierKeys) -> tuple[bytes, bytes, bytes]:
    queue = keys.queue.encode("utf-8", "surrogateescape")
    return queue + b"|i|", queue + b"|p", queue + b":"


def site_queue_keys(keys: FrontierKeys, site: bytes | str, members: Sequence[bytes]) -> list[bytes]:
    """The keys of *site*'s queue with these index members: index, lists, older sorted set."""
    index, lists, older = _keys(keys)
    site = _bytes(site)
    return [index + site] + [
        older + site if member == OLDER else lists + member + b"|" + site for member in members
    ]


def read_site_queues(
    client: redis.Redis, keys: FrontierKeys, sites: Sequence[bytes | str], *, most: int = -1
) -> list[SiteQueue]:
    """The queues of *sites* (at most *most* priorities each), in two round trips."""
    index, _, older = _keys(keys)
    names = [_bytes(site) for site in sites]
    pipe = client.pipeline(transaction=False)
    for site in names:
        pipe.zrange(index + site, 0, most, withscores=True)
    heads: list[list[tuple[bytes, float]]] = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for site, members in zip(names, heads, strict=True):
        if not members:  # maybe an older sorted set no script has touched since
            pipe.zrange(older + site, 0, 0, withscores=True)
            pipe.zcard(older + site)
        built = site_queue_keys(keys, site, [member for member, _ in members])
        for key, (member, _) in zip(built[1:], members, strict=True):
            if member == OLDER:
                pipe.zcard(key)
            else:
                pipe.llen(key)
    replies: Iterator[Any] = iter(pipe.execute() if len(pipe) else [])
    queues = []
    for site, members in zip(names, heads, strict=True):
        if not members:
            head, n = next(replies), int(next(replies))
            if head and n:
                queues.append(SiteQueue(site, [(OLDER, float(head[0][1]))], {OLDER: n}))
            else:
                queues.append(SiteQueue(site, [], {}))
            continue
        sizes = {member: int(next(replies)) for member, _ in members}
        queues.append(SiteQueue(site, [(m, float(s)) for m, s in members], sizes))
    return queues


def site_queue_sizes(
    client: redis.Redis,
    keys: FrontierKeys,
    sites: Sequence[bytes | str],
    counts: Sequence[Any] | None = None,
    leases: Sequence[Any] | None = None,
) -> list[int]:
    """Requests each of *sites* has queued, its count of requests pushed less its leases:
    one round trip (none when *counts* and *leases* are the ``HMGET`` of
    :attr:`FrontierKeys.site_counts` and of :attr:`FrontierKeys.leases` already read), one
    more when some site still has its requests in the older layout only."""
    names = [_bytes(site) for site in sites]
    if not names:
        return []
    if counts is None or leases is None:
        with client.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.site_counts, names)  # type: ignore[arg-type]
            pipe.hmget(keys.leases, names)  # type: ignore[arg-type]
            counts, leases = pipe.execute()
    found: list[Any] = [
        None if n is None else int(n) - int(taken or 0)
        for n, taken in zip(counts, leases, strict=True)
    ]
    missing = [j for j, n in enumerate(found) if n is None]
    if missing:
        older = _keys(keys)[2]
        pipe = client.pipeline(transaction=False)
        for j in missing:
            pipe.zcard(older + names[j])
        for j, n in zip(missing, pipe.execute(), strict=True):
            found[j] = n
    return [int(n) for n in found]


def site_queue_size(client: redis.Redis, keys: FrontierKeys, site: bytes | str) -> int:
    """Requests *site* has queued."""
    return site_queue_sizes(client, keys, [site])[0]


def queued_requests(
    client: redis.Redis, keys: FrontierKeys, site: bytes | str
) -> list[tuple[bytes, float]]:
    """Every request *site* has queued, best first: (payload, score), as a lease gets them."""
    (queue,) = read_site_queues(client, keys, [site])
    found: list[tuple[bytes, float]] = []
    for key, (member, _) in zip(
        site_queue_keys(keys, site, [m for m, _ in queue.heads])[1:], queue.heads, strict=True
    ):
        if member == OLDER:
            older: Any = client.zrange(key, 0, -1, withscores=True)
            found += [(bytes(p), float(s)) for p, s in older]
            continue
        listed: Any = client.lrange(key, 0, -1)
        band = -float(member) * PRIORITY_BAND
        found += [
            (payload, band + arrival)
            for payload, arrival in (unpack_entry(e, site) for e in listed)
        ]
    return sorted(found, key=lambda request: request[1])


def site_queue_bytes(
    client: redis.Redis, keys: FrontierKeys, sites: Sequence[bytes | str]
) -> tuple[int, int]:
    """``MEMORY USAGE`` (exact) of every key of *sites*' queues and of the site counts, and
    the requests they hold (for the benchmarks: a few round trips per 500 sites)."""
    used = int(client.memory_usage(keys.site_counts, samples=0) or 0)  # type: ignore[no-untyped-call]
    held = 0
    for start in range(0, len(sites), 500):
        queues = read_site_queues(client, keys, sites[start : start + 500])
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            held += queue.size
            for key in site_queue_keys(keys, queue.site, [m for m, _ in queue.heads]):
                pipe.memory_usage(key, samples=0)
        used += sum(int(n or 0) for n in pipe.execute())
    return used, held


def site_queue_patterns(keys: FrontierKeys) -> list[bytes]:
    """SCAN patterns of every key of the spider's site queues (the older layout's too)."""
    queue = _GLOB_SPECIAL.sub(rb"\\\1", keys.queue.encode("utf-8", "surrogateescape"))
    return [queue + b"|*", queue + b":*"]


def sites_queued(client: redis.Redis, keys: FrontierKeys) -> Iterator[bytes]:
    """Every site with a queue (SCAN: for tests and repairs, not for a step)."""
    index, _, older = _keys(keys)
    seen: set[bytes] = set()
    for pattern, prefix in zip(site_queue_patterns(keys), (index, older), strict=True):
        for key in client.scan_iter(match=pattern, count=1000):
            if key.startswith(prefix) and key[len(prefix) :] not in seen:
                seen.add(key[len(prefix) :])
                yield key[len(prefix) :]
