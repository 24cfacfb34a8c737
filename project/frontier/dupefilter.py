"""Shared seen-set of request fingerprints in Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redis.dupefilter import RFPDupeFilter

from project.frontier.config import FrontierConfig
from project.frontier.keys import FrontierKeys
from project.frontier.spiders import seed_key

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
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
            FrontierConfig.from_settings(settings).sync_client(),
            key=_keys(settings, crawler.spider).dupefilter,
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


def _keys(settings: BaseSettings, spider: Spider) -> FrontierKeys:
    """*spider*'s keys, its own ``redis_key`` included (tagged, it decides the slot)."""
    keys = FrontierKeys.from_settings(settings, spider.name)
    return keys.with_start_urls(seed_key(spider, keys.start_urls))
