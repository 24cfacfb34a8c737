"""Scrapy settings of the fleetcrawl project: only what a project owner changes.

``FleetAddon`` wires in everything else; every setting, with its default, is
in docs/settings.md. Secrets and addresses come from the environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "scrapy.cmdline" in sys.modules:
    # Start-up time, not configuration: in a `scrapy` command (`scrapy crawl`, scrapyd's
    # runner) every node's HTTP download handler imports Scrapy's TLS context factory, which
    # builds three deprecated aliases with inspect.stack(), a cost that grows with the depth
    # of the import and the modules loaded: pulled in by the add-on's imports it took 0.3 to
    # 0.4 s of every node's start, imported here, before them, 0.1 s. The `fleetcrawl`
    # commands, which download nothing, skip it.
    import scrapy.core.downloader.contextfactory  # noqa: F401

BOT_NAME = "fleetcrawl"
SPIDER_MODULES = ["spiders"]
NEWSPIDER_MODULE = "spiders"
# Scrapy's spider templates and `scrapy genspider -t fleet NAME DOMAIN`.
TEMPLATES_DIR = str(Path(__file__).parent / "templates")

# The shared frontier, retries, robots.txt, rendering, monitoring and pipelines.
ADDONS = {"project.addon.FleetAddon": 0}

# Unset: the defaults of docs/settings.md (Redis and MongoDB on 127.0.0.1).
REDIS_URL = os.environ.get("REDIS_URL")
MONGO_URI = os.environ.get("MONGO_URI")
MONGO_DATABASE = os.environ.get("MONGO_DATABASE")
# The run webhook often carries a token in its path or credentials.
RUNS_WEBHOOK_URL = os.environ.get("RUNS_WEBHOOK_URL")
RUNS_WEBHOOK_PROXY = os.environ.get("RUNS_WEBHOOK_PROXY")

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
FEED_EXPORT_ENCODING = "utf-8"
