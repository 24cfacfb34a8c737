"""Someone else's project: the fleet comes in through its add-on, nothing else."""

import os

BOT_NAME = "own_project"
SPIDER_MODULES = ["own_project.spiders"]
ADDONS = {"project.addon.FleetAddon": 0}
REDIS_URL = os.environ["REDIS_URL"]
