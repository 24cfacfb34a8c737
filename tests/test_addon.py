"""FleetAddon makes another Scrapy project a fleet node: a second project whose settings are
only ``ADDONS`` and ``REDIS_URL`` crawls through the shared frontier with two nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.settings import Settings

from project.addon import FleetAddon
from project.config import FleetConfigError
from project.frontier.retry import FrontierRetryMiddleware
from project.frontier.scheduler import FleetScheduler
from tests.fleet import ROOT

if TYPE_CHECKING:
    from tests.fleet import Fleet

PROJECT = ROOT / "tests" / "addon_project"


class MyScheduler(FleetScheduler):
    """A project's own scheduler: the fleet's, extended."""


def test_the_projects_own_settings_win_over_the_add_on() -> None:
    settings = Settings()
    settings.setdict(
        {
            "SCHEDULER": "tests.test_addon.MyScheduler",
            "TELNETCONSOLE_ENABLED": True,
            "DOWNLOADER_MIDDLEWARES": {"project.frontier.retry.FrontierRetryMiddleware": 700},
            "DOWNLOAD_HANDLERS": {"https": "my.Handler"},
            "PLAYWRIGHT_MAX_CONTEXTS": 3,
        },
        priority="project",
    )
    FleetAddon().update_settings(settings)
    assert settings["SCHEDULER"] == "tests.test_addon.MyScheduler"
    assert settings.getbool("TELNETCONSOLE_ENABLED") is True
    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
    assert middlewares["project.frontier.retry.FrontierRetryMiddleware"] == 700
    assert FrontierRetryMiddleware not in middlewares, "added twice"
    assert middlewares[RetryMiddleware] is None, "Scrapy's retries are replaced"
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    assert handlers["https"] == "my.Handler"
    assert handlers["http"] == "project.rendering.download.FleetDownloadHandler"
    assert settings.getint("PLAYWRIGHT_MAX_CONTEXTS") == 3


def test_a_scheduler_that_is_not_the_fleets_is_refused_at_start() -> None:
    """A settings.py kept from stock scrapy-redis would silently crawl without the fleet."""
    settings = Settings()
    settings.set("SCHEDULER", "scrapy_redis.scheduler.Scheduler", priority="project")
    with pytest.raises(FleetConfigError, match=r"FleetScheduler\); remove SCHEDULER"):
        FleetAddon().update_settings(settings)


def test_the_add_on_wires_the_fleet_into_empty_settings() -> None:
    settings = Settings()
    FleetAddon().update_settings(settings)
    assert settings["SCHEDULER"] == "project.frontier.scheduler.FleetScheduler"
    assert settings["DUPEFILTER_CLASS"] == "project.frontier.dupefilter.FleetDupeFilter"
    assert settings["TWISTED_REACTOR"].endswith("AsyncioSelectorReactor")
    assert not settings.getbool("REMOTE_CONTROL_ENABLED")
    assert len(settings.getdict("ITEM_PIPELINES")) == 2
    assert settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")["executable_path"].endswith(
        ("chromium", "chromium-headless-shell")
    )


@pytest.mark.crawl
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


def test_nodes_fetch_only_the_web_and_at_most_16_mib_a_page() -> None:
    """No file://, ftp://, s3:// or data: handler, and responses bounded at 16 MiB."""
    settings = Settings()
    FleetAddon().update_settings(settings)
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    assert {scheme for scheme, handler in handlers.items() if handler} == {"http", "https"}
    assert all(handlers[scheme] is None for scheme in ("file", "s3", "ftp", "data"))
    assert settings.getint("DOWNLOAD_MAXSIZE") == 16 * 1024 * 1024
    assert settings.getint("DOWNLOAD_WARNSIZE") == 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("FRONTIER_BATCH_MAX", "0", "FRONTIER_BATCH_MAX must be between 1 and 2000"),
        ("FRONTIER_LEASE_SECONDS", "soon", "FRONTIER_LEASE_SECONDS must be a float"),
        ("SCHEDULER_QUEUE_KEY", "%(spidr)s:q", "SCHEDULER_QUEUE_KEY"),
        ("FRONTIER_SITE_KEY", "path", "FRONTIER_SITE_KEY"),
        ("MONGO_URI", "http://db", "MONGO_URI"),
        ("PLAYWRIGHT_CHROMIUM_PATH", "/nope", "apt-get install chromium"),
    ],
)
def test_a_bad_setting_stops_a_node_with_one_line_and_exit_status_1(
    setting: str, value: str, says: str
) -> None:
    """A malformed setting, in a real `scrapy crawl`: one line, exit 1, no traceback."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "products", "-s", f"{setting}={value}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "CRITICAL" in x or "ERROR" in x]
    assert says in line


def test_a_bad_setting_raises_in_process_too() -> None:
    from project.config import FleetConfigError

    settings = Settings({"FRONTIER_BATCH_MAX": 0})
    with pytest.raises(FleetConfigError, match="FRONTIER_BATCH_MAX"):
        FleetAddon().update_settings(settings)
