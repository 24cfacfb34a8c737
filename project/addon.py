"""FleetAddon: the one ``ADDONS`` line that makes a Scrapy project a fleet node.

Every component goes in with ``setdefault``-style updates at the add-on's
priority, so a project's own settings (``settings.py``, ``-s``) win::

    ADDONS = {"project.addon.FleetAddon": 0}
    REDIS_URL = "redis://10.0.0.5:6379/0"
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import NotConfigured

from pipelines.mongo import MongoPipeline
from pipelines.validation import ValidationConfig, ValidationPipeline
from project.blocking.config import BlockConfig, SessionConfig
from project.blocking.last_hop import SessionLastHopMiddleware
from project.blocking.middleware import BlockDetectionMiddleware
from project.config import FleetConfigError, exported_defaults
from project.dataout.config import DataOutConfig
from project.frontier.autotune import AutotuneConfig
from project.frontier.compat import check_settings
from project.frontier.config import FLEET_RETRY_TIMES, FrontierConfig, RetryConfig
from project.frontier.gate import PermitGateMiddleware
from project.frontier.keys import FrontierKeys
from project.frontier.politeness import derive
from project.frontier.retry import FrontierRetryMiddleware
from project.frontier.revisit import (
    RevisitConfig,
    RevisitLinksMiddleware,
    RevisitMiddleware,
    RevisitParseGuard,
)
from project.frontier.robots import (
    ExpiringRobotsTxtMiddleware,
    RobotsCacheMiddleware,
    RobotsConfig,
)
from project.frontier.seen import SeenConfig
from project.frontier.start import FleetStartMiddleware
from project.frontier.stopping import NodeStop, StopConfig
from project.monitoring.node import MonitorConfig, NodeMonitor
from project.monitoring.statsfile import StatsFile, StatsFileConfig
from project.rendering.config import RenderingConfig, RenderingConfigError
from project.rendering.launch import RENDER_RETRY_EXCEPTIONS, use_system_chromium
from project.rendering.middleware import RenderingMiddleware
from project.rendering.samples import AdaptiveSamples
from project.runs.report import RunsConfig
from project.runs.tracker import RunTracker
from project.storage.config import MongoConfig, StorageConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["FleetAddon"]

logger = logging.getLogger(__name__)

_PRIORITY = "addon"
_PLAYWRIGHT_HANDLER = "project.rendering.download.FleetDownloadHandler"

#: Scrapy settings the fleet needs one way: asyncio for scrapy-playwright and
#: the async Redis and MongoDB clients; no telnet console or remote-control
#: server on crawler nodes; robots.txt obeyed, once per site for the fleet.
_SETTINGS = {
    "ROBOTSTXT_OBEY": True,
    "SCHEDULER": "project.frontier.scheduler.FleetScheduler",
    "DUPEFILTER_CLASS": "project.frontier.dupefilter.FleetDupeFilter",
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
    # Retries are cheap on the fleet (no node waits for one): one more than Scrapy's 2.
    "RETRY_TIMES": FLEET_RETRY_TIMES,
    # A page from a stranger costs at most this much memory (Scrapy's own cap is 1 GiB).
    "DOWNLOAD_MAXSIZE": 16 * 1024 * 1024,
    "DOWNLOAD_WARNSIZE": 4 * 1024 * 1024,
}

#: Only the web: a link to file:///dev/zero or ftp:// must not reach a handler.
_NO_HANDLER_SCHEMES = ("file", "s3", "ftp", "data")

_DOWNLOADER_MIDDLEWARES = {
    # Retries go back through Redis with a not-before time instead.
    RetryMiddleware: None,
    FrontierRetryMiddleware: 550,
    # Scrapy's RobotsTxtMiddleware (100), its parsers expiring; it downloads robots.txt
    # through the fleet's cache right after it.
    RobotsTxtMiddleware: None,
    ExpiringRobotsTxtMiddleware: 100,
    RobotsCacheMiddleware: 101,
    RenderingMiddleware: 560,
    # Between HttpCompression (590) and the retries: a 304 is "unchanged", not an error.
    RevisitMiddleware: 580,
    # After redirects and HttpCompression, before the revisits and retries: a blocked page
    # is never parsed, and a 403 or 429 is a block before it is an error.
    BlockDetectionMiddleware: 585,
    # Last before the download handler (after HttpCache's 900): a node back from a stall
    # sends nothing before it knows it still holds a permit for it.
    PermitGateMiddleware: 950,
    # After the gate: a session retired while its request waited is swapped for another;
    # its cookie jar goes on last, and takes every answer's cookies before redirects do.
    SessionLastHopMiddleware: 960,
}

# start_urls and start() seed the fleet once, not once per node; first after the engine.
# the guard next to the spider: it hears a callback's exception before any middleware of the
# project can swallow it
# Adaptive rendering's samples after Scrapy's DepthMiddleware (900): a sample's twin keeps its
# page's depth (project/rendering/samples.py).
_SPIDER_MIDDLEWARES = {
    FleetStartMiddleware: 10,
    RevisitLinksMiddleware: 20,
    AdaptiveSamples: 890,
    RevisitParseGuard: 990,
}

_EXTENSIONS = {NodeMonitor: 500, StatsFile: 510, RunTracker: 520, NodeStop: 530}
#: Scrapy 2.19's remote-control server, off on crawler nodes: out of EXTENSIONS_BASE, not
#: only disabled, because loading its module imports aiohttp (about 0.2 s of every start).
_REMOTE_CONTROL = "scrapy.extensions.remote_control.RemoteControl"

_ITEM_PIPELINES = {ValidationPipeline: 100, MongoPipeline: 300}


def _setdefault(settings: BaseSettings, name: str, value: object) -> None:
    # Only over Scrapy's defaults: a value the project set has a higher priority.
    settings.set(name, value, priority=_PRIORITY)


class FleetAddon:
    """Wires the shared frontier, retries, shared robots.txt, rendering, monitoring
    and the item pipelines into a Scrapy project, and checks for Chromium."""

    def update_settings(self, settings: BaseSettings) -> None:
        """Add the fleet's components unless the project configured them itself."""
        for name, value in _SETTINGS.items():
            _setdefault(settings, name, value)
        for name, default in exported_defaults(RenderingConfig).items():
            _setdefault(settings, name, default)
        # Node limits from the fleet's: FRONTIER_SITE_CONCURRENCY is the one knob of a site.
        derive(settings, _PRIORITY)
        for setting, components in (
            ("DOWNLOADER_MIDDLEWARES", _DOWNLOADER_MIDDLEWARES),
            ("SPIDER_MIDDLEWARES", _SPIDER_MIDDLEWARES),
            ("EXTENSIONS", _EXTENSIONS),
            ("ITEM_PIPELINES", _ITEM_PIPELINES),
        ):
            for component, order in components.items():
                settings.setdefault_in_component_priority_dict(setting, component, order)  # type: ignore[arg-type]
        handlers = settings.getdict("DOWNLOAD_HANDLERS")
        for scheme in ("http", "https"):
            handlers.setdefault(scheme, _PLAYWRIGHT_HANDLER)
        for scheme in _NO_HANDLER_SCHEMES:
            handlers.setdefault(scheme, None)
        priority = settings.getpriority("DOWNLOAD_HANDLERS") or 0
        settings.set("DOWNLOAD_HANDLERS", handlers, priority=priority)
        if not settings.getbool("REMOTE_CONTROL_ENABLED"):
            base = settings.getdict("EXTENSIONS_BASE")
            if base.pop(_REMOTE_CONTROL, None) is not None:
                priority = settings.getpriority("EXTENSIONS_BASE") or 0
                settings.set("EXTENSIONS_BASE", base, priority=priority)
        # A failed render is a download error: retried, then dead-lettered.
        retried = settings.getlist("RETRY_EXCEPTIONS")
        retried += [name for name in RENDER_RETRY_EXCEPTIONS if name not in retried]
        priority = settings.getpriority("RETRY_EXCEPTIONS") or 0
        settings.set("RETRY_EXCEPTIONS", retried, priority=priority)
        try:
            _check(settings)
            use_system_chromium(settings)
        except (NotConfigured, RenderingConfigError, StorageConfigError) as exc:
            logger.critical("Cannot start: %s", exc)
            raise FleetConfigError(str(exc)) from exc


def _check(settings: BaseSettings) -> None:
    """Every fleet setting parsed now, so a bad one stops the node before it starts."""
    check_settings(settings)
    FrontierConfig.from_settings(settings)
    FrontierKeys.from_settings(settings, "spider")
    RetryConfig.from_settings(settings)
    StopConfig.from_settings(settings)
    AutotuneConfig.from_settings(settings)
    RevisitConfig.from_settings(settings)
    SeenConfig.from_settings(settings)
    RobotsConfig.from_settings(settings)
    MongoConfig.from_settings(settings)
    ValidationConfig.from_settings(settings)
    if MonitorConfig.from_settings(settings).enabled:
        StatsFileConfig.from_settings(settings)
    RenderingConfig.from_settings(settings)
    BlockConfig.from_settings(settings)
    SessionConfig.from_settings(settings)
    DataOutConfig.from_settings(settings).parsed_feeds()
    runs = RunsConfig.from_settings(settings)
    if RevisitConfig.from_settings(settings).rules and not runs.enabled:
        # a page is revisited once per crawl run: without runs, pages linking each other
        # would be fetched again and again within one crawl
        raise NotConfigured(
            "FRONTIER_REVISIT needs RUNS_ENABLED (a revisit happens once per crawl run)"
        )
