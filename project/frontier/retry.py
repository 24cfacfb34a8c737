"""Retries through the shared frontier: backoff in Redis, then a dead letter."""

from __future__ import annotations

import logging
import random
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import DownloadCancelledError, IgnoreRequest
from scrapy.utils.response import response_status_message

from project.frontier.config import RetryConfig
from project.frontier.meta import LEASE_META_KEY, OUTCOME_META_KEY, RETRY_COPY_META_KEY
from project.frontier.stopping import SentBack
from project.utils import mask_url

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

__all__ = ["FrontierRetryMiddleware", "RetryPolicy", "backoff_delay", "retry_after"]

logger = logging.getLogger(__name__)


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: between half and all of base * 2**attempt."""
    ceiling = min(cap, base * 2**attempt)
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 (jitter, not crypto)


def retry_after(response: Response) -> float:
    """Seconds a response's Retry-After asks for: 0 when absent or unparseable."""
    value = response.headers.get(b"Retry-After")
    if not value:
        return 0.0
    text = value.decode("latin-1").strip()[:64]
    if text.isdigit():
        return float(text)
    try:
        return max(0.0, parsedate_to_datetime(text).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError, IndexError):
        return 0.0


def _meta_int(request: Request, key: str, default: int) -> int:
    """An integer a spider (or a payload from Redis) put in meta; anything else: *default*."""
    value = request.meta.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 1_000_000:
        return value
    return default


def _retriable(request: Request) -> bool:
    # Only the frontier's own leases go back through Redis; requests a component
    # downloads directly (robots.txt) are not retried, as before.
    return bool(request.meta.get(LEASE_META_KEY)) and not request.meta.get("dont_retry")


class RetryPolicy:
    """What becomes of a leased request that failed: a retry through Redis, or a dead letter.

    Retries are Scrapy's (``get_retry_request``: ``RETRY_TIMES`` or meta
    ``max_retry_times``, ``RETRY_PRIORITY_ADJUST`` or meta ``priority_adjust``, the
    ``retry/count``, ``retry/reason_count/<reason>`` and ``retry/max_reached`` stats);
    the retry copy waits in Redis for its not-before time instead of in this process.
    Its outcome goes into ``request.meta[OUTCOME_META_KEY]``; the frontier settles the
    lease by it once the request has left the engine.
    """

    def __init__(
        self, config: RetryConfig, stats: StatsCollector, crawler: Crawler, maxsize: int = 0
    ) -> None:
        self.config = config
        self.stats = stats
        self.crawler = crawler
        self.maxsize = maxsize

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        settings = crawler.settings
        return cls(
            RetryConfig.from_settings(settings),
            crawler.stats,
            crawler,
            settings.getint("DOWNLOAD_MAXSIZE"),
        )

    def why(self, request: Request, exception: Exception) -> str:
        """What an exception without a message means here."""
        if isinstance(exception, DownloadCancelledError):
            limit = request.meta.get("download_maxsize", self.maxsize)
            return f"larger than DOWNLOAD_MAXSIZE ({limit} bytes), or stopped"
        return "no message"

    def retry(
        self, request: Request, error: str, at_least: float, reason: str | Exception | None = None
    ) -> Request | None:
        """The retry copy of *request* to return to the engine, or None: a dead letter then."""
        spider: Spider | None = self.crawler.spider
        assert spider is not None
        copy = get_retry_request(
            request,
            spider=spider,
            reason=reason if reason is not None else error,
            max_retry_times=_meta_int(request, "max_retry_times", self.config.max_retries),
            priority_adjust=_meta_int(request, "priority_adjust", self.config.priority_adjust),
            logger=logger,
        )
        if copy is None:
            self.give_up(request, error, "max_reached")
            return None
        retries = int(copy.meta["retry_times"]) - 1
        self.again(request, copy, max(at_least, self.backoff(retries)), error)
        return copy

    def backoff(self, retries: int) -> float:
        """Seconds the retry after *retries* earlier ones waits (jittered)."""
        return backoff_delay(retries, self.config.backoff_base, self.config.backoff_max)

    def again(self, request: Request, copy: Request, delay: float, error: str) -> None:
        """*request* leaves the engine to be tried again as *copy*, through Redis, in *delay*
        seconds: its lease settles as that retry."""
        copy.meta[RETRY_COPY_META_KEY] = True
        request.meta[OUTCOME_META_KEY] = {
            "action": "retry",
            "delay": delay,
            "error": error,
            "request": copy,
        }
        self.stats.inc_value("frontier/retry/count")
        self.stats.inc_value(f"frontier/retry/reason/{error.split(':')[0]}")

    def give_up(self, request: Request, error: str, why: str, attempts: int | None = None) -> None:
        if attempts is None:
            attempts = int(request.meta.get("retry_times", 0)) + 1
        request.meta[OUTCOME_META_KEY] = {"action": "dead", "error": error, "attempts": attempts}
        self.stats.inc_value(f"frontier/retry/{why}")
        logger.warning(
            "Giving up on %s after %d attempts (%s): dead-lettered",
            mask_url(request.url),
            attempts,
            error,
        )


class FrontierRetryMiddleware:
    """Replaces Scrapy's RetryMiddleware for frontier-scheduled requests.

    A transient failure (``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS``) is not retried
    in this process: Scrapy's retry copy goes back to Redis with a not-before time, so
    no node sleeps on it and any node may take it; the spider's errback is not called
    for it. After ``RETRY_TIMES`` retries the request becomes a dead letter
    (``<spider>:dead``), and the errback (or callback) sees the last failure.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.config = policy.config
        self.stats = policy.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(RetryPolicy.from_crawler(crawler))

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if not _retriable(request) or response.status not in self.config.http_codes:
            return response
        wait = retry_after(response) if response.status in (429, 503) else 0.0
        error = f"HTTP {response.status}"
        copy = None
        if wait > self.config.retry_after_max_wait:
            # Waiting that long would hold the crawl open: a dead letter now, with the reason.
            self.policy.give_up(
                request, f"{error} with Retry-After {wait:.0f}s", "retry_after_too_long"
            )
        else:
            copy = self.policy.retry(request, error, wait, response_status_message(response.status))
        if wait:
            # The whole fleet holds off this site, not only this request, but never for
            # long: a site that still says wait is asked again after the pause.
            request.meta[OUTCOME_META_KEY]["pause"] = min(wait, self.config.retry_after_max_pause)
            self.stats.inc_value("frontier/retry_after")
        return copy or response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if isinstance(exception, SentBack) and request.meta.get(OUTCOME_META_KEY):
            # cut by the node's stop, or put off: it goes back through Redis (its outcome
            # says so), and the spider's errback never hears of a page fetched later
            copy = request.copy()
            copy.meta[RETRY_COPY_META_KEY] = True
            self.stats.inc_value(f"frontier/retry/reason/{type(exception).__name__}")
            # Scrapy counts it in downloader/exception_count: the error figures take it off
            self.stats.inc_value("frontier/sent_back")
            return copy
        if not _retriable(request) or isinstance(exception, IgnoreRequest):
            return None  # not ours, or dropped on purpose (robots.txt, offsite)
        error = f"{type(exception).__name__}: {str(exception)[:300] or self.policy.why(request, exception)}"
        if not isinstance(exception, self.config.exceptions):
            # Not transient (a page over DOWNLOAD_MAXSIZE, a response that cannot be
            # handled): a retry would fail alike, and an ack would lose the URL.
            self.policy.give_up(request, error, "not_retried")
            return None
        return self.policy.retry(request, error, 0.0, exception)
