"""Scrapy settings of fleetcrawl; every custom setting is in the README's table."""

from __future__ import annotations

import os

BOT_NAME = "fleetcrawl"
SPIDER_MODULES = ["spiders"]
NEWSPIDER_MODULE = "spiders"

# scrapy-playwright and our Redis/MongoDB clients need the asyncio reactor.
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"

# Shared frontier in Redis (scrapy-redis keys: <spider>:requests,
# <spider>:dupefilter, <spider>:start_urls). Nothing is wiped on close.
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
SCHEDULER = "project.scheduler.FleetScheduler"
DUPEFILTER_CLASS = "project.dupefilter.FleetDupeFilter"
SCHEDULER_PERSIST = True

FRONTIER_LEASE_SECONDS = 60.0
FRONTIER_HEARTBEAT_SECONDS = 15.0
FRONTIER_IDLE_GRACE = 5.0
FRONTIER_KEEP_ALIVE = False
FRONTIER_RETRY_TIMES = 3
FRONTIER_RETRY_BACKOFF_BASE = 1.0
FRONTIER_RETRY_BACKOFF_MAX = 60.0

DOWNLOADER_MIDDLEWARES = {
    # Retries go back through Redis with a not-before time instead.
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "project.retry.FrontierRetryMiddleware": 550,
    # robots.txt once per site per fleet, cached in Redis; Crawl-delay caps the site's rate.
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "project.robots.FleetRobotsTxtMiddleware": 100,
    "project.rendering.RenderingMiddleware": 560,
}

# --- JavaScript rendering (scrapy-playwright) ---
# Chromium renders only requests with meta["playwright"] (set by a
# PLAYWRIGHT_RENDER_URLS rule, or by the products spider's fallback for pages
# whose HTML lacks the product); all others use Scrapy's own HTTP handler.
# Playwright and Chromium start with the first render, not with the node.
# Options and figures: docs/fragments/rendering.md.
DOWNLOAD_HANDLERS = {
    "http": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
    "https": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
}
# Checks the settings and sets PLAYWRIGHT_LAUNCH_OPTIONS["executable_path"] to
# PLAYWRIGHT_CHROMIUM_PATH ($FLEETCRAWL_CHROMIUM, else /usr/bin/chromium); a
# node without Chromium stops at start instead of crawling without JavaScript.
ADDONS = {"project.rendering.ChromiumAddon": 0}
PLAYWRIGHT_BROWSER_TYPE = "chromium"
PLAYWRIGHT_BROWSER_PROVIDER = "project.rendering.LazyBrowserProvider"
PLAYWRIGHT_LAUNCH_OPTIONS = {
    "headless": True,
    "args": [
        "--no-sandbox",  # nodes run as root, where Chromium's sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        # Without these Chromium calls Google services, which closed networks refuse.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ],
}
# One browser per node; pages share contexts (a context per page costs
# twice the memory for less throughput).
PLAYWRIGHT_MAX_CONTEXTS = 1
PLAYWRIGHT_MAX_PAGES_PER_CONTEXT = 4
PLAYWRIGHT_ABORT_REQUEST = "project.rendering.abort_heavy_request"
PLAYWRIGHT_RENDER_URLS: list[str] = []  # URL regexes to always render (spider: render_urls)
# --- end of JavaScript rendering ---

MONGO_URI = os.environ.get("MONGO_URI", "mongodb://127.0.0.1:27017")
MONGO_DATABASE = os.environ.get("MONGO_DATABASE", "fleetcrawl")
ITEM_PIPELINES = {
    "pipelines.validation.ValidationPipeline": 100,
    "pipelines.mongo.MongoPipeline": 300,
}

CONCURRENT_REQUESTS = 16
ROBOTSTXT_OBEY = True

# Politeness across the fleet, enforced in Redis when a node leases work
# (per site = host[:port]); 0 means no limit. Per-site overrides:
# FLEET_SITE_LIMITS = {"shop.example": {"rate": 2, "concurrency": 4}}.
FLEET_SITE_RATE = 0.0
FLEET_SITE_CONCURRENCY = 32
FLEET_SITE_LIMITS: dict[str, dict[str, float]] = {}
FLEET_BURST_SECONDS = 0.1
FLEET_AUTOTHROTTLE_ENABLED = False
FLEET_AUTOTHROTTLE_TARGET_CONCURRENCY = 4.0
FLEET_AUTOTHROTTLE_MIN_RATE = 0.5
FLEET_AUTOTHROTTLE_START_RATE = 2.0

# Off by default: the telnet console and 2.19's remote-control HTTP server
# (with token files under the home folder) are not wanted on crawler nodes.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
EXTENSIONS = {
    "scrapy.extensions.remote_control.RemoteControl": None,
    "project.monitor.NodeMonitor": 500,
}

# Node heartbeats and an hour of fleet history in Redis, for `fleetcrawl status`
# and `fleetcrawl dashboard` (project/monitor.py; defaults live in MonitorConfig).
# MONITOR_ENABLED = True
# MONITOR_INTERVAL = 2.0           # seconds between two heartbeats of a node
# MONITOR_NODE_TIMEOUT = 10.0      # a node silent this long shows as dead
# MONITOR_HISTORY_SECONDS = 3600.0 # fleet history kept in <spider>:history
# MONITOR_RATE_WINDOW = 30.0       # pages/min and items/min are averaged over this

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
FEED_EXPORT_ENCODING = "utf-8"
