"""Retries through the shared frontier: backoff in Redis, then a dead letter."""

from __future__ import annotations

import logging
import random
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest

from project.frontier.config import RetryConfig
from project.frontier.loop import LEASE_META_KEY, OUTCOME_META_KEY

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

__all__ = ["FrontierRetryMiddleware", "backoff_delay"]

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


def _retriable(request: Request) -> bool:
    # Only the frontier's own leases go back through Redis; requests a component
    # downloads directly (robots.txt) are not retried, as before.
    return bool(request.meta.get(LEASE_META_KEY)) and not request.meta.get("dont_retry")


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
        if not _retriable(request) or response.status not in self.config.http_codes:
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
        if not _retriable(request) or not isinstance(exception, self.config.exceptions):
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
