"""FleetAddon makes another Scrapy project a fleet node: a second project whose settings are
only ``ADDONS`` and ``REDIS_URL`` crawls through the shared frontier with two nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.settings import Settings

from project.addon import FleetAddon
from project.frontier.retry import FrontierRetryMiddleware
from tests.fleet import ROOT

if TYPE_CHECKING:
    from tests.fleet import Fleet

PROJECT = ROOT / "tests" / "addon_project"


def test_the_projects_own_settings_win_over_the_add_on() -> None:
    settings = Settings()
    settings.setdict(
        {
            "SCHEDULER": "my.Scheduler",
            "TELNETCONSOLE_ENABLED": True,
            "DOWNLOADER_MIDDLEWARES": {"project.frontier.retry.FrontierRetryMiddleware": 700},
            "DOWNLOAD_HANDLERS": {"https": "my.Handler"},
            "PLAYWRIGHT_MAX_CONTEXTS": 3,
        },
        priority="project",
    )
    FleetAddon().update_settings(settings)
    assert settings["SCHEDULER"] == "my.Scheduler"
    assert settings.getbool("TELNETCONSOLE_ENABLED") is True
    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
    assert middlewares["project.frontier.retry.FrontierRetryMiddleware"] == 700
    assert FrontierRetryMiddleware not in middlewares, "added twice"
    assert middlewares[RetryMiddleware] is None, "Scrapy's retries are replaced"
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    assert handlers["https"] == "my.Handler"
    assert handlers["http"] == "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
    assert settings.getint("PLAYWRIGHT_MAX_CONTEXTS") == 3


def test_the_add_on_wires_the_fleet_into_empty_settings() -> None:
    settings = Settings()
    FleetAddon().update_settings(settings)
    assert settings["SCHEDULER"] == "project.frontier.scheduler.FleetScheduler"
    assert settings["DUPEFILTER_CLASS"] == "project.frontier.dupefilter.FleetDupeFilter"
    assert settings["TWISTED_REACTOR"].endswith("AsyncioSelectorReactor")
    assert not settings.getbool("REMOTE_CONTROL_ENABLED")
    assert len(settings.getdict("ITEM_PIPELINES")) == 2
    assert settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")["executable_path"].endswith("chromium")


@pytest.mark.slow
def test_a_second_project_with_only_addons_and_redis_url_crawls_with_two_nodes(
    fleet: Fleet, make_shop, mongo, tmp_path
) -> None:
    shop = make_shop(products=150)
    fleet.cwd = PROJECT
    fleet.spider = "shop"
    # Where the items go is the crawl's business, given on the command line.
    fleet.settings = {
        "MONGO_URI": fleet.mongo_url,
        "MONGO_DATABASE": fleet.mongo_db,
        "MONGO_JOURNAL_DIR": str(tmp_path / "journal"),
    }
    fleet.start_node()
    fleet.start_node()
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]

    stats = shop.stats()
    assert len(stats["product_hits"]) == 150
    assert max(stats["hits"].values()) == 1, "a page was fetched twice"
    assert mongo.products.count_documents({}) == 150
    for index in (0, 1):
        node = fleet.stats(index)
        assert node["finish_reason"] == "finished"
        assert node["frontier/leased"] > 0, f"node{index} took no work from the frontier"
    assert not (PROJECT / ".state").exists(), "the second project's folder stays clean"
