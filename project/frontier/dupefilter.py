"""Shared seen-set of request fingerprints in Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis
from scrapy_redis.dupefilter import RFPDupeFilter

from project.frontier.config import FrontierConfig
from project.frontier.keys import FrontierKeys

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

__all__ = ["FleetDupeFilter"]


class FleetDupeFilter(RFPDupeFilter):  # type: ignore[misc]
    """scrapy-redis' dupefilter keyed by Scrapy's request fingerprinter.

    Fingerprints are stored as the raw 20-byte digest instead of 40 hex
    characters. The frontier checks and adds them in batches inside its
    enqueue script; :meth:`request_seen` stays for standalone use.
    """

    def __init__(
        self,
        server: Any,
        key: str,
        fingerprinter: RequestFingerprinterProtocol,
        debug: bool = False,
    ) -> None:
        super().__init__(server, key, debug=debug)
        self.fingerprinter = fingerprinter

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        assert crawler.spider is not None
        assert crawler.request_fingerprinter is not None
        return cls(
            # redis-py connects lazily: no I/O here.
            redis.Redis.from_url(FrontierConfig.from_settings(settings).redis_url),
            key=FrontierKeys.from_settings(settings, crawler.spider.name).dupefilter,
            fingerprinter=crawler.request_fingerprinter,
            debug=settings.getbool("DUPEFILTER_DEBUG"),
        )

    def fingerprint(self, request: Request) -> bytes:
        """The member stored in the seen-set for *request*."""
        return self.fingerprinter.fingerprint(request)

    def request_fingerprint(self, request: Request) -> str:
        return self.fingerprint(request).hex()

    def request_seen(self, request: Request) -> bool:
        return int(self.server.sadd(self.key, self.fingerprint(request))) == 0

    def close(self, reason: str = "") -> None:
        """Keep the shared seen-set: other nodes are still using it."""
