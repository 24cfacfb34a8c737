"""Sites: the politeness unit of a request, and where the fleet may send its nodes."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from project.frontier.codes import SCOPE_REDIRECT

if TYPE_CHECKING:
    from project.frontier.queue import StepBatch

__all__ = [
    "MAX_URL_LENGTH",
    "SiteResolver",
    "is_private_host",
    "related_hosts",
    "site_of",
    "url_refusal",
]

logger = logging.getLogger(__name__)

#: Longer URLs are dropped (browsers and most servers stop at about this length).
MAX_URL_LENGTH = 2083
_SCHEMES = frozenset({"http", "https"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _netloc(host: str, port: int | None) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port is not None else host


def site_of(url: str) -> str:
    """A URL's site: its lower-cased ``host[:port]``, without credentials (``_`` if none)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        return _netloc(host, parts.port) if host else "_"
    except ValueError:
        return "_"


def url_refusal(url: str) -> str | None:
    """Why the frontier will not queue *url* (``too_long``, ``scheme``, ``invalid``), or None."""
    if len(url) > MAX_URL_LENGTH:
        return "too_long"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError:
        return "invalid"
    if parts.scheme not in _SCHEMES:
        return "scheme"
    if not parts.hostname:
        return "invalid"
    return None


def is_private_host(host: str) -> bool:
    """Loopback, private, link-local or otherwise not a public internet address (by literal)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: where it points is DNS's business at download time
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return not address.is_global


def related_hosts(a: str, b: str) -> bool:
    """One host is the other, or a subdomain of it (``shop.example`` and ``www.shop.example``)."""
    a, b = a.lower().rstrip("."), b.lower().rstrip(".")
    return a == b or a.endswith("." + b) or b.endswith("." + a)


class SiteResolver:
    """``FRONTIER_SITE_KEY = "ip"``: one politeness unit per server, whatever its host names.

    A ``host[:port]`` becomes ``ip[:port]``, resolved at most once per ``ttl``
    seconds per node (the host name itself when it does not resolve). Names
    resolve concurrently, never one after the other inside a step.
    """

    def __init__(self, ttl: float = 300.0) -> None:
        self.ttl = ttl
        self._sites: dict[str, tuple[float, str]] = {}

    async def resolve(self, netloc: str) -> str:
        """``ip[:port]`` of a ``host[:port]``."""
        cached = self._sites.get(netloc)
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        try:
            parts = urlsplit("//" + netloc)
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname or netloc, None, family=socket.AF_INET
            )
            site = _netloc(str(infos[0][4][0]), parts.port)
        except (OSError, IndexError, ValueError) as exc:
            logger.warning("Cannot resolve %s (%s): limiting it by name", netloc, exc)
            site = netloc
        self._sites[netloc] = (time.monotonic(), site)
        return site

    async def resolve_all(self, netlocs: set[str]) -> dict[str, str]:
        """Each of *netlocs* resolved, all at once."""
        names = sorted(netlocs)
        sites = await asyncio.gather(*(self.resolve(n) for n in names))
        return dict(zip(names, sites, strict=True))

    async def rekey(self, batch: StepBatch) -> None:
        """Name the sites of a batch's new requests and latencies by IP. Retries and pauses
        keep the site their lease was granted under."""
        names = {entry[1] for entry in batch.enqueue} | {s for s, _, _ in batch.latency}
        names |= {scope[1:] for *_, scope in batch.enqueue if scope.startswith(SCOPE_REDIRECT)}
        ip = await self.resolve_all(names)
        batch.enqueue = [
            (fp, ip[site], priority, payload, _rescope(scope, ip))
            for fp, site, priority, payload, scope in batch.enqueue
        ]
        batch.latency = [(ip[s], total, n) for s, total, n in batch.latency]


def _rescope(scope: str, ip: dict[str, str]) -> str:
    # A redirect's scope names the site it came from: by IP too.
    return SCOPE_REDIRECT + ip[scope[1:]] if scope.startswith(SCOPE_REDIRECT) else scope
