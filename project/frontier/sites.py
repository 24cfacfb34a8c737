"""The politeness unit of a request: its site, by host name or by IP address."""

from __future__ import annotations

import asyncio
import logging
import socket
from urllib.parse import urlsplit

__all__ = ["SiteResolver", "site_of"]

logger = logging.getLogger(__name__)


def site_of(url: str) -> str:
    """A URL's site: its lower-cased ``host[:port]`` (``_`` when it has none)."""
    try:
        return urlsplit(url).netloc.lower() or "_"
    except ValueError:
        return "_"


class SiteResolver:
    """``FLEET_SITE_KEY = "ip"``: one politeness unit per server, whatever its host names.

    A ``host[:port]`` becomes ``ip[:port]``, resolved once per node (the host
    name itself when it does not resolve).
    """

    def __init__(self) -> None:
        self._sites: dict[str, str] = {}

    async def resolve(self, netloc: str) -> str:
        """``ip[:port]`` of a ``host[:port]``."""
        cached = self._sites.get(netloc)
        if cached is not None:
            return cached
        try:
            parts = urlsplit("//" + netloc)
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname or netloc, None, family=socket.AF_INET
            )
            ip = str(infos[0][4][0])
            site = f"{ip}:{parts.port}" if parts.port else ip
        except (OSError, IndexError, ValueError) as exc:
            logger.warning("Cannot resolve %s (%s): limiting it by name", netloc, exc)
            site = netloc
        self._sites[netloc] = site
        return site
