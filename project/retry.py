"""Retries through the shared frontier: backoff in Redis, then a dead letter."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest
from scrapy.utils.misc import load_object

from project.scheduler import OUTCOME_META_KEY

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

__all__ = ["FrontierRetryMiddleware", "RetryConfig", "backoff_delay"]

logger = logging.getLogger(__name__)


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: between half and all of base * 2**attempt."""
    ceiling = min(cap, base * 2**attempt)
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 (jitter, not crypto)


def _retry_after(response: Response) -> float:
    value = response.headers.get(b"Retry-After")
    if not value:
        return 0.0
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        return max(0.0, parsedate_to_datetime(text).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class RetryConfig:
    """Retry settings; see the README's settings table."""

    max_retries: int = 3
    http_codes: frozenset[int] = frozenset({500, 502, 503, 504, 522, 524, 408, 429})
    exceptions: tuple[type[BaseException], ...] = ()
    backoff_base: float = 1.0
    backoff_max: float = 60.0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(
            max_retries=settings.getint("FRONTIER_RETRY_TIMES", cls.max_retries),
            http_codes=frozenset(
                int(c)
                for c in settings.getlist("FRONTIER_RETRY_HTTP_CODES", sorted(cls.http_codes))
            ),
            exceptions=tuple(
                load_object(e) if isinstance(e, str) else e
                for e in settings.getlist("RETRY_EXCEPTIONS")
            ),
            backoff_base=settings.getfloat("FRONTIER_RETRY_BACKOFF_BASE", cls.backoff_base),
            backoff_max=settings.getfloat("FRONTIER_RETRY_BACKOFF_MAX", cls.backoff_max),
        )


class FrontierRetryMiddleware:
    """Replaces Scrapy's RetryMiddleware for frontier-scheduled requests.

    A transient failure is not retried in this process: the request goes
    back to Redis with a not-before time, so no node sleeps on it and any
    node may take it. After ``FRONTIER_RETRY_TIMES`` retries it becomes a
    dead letter (``<spider>:dead``).
    """

    def __init__(self, config: RetryConfig, stats: StatsCollector) -> None:
        self.config = config
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        return cls(RetryConfig.from_settings(crawler.settings), crawler.stats)

    def process_response(self, request: Request, response: Response) -> Response:
        if request.meta.get("dont_retry") or response.status not in self.config.http_codes:
            return response
        retry_after = _retry_after(response) if response.status in (429, 503) else 0.0
        self._settle(request, f"HTTP {response.status}", retry_after)
        if retry_after:
            # The whole fleet holds off this site, not only this request.
            request.meta[OUTCOME_META_KEY]["pause"] = retry_after
            self.stats.inc_value("frontier/retry_after")
        if request.meta[OUTCOME_META_KEY]["action"] == "retry":
            raise IgnoreRequest(f"retry scheduled after HTTP {response.status}")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if request.meta.get("dont_retry") or not isinstance(exception, self.config.exceptions):
            return
        self._settle(request, f"{type(exception).__name__}: {exception}", 0.0)
        if request.meta[OUTCOME_META_KEY]["action"] == "retry":
            raise IgnoreRequest(f"retry scheduled after {type(exception).__name__}") from exception

    def _settle(self, request: Request, error: str, at_least: float) -> None:
        retries = int(request.meta.get("retry_times", 0))
        if retries < self.config.max_retries:
            delay = max(
                at_least, backoff_delay(retries, self.config.backoff_base, self.config.backoff_max)
            )
            request.meta["retry_times"] = retries + 1
            request.meta[OUTCOME_META_KEY] = {"action": "retry", "delay": delay, "error": error}
            self.stats.inc_value("frontier/retry/count")
            self.stats.inc_value(f"frontier/retry/reason/{error.split(':')[0]}")
            return
        request.meta[OUTCOME_META_KEY] = {
            "action": "dead",
            "error": error,
            "attempts": retries + 1,
        }
        self.stats.inc_value("frontier/retry/max_reached")
        logger.warning(
            "Giving up on %s after %d attempts (%s): dead-lettered",
            request.url,
            retries + 1,
            error,
        )
