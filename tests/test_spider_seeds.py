"""Seeds from Redis for any spider (project/frontier/spiders.py): the fleet's strict format,
scrapy-redis' format with form data, a spider's own make_request_from_data, and garbage."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import FormRequest, Request, Spider
from scrapy.spiders import CrawlSpider
from scrapy.utils.test import get_crawler
from scrapy_redis.spiders import RedisCrawlSpider, RedisSpider

from project.frontier.seeds import InvalidSeed
from project.frontier.spiders import FleetSpider, has_own_seeds, requests_from_seed, seed_key
from project.frontier.wire import decode_request, encode_request

if TYPE_CHECKING:
    from pathlib import Path


class Books(RedisSpider):
    name = "books"
    redis_key = "books:start_urls"

    def parse(self, response: Any) -> Any:
        return None


class Crawl(RedisCrawlSpider):
    name = "crawl"


class OwnSeeds(RedisSpider):
    """A spider that reads seeds its own way: 'isbn:<n>' becomes a book page."""

    name = "own"

    def make_request_from_data(self, data: bytes) -> Any:
        text = data.decode()
        if text == "none":
            return None
        if text == "boom":
            raise KeyError("no such book")
        if text == "strings":
            return ["http://books.example/1"]
        return [Request(f"http://books.example/isbn/{n}") for n in text.split(":")[1].split(",")]


class Plain(Spider):
    name = "plain"


class Fleet(FleetSpider):
    name = "fleet"


def _spider(cls: type[Spider], **settings: Any) -> Any:
    # RedisSpider builds its client at once; it is never used, so it never connects.
    crawler = get_crawler(cls, {"REDIS_URL": "redis://127.0.0.1:9/0", **settings})
    return cls.from_crawler(crawler)


def test_a_scrapy_redis_json_seed_with_form_fields_is_a_form_request() -> None:
    spider = _spider(Books)
    seed = {"url": "http://books.example/search", "method": "post", "q": "poetry", "page": "2"}
    (request,) = requests_from_seed(spider, json.dumps(seed).encode())
    assert isinstance(request, FormRequest)
    assert (request.method, request.body) == ("POST", b"q=poetry&page=2")
    assert request.dont_filter
    # and it travels through the frontier as itself
    again, _ = decode_request(encode_request(request, spider), spider)
    assert (type(again), again.body) == (FormRequest, b"q=poetry&page=2")


def test_a_plain_url_seed_and_a_json_seed_with_meta_and_priority() -> None:
    spider = _spider(Crawl)
    (plain,) = requests_from_seed(spider, b"http://books.example/")
    assert (type(plain), plain.url, plain.method) == (Request, "http://books.example/", "GET")
    seed = {"url": "http://books.example/new", "meta": {"job": "7"}, "priority": 50}
    (rich,) = requests_from_seed(spider, json.dumps(seed).encode())
    assert (rich.meta["job"], rich.priority) == ("7", 50)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"url": "http://books.example/", "q": {"nested": 1}}', "field"),
        (b'{"url": "ftp://books.example/"}', "url"),
        (b"\xff\xfe", "encoding"),
        (b"", "empty"),
        (b'{"meta": {}}', "url_type"),
    ],
)
def test_a_garbage_seed_of_a_stock_spider_is_refused_with_a_reason(raw: bytes, code: str) -> None:
    with pytest.raises(InvalidSeed) as info:
        requests_from_seed(_spider(Books), raw)
    assert info.value.code == code


def test_a_spiders_own_make_request_from_data_is_used_and_costs_only_its_seed() -> None:
    spider = _spider(OwnSeeds)
    made = requests_from_seed(spider, b"isbn:1,2")
    assert [r.url for r in made] == ["http://books.example/isbn/1", "http://books.example/isbn/2"]
    for raw, code in ((b"none", "no_request"), (b"boom", "spider"), (b"strings", "no_request")):
        with pytest.raises(InvalidSeed) as info:
            requests_from_seed(spider, raw)
        assert info.value.code == code
        assert "OwnSeeds.make_request_from_data" in str(info.value)
    with pytest.raises(InvalidSeed, match="exceeds"):
        requests_from_seed(spider, b"isbn:" + b"1," * 40_000)


def test_the_fleets_own_spider_keeps_its_strict_format() -> None:
    spider = _spider(Fleet)
    with pytest.raises(InvalidSeed, match="unknown field"):
        requests_from_seed(spider, b'{"url": "http://books.example/", "q": "x"}')


def test_where_seeds_come_from() -> None:
    assert seed_key(_spider(Books), "t:books:start_urls") == "books:start_urls"
    assert seed_key(_spider(Crawl), "t:crawl:start_urls") == "crawl:start_urls"
    assert seed_key(Plain(), "t:plain:start_urls") == "t:plain:start_urls"
    assert has_own_seeds(_spider(Books))
    assert has_own_seeds(_spider(Fleet))
    assert not has_own_seeds(Plain())
    assert not has_own_seeds(CrawlSpider(name="c"))
    # a plain spider takes pushed seeds too, as URLs or JSON
    (request,) = requests_from_seed(_spider(Plain), b"http://books.example/")
    assert request.url == "http://books.example/"


def test_readers_count_the_seeds_of_a_spiders_own_redis_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fleetcrawl status books` looks where the books spider's nodes take seeds from."""
    from scrapy.settings import Settings

    from project.frontier.keys import FrontierKeys
    from tests.fleet import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "own_project"))
    settings = Settings(
        {"SPIDER_MODULES": ["own_project.spiders"], "REDIS_START_URLS_KEY": "t:%(name)s:start_urls"}
    )
    assert FrontierKeys.for_project_spider(settings, "books").start_urls == "books:start_urls"
    plain = FrontierKeys.for_project_spider(settings, "books_plain")
    assert plain.start_urls == "t:books_plain:start_urls"
    assert FrontierKeys.for_project_spider(settings, "nope").start_urls == "t:nope:start_urls"


_LEAF = """
import os
from scrapy_redis.spiders import RedisSpider
from .base import Based

class Computed(RedisSpider):
    name = "computed"
    redis_key = os.environ.get("NO_SUCH_VARIABLE", "from:%(name)s")

class Inherits(Based):
    name = "inherits"

class Own(RedisSpider):
    name = "own"
    redis_key = "own:seeds"

class NoKey(RedisSpider):
    name: str = "nokey"
"""
_BASE = """
import scrapy

class Based(scrapy.Spider):
    redis_key = "based:seeds"
"""


def test_a_spiders_redis_key_is_read_from_its_source_and_from_scrapy_when_unsure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetcrawl status` reads a spider's redis_key from the project's source (Scrapy's loader
    imports every spider module: 0.25 s of the command); what the source does not tell for sure
    it asks the loader, so both give the key the nodes use."""
    import sys

    from scrapy.settings import Settings

    from project.frontier.keys import FrontierKeys
    from project.frontier.spider_source import UNSURE, redis_key_in_source

    package = tmp_path / "static_project" / "spiders"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "leaf.py").write_text(_LEAF)
    (package / "base.py").write_text(_BASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = ["static_project.spiders"]
    assert redis_key_in_source(modules, "own") == "own:seeds"
    assert redis_key_in_source(modules, "inherits") == "based:seeds"  # a base in another module
    assert redis_key_in_source(modules, "nokey") is None
    assert redis_key_in_source(modules, "computed") == UNSURE
    assert redis_key_in_source(modules, "missing") == UNSURE
    assert redis_key_in_source(["no_such_package.spiders"], "own") == UNSURE
    settings = Settings({"SPIDER_MODULES": modules})
    assert FrontierKeys.for_project_spider(settings, "own").start_urls == "own:seeds"
    assert not any(m.startswith("static_project.spiders.") for m in sys.modules)  # not imported
    assert FrontierKeys.for_project_spider(settings, "inherits").start_urls == "based:seeds"
    assert FrontierKeys.for_project_spider(settings, "nokey").start_urls == "nokey:start_urls"
    # unsure: Scrapy's loader imports the spiders, and the class says
    assert FrontierKeys.for_project_spider(settings, "computed").start_urls == "from:computed"
    assert "static_project.spiders.leaf" in sys.modules
    # two classes of one name: Scrapy's loader decides, as the nodes' does
    (package / "twin.py").write_text(_LEAF.replace('"own:seeds"', '"twin:seeds"'))
    assert redis_key_in_source(modules, "own") == UNSURE


_HEAD = "import scrapy\nfrom scrapy_redis.spiders import RedisSpider\n"
#: Spiders whose class attributes are not what a plain reading of the source says: each is
#: left to Scrapy's loader (a review found the fast path answering wrongly for each).
_TRICKY = {
    "subclassed": 'class A(RedisSpider):\n name = "t"\n redis_key = "a"\n'
    'class B(A):\n redis_key = "b"\n',
    "diamond": 'class B(RedisSpider):\n redis_key = "b"\nclass C(RedisSpider):\n redis_key = "c"\n'
    'class D(B, C):\n name = "t"\n',
    "hooked": 'class H(RedisSpider):\n def __init_subclass__(cls):\n  cls.redis_key = "h"\n'
    'class S(H):\n name = "t"\n',
    "decorated": 'def keyed(c):\n c.redis_key = "d"\n return c\n'
    '@keyed\nclass S(RedisSpider):\n name = "t"\n',
    "branching": 'class S(RedisSpider):\n name = "t"\n if True:\n  redis_key = "b"\n',
    "augmented": 'class S(RedisSpider):\n name = "t"\n redis_key = "a"\n redis_key += ":b"\n',
    "patched": 'class S(RedisSpider):\n name = "t"\nS.redis_key = "post"\n',
    "looped": 'class S(RedisSpider):\n name = "t"\n for redis_key in ("x", "y"):\n  pass\n',
    "by_setattr": 'class S(RedisSpider):\n name = "t"\nsetattr(S, "redis_key", "s")\n',
    "metaclass": 'class M(type):\n pass\nclass S(scrapy.Spider, metaclass=M):\n name = "t"\n',
}


@pytest.mark.parametrize("case", sorted(_TRICKY))
def test_a_spider_the_source_does_not_tell_plainly_is_left_to_scrapys_loader(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.frontier.spider_source import UNSURE, redis_key_in_source

    package = tmp_path / f"tricky_{case}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "spider.py").write_text(_HEAD + _TRICKY[case])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert redis_key_in_source([package.name], "t") == UNSURE


def test_every_spider_of_the_project_and_of_the_own_project_reads_as_scrapy_loads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path answers for the spiders here, and answers what Scrapy's loader gives."""
    from scrapy.settings import Settings
    from scrapy.spiderloader import SpiderLoader

    from project.frontier.spider_source import UNSURE, redis_key_in_source
    from tests.fleet import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "own_project"))
    for modules in (["spiders"], ["own_project.spiders"]):
        loader = SpiderLoader.from_settings(Settings({"SPIDER_MODULES": modules}))
        for name in loader.list():
            read = redis_key_in_source(modules, name)
            assert read != UNSURE, name
            assert read == getattr(loader.load(name), "redis_key", None), name
