"""A project of someone else's: the fleet comes in through its add-on, nothing else."""

import os

BOT_NAME = "shop_project"
SPIDER_MODULES = ["shop_project.spiders"]
ADDONS = {"project.addon.FleetAddon": 0}
REDIS_URL = os.environ["REDIS_URL"]
