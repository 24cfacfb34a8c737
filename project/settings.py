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
}

MONGO_URI = os.environ.get("MONGO_URI", "mongodb://127.0.0.1:27017")
MONGO_DATABASE = os.environ.get("MONGO_DATABASE", "fleetcrawl")
ITEM_PIPELINES = {
    "pipelines.validation.ValidationPipeline": 100,
    "pipelines.mongo.MongoPipeline": 300,
}

CONCURRENT_REQUESTS = 16
ROBOTSTXT_OBEY = False

# Off by default: the telnet console and 2.19's remote-control HTTP server
# (with token files under the home folder) are not wanted on crawler nodes.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
EXTENSIONS = {"scrapy.extensions.remote_control.RemoteControl": None}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
FEED_EXPORT_ENCODING = "utf-8"
