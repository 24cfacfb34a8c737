"""The last hop before the network: a leased request goes on the wire only while its node
may download it (project/frontier/loop.py ``may_download``).

A node that stalled (a GC pause, a full disk, SIGSTOP) may have handed requests to the
downloader just before; back, it must not send them with permits the fleet gave to other
nodes meanwhile. So each leased request waits here, after the cache and before the
download handler, until the node's next round trip says it holds a permit for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from project.frontier.meta import LEASE_META_KEY
from project.frontier.signals import frontier_started

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler

    from project.frontier.loop import FrontierLoop

__all__ = ["DownloadGate", "PermitGateMiddleware"]


class DownloadGate:
    """The gate for a download handler: ``await gate.wait(request)`` before the wire."""

    def __init__(self, crawler: Crawler) -> None:
        self._loop: FrontierLoop | None = None
        crawler.signals.connect(self._frontier_started, signal=frontier_started)

    def _frontier_started(self, loop: FrontierLoop) -> None:
        self._loop = loop

    async def wait(self, request: Request) -> None:
        """Return when the node may download *request* (at once, unless it stalled)."""
        if self._loop is not None and request.meta.get(LEASE_META_KEY):
            await self._loop.may_download(request)


class PermitGateMiddleware:
    """Downloader middleware: a leased request waits for its node's permit before it takes a
    place in Scrapy's download slot."""

    def __init__(self, gate: DownloadGate) -> None:
        self.gate = gate

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(DownloadGate(crawler))

    async def process_request(self, request: Request) -> None:
        """Wait until the node may download *request* (at once, unless it stalled)."""
        await self.gate.wait(request)
