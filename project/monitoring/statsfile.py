"""The crawl's final stats as a JSON file, for scripts, scrapyd jobs and the tests."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = ["StatsFile", "StatsFileConfig"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StatsFileConfig:
    """Where the stats go; ``{spider}``, ``{pid}`` and ``{job}`` (scrapyd's job id) are replaced."""

    path: str = setting("MONITOR_STATS_FILE", "")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(**read_settings(cls, settings))


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value)


class StatsFile:
    """Extension: writes every stat and the finish reason to ``MONITOR_STATS_FILE`` at close.

    The file is replaced atomically, so a reader never sees half of it.
    """

    def __init__(self, crawler: Crawler, path: str) -> None:
        self.crawler = crawler
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = StatsFileConfig.from_settings(crawler.settings)
        if not config.path:
            raise NotConfigured  # off unless asked for: nothing to say
        extension = cls(crawler, config.path)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_closed(self, spider: Spider, reason: str) -> None:
        assert self.crawler.stats is not None
        stats = {**self.crawler.stats.get_stats(), "finish_reason": reason}
        # scrapyd passes each job's id as the spider argument _job
        job = str(getattr(spider, "_job", "") or "")
        path = Path(
            self.path.replace("{spider}", spider.name)
            .replace("{pid}", str(os.getpid()))
            .replace("{job}", job)
        )
        partial = path.with_name(path.name + ".partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(stats, default=_jsonable, indent=1, sort_keys=True))
            partial.replace(path)
        except OSError as exc:
            logger.error("Cannot write the stats to %s: %s", path, exc)
