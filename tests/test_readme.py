"""The README's "Your own spider" section does what it says: its spider, copied as it is,
crawls the test site's book shop with two nodes, seeded as it shows, into MongoDB as it shows."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet import ROOT, scrapy_project

if TYPE_CHECKING:
    from pathlib import Path

    import pymongo.database

    from tests.fleet import Fleet

_EXAMPLE = "https://books.example"


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Your own spider")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section(), re.DOTALL)


_SETTINGS = """import os
SPIDER_MODULES = ["readme.spiders"]
ADDONS = {"project.addon.FleetAddon": 0}
REDIS_URL = os.environ["REDIS_URL"]
MONGO_URI = os.environ["MONGO_URI"]
MONGO_DATABASE = os.environ["MONGO_DATABASE"]
"""


def test_the_section_stays_short_and_shows_each_step() -> None:
    section = _section()
    assert len(section.splitlines()) <= 70
    for step in ("scrapy crawl books", "redis-cli lpush books:start_urls", "mongosh", "playwright"):
        assert step in section


@pytest.mark.crawl
def test_the_readme_spider_runs_on_two_nodes_as_written(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], tmp_path: Path
) -> None:
    shop = make_shop(products=10, books=120)
    books = shop.url("/books").rstrip("/")
    spider = _blocks("python")[0]
    assert _EXAMPLE in spider
    # someone's project with the README's spider in spiders/, as the README says
    project = scrapy_project(
        tmp_path / "someone", "readme", _SETTINGS, books=spider.replace(_EXAMPLE, books)
    )
    commands = [shlex.split(line.split("#")[0]) for line in _blocks("sh")[0].splitlines()]
    crawl, seed, _status, query = commands
    assert crawl == [".venv/bin/scrapy", "crawl", "books"]
    # The seed command as written, to a genre page of this shop (the README's is an example).
    genre = shop.catalogue()["genres"][1]["url"]
    assert seed[:3] == ["redis-cli", "lpush", "books:start_urls"]
    seed_key = fleet.keys.start_urls.replace(fleet.spider, "books")
    subprocess.run(
        ["redis-cli", "-u", fleet.redis_url, "lpush", seed_key, shop.url(genre)], check=True
    )
    fleet.cwd = project
    fleet.spider = "books"
    fleet.settings = {"MONGO_JOURNAL_DIR": str(tmp_path / "journal")}
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0], fleet.log(0)[-2000:] + fleet.log(1)[-2000:]

    stats = shop.stats()
    assert {shop.url(path) for path in stats["book_hits"]} == shop.book_urls()
    twice = {path: n for path, n in stats["hits"].items() if n > 1}
    assert not twice, (
        f"pages fetched twice: {twice}\n{fleet.log(0)[-3000:]}\n{fleet.log(1)[-3000:]}"
    )
    # mongosh fleetcrawl --eval 'db.books.find({}, {title: 1, price: 1, last_seen: 1})'
    assert query[0] == "mongosh"
    assert "db.books.find" in query[-1]
    stored = list(mongo.books.find({}, {"title": 1, "price": 1, "last_seen": 1}))
    assert len(stored) == 120
    assert all(doc["title"] and doc["price"].startswith("£") and doc["last_seen"] for doc in stored)
