"""`scrapy genspider -t fleet NAME DOMAIN` writes a spider that runs on the fleet as it is."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import ROOT, scrapy_project

if TYPE_CHECKING:
    from pathlib import Path

    import pymongo.database

    from tests.fleet import Fleet

_SETTINGS = f"""import os

BOT_NAME = "newcomer"
SPIDER_MODULES = ["newcomer.spiders"]
NEWSPIDER_MODULE = "newcomer.spiders"
TEMPLATES_DIR = {str(ROOT / "project" / "templates")!r}
ADDONS = {{"project.addon.FleetAddon": 0}}
REDIS_URL = os.environ["REDIS_URL"]
MONGO_URI = os.environ["MONGO_URI"]
MONGO_DATABASE = os.environ["MONGO_DATABASE"]
"""


def test_the_fleet_template_is_listed_beside_scrapys_own() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "scrapy", "genspider", "-l"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert {"basic", "crawl", "csvfeed", "xmlfeed", "fleet"} <= set(listed)


@pytest.mark.crawl
def test_a_spider_made_by_genspider_crawls_with_two_nodes_as_it_is(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Path
) -> None:
    shop = make_shop(products=40)
    project = scrapy_project(tmp_path / "newcomer", "newcomer", _SETTINGS)
    made = subprocess.run(
        [sys.executable, "-m", "scrapy", "genspider", "-t", "fleet", "shopcrawl", shop.url("/")],
        cwd=project, env=fleet.env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "Created spider 'shopcrawl' using template 'fleet'" in made.stdout
    fleet.cwd = project
    fleet.spider = "shopcrawl"
    fleet.settings = {"MONGO_JOURNAL_DIR": str(tmp_path / "journal")}
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0], fleet.log(0)[-2000:] + fleet.log(1)[-2000:]

    stats = shop.stats()
    assert len(stats["product_hits"]) == 40, "every product page reached"
    assert max(stats["hits"].values()) == 1, "a page was fetched twice"
    pages = sum(stats["hits"].values()) - 1  # robots.txt is no page
    assert mongo.shopcrawl.count_documents({}) == pages


def test_startproject_still_works_from_inside_the_project(tmp_path: Path) -> None:
    """TEMPLATES_DIR replaces Scrapy's templates folder: it holds its project template too."""
    subprocess.run(
        [sys.executable, "-m", "scrapy", "startproject", "elsewhere", str(tmp_path / "p")],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert (tmp_path / "p" / "elsewhere" / "settings.py").is_file()
