"""Scrapy settings of the fleetcrawl project: only what a project owner changes.

``FleetAddon`` wires in everything else; every setting, with its default, is
in docs/settings.md. Secrets and addresses come from the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

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

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
FEED_EXPORT_ENCODING = "utf-8"
