"""JavaScript rendering: which requests Chromium renders, on the wire, and across nodes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from scrapy_playwright.page import PageMethod

from project import settings as project_settings
from project.addon import FleetAddon
from project.frontier.wire import UnserializableRequestError, decode_request, encode_request
from project.rendering.browser import abort_heavy_request, abort_types
from project.rendering.config import RenderingConfig, RenderingConfigError, parse_render_rules
from project.rendering.launch import use_system_chromium
from project.rendering.middleware import FALLBACK_META_KEY, RenderingMiddleware
from spiders.products import ProductsSpider
from tests.fleet import wait_for

if TYPE_CHECKING:
    import redis

    from tests.fleet import Fleet

_AVAILABILITY = {"in stock": "in_stock", "out of stock": "out_of_stock"}


@pytest.fixture
def spider() -> ProductsSpider:
    return ProductsSpider()


def _project_settings(**overrides) -> Settings:
    """The project's settings as a node sees them: settings.py, -s options, then the add-on."""
    settings = Settings()
    settings.setmodule(project_settings, priority="project")
    settings.update(overrides, priority="cmdline")
    for addon in settings.getdict("ADDONS"):
        assert addon == "project.addon.FleetAddon"
        FleetAddon().update_settings(settings)
    return settings


def _middleware(settings: dict, spidercls=ProductsSpider) -> RenderingMiddleware:
    crawler = get_crawler(spidercls, {"PLAYWRIGHT_MAX_CONTEXTS": 1, **settings})
    return build_from_crawler(RenderingMiddleware, crawler)


def _fake_chromium(tmp_path: Path) -> str:
    binary = tmp_path / "chromium"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return str(binary)


# -- settings --------------------------------------------------------------


def test_project_settings_render_with_one_bounded_browser(monkeypatch) -> None:
    monkeypatch.delenv("FLEETCRAWL_CHROMIUM", raising=False)
    config = RenderingConfig.from_settings(_project_settings())
    # Debian's old headless shell when it is installed (deploy/setup.sh installs it)
    assert config.chromium_path == "/usr/bin/chromium-headless-shell"
    assert (config.max_contexts, config.max_pages_per_context) == (1, 6)
    assert config.rules == ()
    assert not config.remote
    handlers = _project_settings().getdict("DOWNLOAD_HANDLERS")
    assert {handlers["http"], handlers["https"]} == {
        "project.rendering.download.FleetDownloadHandler"
    }


def test_a_browser_with_a_window_renders_with_the_full_chromium(monkeypatch) -> None:
    monkeypatch.delenv("FLEETCRAWL_CHROMIUM", raising=False)
    options = {**_project_settings().getdict("PLAYWRIGHT_LAUNCH_OPTIONS"), "headless": False}
    del options["executable_path"]  # the add-on's choice for a headless browser
    settings = _project_settings(PLAYWRIGHT_LAUNCH_OPTIONS=options)
    assert RenderingConfig.from_settings(settings).chromium_path == "/usr/bin/chromium"


def test_chromium_path_setting_beats_environment(monkeypatch, tmp_path) -> None:
    (tmp_path / "env").mkdir()
    (tmp_path / "setting").mkdir()
    from_env, from_setting = _fake_chromium(tmp_path / "env"), _fake_chromium(tmp_path / "setting")
    monkeypatch.setenv("FLEETCRAWL_CHROMIUM", from_env)
    assert RenderingConfig.from_settings(_project_settings()).chromium_path == from_env
    settings = _project_settings(PLAYWRIGHT_CHROMIUM_PATH=from_setting)
    assert RenderingConfig.from_settings(settings).chromium_path == from_setting


def test_addon_points_playwright_at_the_configured_chromium(tmp_path) -> None:
    binary = _fake_chromium(tmp_path)
    settings = _project_settings(PLAYWRIGHT_CHROMIUM_PATH=binary)
    use_system_chromium(settings)
    options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    assert options["executable_path"] == binary
    assert options["headless"] is True


def test_missing_chromium_stops_the_crawler_with_install_hint(tmp_path) -> None:
    missing = str(tmp_path / "no-chromium")
    # The add-on turns the RenderingConfigError into a clean exit (SystemExit) where it can.
    with pytest.raises((RenderingConfigError, SystemExit), match=r"apt-get install chromium"):
        get_crawler(
            ProductsSpider,
            {"ADDONS": {FleetAddon: 0}, "PLAYWRIGHT_CHROMIUM_PATH": missing},
        )


def test_remote_browser_needs_no_local_chromium(tmp_path) -> None:
    settings = _project_settings(
        PLAYWRIGHT_CHROMIUM_PATH=str(tmp_path / "none"), PLAYWRIGHT_CDP_URL="http://b:9222"
    )
    use_system_chromium(settings)
    assert "executable_path" not in settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")


@pytest.mark.parametrize(
    ("name", "value"), [("PLAYWRIGHT_MAX_CONTEXTS", 0), ("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT", 0)]
)
def test_unbounded_browser_is_refused(name, value) -> None:
    with pytest.raises(RenderingConfigError, match="at least 1"):
        RenderingConfig.from_settings(Settings({name: value}))


@pytest.mark.parametrize(
    ("value", "patterns", "methods"),
    [
        (None, [], []),
        ("", [], []),
        (r"/product/\d+$", [r"/product/\d+$"], [[]]),
        ('["/a", "/b,c{1,2}"]', ["/a", "/b,c{1,2}"], [[], []]),
        (["/a"], ["/a"], [[]]),
        (
            '{"/p/": [{"method": "wait_for_selector", "args": [".product"]}]}',
            ["/p/"],
            [[("wait_for_selector", (".product",), {})]],
        ),
        (
            {"/p/": [PageMethod("wait_for_timeout", 50)]},
            ["/p/"],
            [[("wait_for_timeout", (50,), {})]],
        ),
    ],
)
def test_render_rules_are_parsed(value, patterns, methods) -> None:
    rules = parse_render_rules(value)
    assert [r.pattern.pattern for r in rules] == patterns
    assert [[(m.method, m.args, m.kwargs) for m in r.page_methods] for r in rules] == methods


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["/product/("], "bad rule"),
        ("[not json", "not valid JSON"),
        ({"/p/": [{"method": "route_from_har", "args": ["/etc/x"]}]}, "not allowed"),
        ({"/p/": [PageMethod("screenshot", path="/tmp/x.png")]}, "must not write files"),
    ],
)
def test_bad_render_rules_are_refused(value, message) -> None:
    with pytest.raises(RenderingConfigError, match=message):
        parse_render_rules(value)


# -- the middleware --------------------------------------------------------


def test_rule_renders_matching_requests_only() -> None:
    rule = {r"/product/\d+$": [{"method": "wait_for_selector", "args": [".product"]}]}
    mw = _middleware({"PLAYWRIGHT_RENDER_URLS": json.dumps(rule)})
    matching = Request("http://shop.test/product/7")
    other = Request("http://shop.test/category/a?page=1")
    opted_out = Request("http://shop.test/product/8", meta={"playwright": False})
    for request in (matching, other, opted_out):
        assert mw.process_request(request) is None
    assert matching.meta["playwright"] is True
    assert [m.method for m in matching.meta["playwright_page_methods"]] == ["wait_for_selector"]
    assert matching.meta["playwright_context"] == "fleet-0"
    assert "playwright" not in other.meta
    assert opted_out.meta == {"playwright": False}
    assert mw.stats.get_value("playwright/rule") == 1

    again = Request("http://shop.test/product/9")
    mw.process_request(again)
    # Each request gets its own PageMethod objects (the handler stores results on them).
    assert (
        again.meta["playwright_page_methods"][0] is not matching.meta["playwright_page_methods"][0]
    )


def test_spider_render_urls_replace_the_setting() -> None:
    class JsSpider(ProductsSpider):
        render_urls = [r"/js/"]

    mw = _middleware({"PLAYWRIGHT_RENDER_URLS": [r"/product/"]}, JsSpider)
    product, js = Request("http://shop.test/product/1"), Request("http://shop.test/js/1")
    mw.process_request(product)
    mw.process_request(js)
    assert "playwright" not in product.meta
    assert js.meta["playwright"] is True


def test_spider_argument_sets_render_urls() -> None:
    # scrapy crawl products -a render_urls=/js/
    crawler = get_crawler(ProductsSpider, {})
    crawler.spider = ProductsSpider(render_urls="/js/")
    mw = build_from_crawler(RenderingMiddleware, crawler)
    assert [r.pattern.pattern for r in mw.rules] == ["/js/"]


def test_renders_are_spread_over_the_allowed_contexts() -> None:
    mw = _middleware({"PLAYWRIGHT_MAX_CONTEXTS": 3, "PLAYWRIGHT_CONTEXTS": {"login": {}}})
    requests = [Request(f"http://shop.test/{i}", meta={"playwright": True}) for i in range(4)]
    requests.append(
        Request("http://shop.test/x", meta={"playwright": True, "playwright_context": "fleet-7"})
    )
    requests.append(
        Request("http://shop.test/y", meta={"playwright": True, "playwright_context": "login"})
    )
    for request in requests:
        mw.process_request(request)
    contexts = [r.meta["playwright_context"] for r in requests]
    # fleet-7 came from a node with more contexts: renamed; "login" of PLAYWRIGHT_CONTEXTS is kept.
    assert contexts == ["fleet-0", "fleet-1", "fleet-0", "fleet-1", "fleet-0", "login"]


@pytest.mark.parametrize(
    ("resource_type", "aborted"),
    [("image", True), ("font", True), ("media", True), ("document", False), ("script", False)],
)
def test_the_resource_types_of_a_pages_render_are_aborted(resource_type, aborted) -> None:
    class Page:  # what the handler registers for each render (a weak reference)
        pass

    page = Page()
    abort_types[page] = RenderingConfig().abort_resources
    request = SimpleNamespace(resource_type=resource_type, frame=SimpleNamespace(page=page))
    assert abort_heavy_request(request) is aborted
    # a request without a frame (a service worker's) is let through
    assert abort_heavy_request(SimpleNamespace(resource_type=resource_type)) is False


# -- PageMethod on the wire ------------------------------------------------


def test_page_methods_round_trip_through_the_wire(spider) -> None:
    methods = [
        PageMethod("wait_for_selector", ".product", timeout=500),
        PageMethod("click", "a.more"),
        PageMethod("wait_for_timeout", 100),
    ]
    methods[0].result = object()  # a result of a previous render is never sent
    request = Request(
        "http://shop.test/product/1",
        callback=spider.parse_product,
        meta={"playwright": True, "playwright_page_methods": methods, FALLBACK_META_KEY: True},
    )
    payload = encode_request(request, spider)
    doc = json.loads(payload)
    assert doc["meta"]["playwright_page_methods"][0] == {
        "__page_method__": {
            "method": "wait_for_selector",
            "args": [".product"],
            "kwargs": {"timeout": 500},
        }
    }
    copy, _ = decode_request(payload, spider)
    decoded = copy.meta["playwright_page_methods"]
    assert all(isinstance(m, PageMethod) for m in decoded)
    assert [(m.method, m.args, m.kwargs, m.result) for m in decoded] == [
        (m.method, m.args, m.kwargs, None) for m in methods
    ]
    assert copy.meta["playwright"] is True
    assert copy.meta[FALLBACK_META_KEY] is True
    assert copy.callback == spider.parse_product


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (PageMethod(lambda page: page.title()), "name a Page method"),
        (PageMethod("screenshot", path="/root/.bashrc"), "must not write files"),
        (PageMethod("set_input_files", "input", "/etc/shadow"), "not allowed on the wire"),
    ],
)
def test_unsafe_page_methods_are_refused_at_enqueue(spider, method, message) -> None:
    request = Request("http://shop.test/", meta={"playwright_page_methods": [method]})
    with pytest.raises(UnserializableRequestError, match=message):
        encode_request(request, spider)


def test_unsafe_page_method_written_to_redis_is_not_decoded(spider) -> None:
    payload = json.dumps(
        {
            "url": "http://shop.test/",
            "meta": {
                "playwright_page_methods": [
                    {"__page_method__": {"method": "pdf", "kwargs": {"path": "/x"}}}
                ]
            },
        }
    )
    # The scheduler dead-letters entries that raise this (frontier/undecodable).
    with pytest.raises(UnserializableRequestError, match="not allowed"):
        decode_request(payload, spider)


# -- real nodes ------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat_line.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pids) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists() and _command(pid)]


def _stored(mongo) -> dict[int, dict]:
    return {int(doc["_id"].rsplit("/", 1)[1]): doc for doc in mongo.products.find({})}


def _assert_matches_catalogue(doc: dict, product: dict, shop) -> None:
    assert doc["name"] == product["name"]
    assert doc["price"] == product["price"]
    assert doc["currency"] == product["currency"]
    assert doc["sku"] == product["sku"]
    assert doc["availability"] == _AVAILABILITY[product["availability"]]
    assert doc["description"] == product["description"]
    assert doc["breadcrumb"] == product["breadcrumb"]
    assert doc["image_urls"] == [shop.url(src) for src in product["images"]]
    assert doc["canonical_url"] == shop.url(product["url"])


def _sum_stat(fleet: Fleet, key: str, nodes) -> int:
    return sum(fleet.stat(i, key) for i in nodes)


def _start(fleet: Fleet, **settings):
    """A node whose journal is in the test's directory: a killed node leaves nothing behind."""
    journal = fleet.log_dir / f"journal{len(fleet.procs)}"
    return fleet.start_node(MONGO_JOURNAL_DIR=str(journal), **settings)


@pytest.mark.crawl
def test_two_nodes_store_javascript_products(fleet: Fleet, make_shop, mongo) -> None:
    shop = make_shop(products=150, js_share=0.2)
    catalogue = {p["id"]: p for p in shop.catalogue()["products"]}
    js_ids = set(shop.stats()["expected"]["js"])
    assert len(js_ids) == 30
    _start(fleet)
    _start(fleet)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0]

    stored = _stored(mongo)
    assert set(stored) == set(catalogue)
    for pid in js_ids:
        _assert_matches_catalogue(stored[pid], catalogue[pid], shop)
    assert {pid for pid, doc in stored.items() if doc["rendered"]} == js_ids
    hits = shop.stats()["hits"]
    assert not [path for path in hits if path.startswith("/img/")], "images were not aborted"
    for index in (0, 1):
        stats = fleet.stats(index)
        assert stats["finish_reason"] == "finished"
        # Every page Chromium opened was closed again or is idle (closed with its context),
        # within the bounds.
        opened = stats.get("playwright/page_count", 0)
        assert opened == stats.get("playwright/page_count/closed", 0) + stats.get(
            "playwright/page_count/idle", 0
        )
        assert stats.get("playwright/page_count/max_concurrent", 0) <= 6  # the default
        assert stats.get("playwright/browser_count", 0) <= 1
    assert _sum_stat(fleet, "playwright/renders", (0, 1)) == len(js_ids)
    # pages were reused: at most the 6 (the default) of each node's context were opened
    assert _sum_stat(fleet, "playwright/page_count", (0, 1)) <= 12
    # images are off in Chromium's renderer: none was even asked for (no /img/ hit above)
    assert _sum_stat(fleet, "playwright/request_count/resource_type/image", (0, 1)) == 0


@pytest.mark.crawl
def test_fallback_renders_exactly_the_pages_without_product_markup(
    fleet: Fleet, make_shop, mongo
) -> None:
    shop = make_shop(products=60, js_share=0.2, malformed_share=0.1)
    expected = shop.stats()["expected"]
    js_ids = set(expected["js"])
    _start(fleet)
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0]

    assert fleet.stat(0, "playwright/fallback") == len(js_ids) == 12
    assert fleet.stat(0, "products/no_product_markup") == 0
    product_hits = {int(k): v for k, v in shop.stats()["product_hits"].items()}
    assert len(product_hits) == 60
    assert {pid for pid, n in product_hits.items() if n == 2} == js_ids, "plain page rendered"
    assert set(product_hits.values()) == {1, 2}
    stored = _stored(mongo)
    assert {pid for pid, doc in stored.items() if doc["rendered"]} == js_ids
    # Malformed pages have product markup: validated, never rendered.
    assert not set(expected["malformed"]) & {pid for pid, d in stored.items() if d["rendered"]}


@pytest.mark.crawl
def test_node_that_never_renders_starts_no_browser(fleet: Fleet, make_shop, mongo) -> None:
    """Nor imports Playwright (project/rendering/download.py): the node runs as a fresh
    interpreter (not forked from the suite's warm server) that logs every import."""
    shop = make_shop(products=40, latency_ms=20)
    journal = fleet.log_dir / "journal0"
    node = fleet.start_node("env", "PYTHONPROFILEIMPORTTIME=1", MONGO_JOURNAL_DIR=str(journal))
    fleet.seed(shop.url("/"))
    children: set[int] = set()
    while node.poll() is None:
        children.update(_descendants(node.pid))
        time.sleep(0.05)
    assert node.returncode == 0
    assert mongo.products.count_documents({}) == 40
    assert children == set(), "Playwright or Chromium started without a render"
    assert fleet.stat(0, "playwright/browser_count") == 0
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in fleet.log(0).splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    # the log holds the imports of import statements (not importlib's: load_object), and
    # scrapy-playwright's handler imports Playwright with one (93 lines when it is loaded)
    assert "project.rendering.middleware" in imported
    assert [m for m in imported if m.split(".")[0] == "playwright"] == []


@pytest.mark.crawl
def test_failed_renders_close_their_pages(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=5)
    never = {
        "__page_method__": {
            "method": "wait_for_selector",
            "args": [".never"],
            "kwargs": {"timeout": 300},
        }
    }
    seeds = [
        json.dumps(
            {
                "url": shop.url(f"/?fail={i}"),
                "meta": {"playwright": True, "playwright_page_methods": [never]},
            }
        )
        for i in range(6)
    ]
    seeds.append(json.dumps({"url": shop.url("/missing"), "meta": {"playwright": True}}))
    fleet.seed(*seeds)
    # One attempt each: a failed render is a dead letter at once instead of a retry.
    _start(fleet, CONCURRENT_REQUESTS=8, RETRY_TIMES=0)
    assert fleet.wait(90) == [0]

    log = fleet.log(0)
    assert fleet.stat(0, "playwright/renders") == 7
    # the 404's page is idle at the end, or closed for a failed render's new page
    assert fleet.stat(0, "playwright/page_count") == fleet.stat(
        0, "playwright/page_count/closed"
    ) + (fleet.stat(0, "playwright/page_count/idle") or 0)
    assert fleet.stat(0, "playwright/page_count/max_concurrent") <= 6  # the default
    assert log.count("Closing page due to failed request") == 6


@pytest.mark.crawl
def test_missing_chromium_node_exits_with_install_hint(fleet: Fleet, tmp_path) -> None:
    node = _start(fleet, PLAYWRIGHT_CHROMIUM_PATH=str(tmp_path / "chromium"))
    assert fleet.wait(60) == [1]
    assert "apt-get install chromium" in fleet.log(0)
    assert node.returncode == 1


@pytest.mark.crawl
@pytest.mark.slow("a 7 s render outlives a 4 s lease, then its node is killed and it renders again")
def test_render_survives_lease_expiry_and_node_kill(
    fleet: Fleet, make_shop, mongo, redis_client: redis.Redis
) -> None:
    shop = make_shop(products=30, js_share=0.2)
    victim = shop.stats()["expected"]["js"][0]
    catalogue = {p["id"]: p for p in shop.catalogue()["products"]}
    render_ms, lease = 7000, 4.0
    rule = {f"/product/{victim}$": [{"method": "wait_for_timeout", "args": [render_ms]}]}
    fleet.settings.update(
        FRONTIER_LEASE_SECONDS=lease,
        FRONTIER_HEARTBEAT_SECONDS=1.0,
        PLAYWRIGHT_RENDER_URLS=json.dumps(rule),
    )
    nodes = [_start(fleet), _start(fleet)]
    fleet.seed(shop.url("/"))
    marker = f'/product/{victim}"'.encode()

    def holder() -> bytes | None:
        for member in redis_client.zrange(fleet.keys.inflight, 0, -1):
            if marker in member:
                return member.split(b"\n", 1)[0]
        return None

    def rendering() -> bytes | None:
        # The victim is leased and Chromium has requested it from the shop.
        node_id = holder()
        hit = shop.stats()["product_hits"].get(str(victim), 0)
        return node_id if node_id and hit else None

    node_id = wait_for(rendering, 60, "the slow render to start")
    started = time.monotonic()
    index = [n.pid for n in nodes].index(int(node_id.decode().split(":")[1]))
    tree = _descendants(nodes[index].pid)
    assert any(_command(pid).startswith("chrom") for pid in tree), "no Chromium under the node"

    # Longer than a lease: heartbeats keep the render on its node.
    time.sleep(max(0.0, lease + 1.5 - (time.monotonic() - started)))
    assert time.monotonic() - started < render_ms / 1000, "the render finished too early"
    assert holder() == node_id
    assert shop.stats()["product_hits"][str(victim)] == 1

    nodes[index].send_signal(signal.SIGKILL)
    nodes[index].wait(10)
    try:
        wait_for(lambda: not _alive(tree), 15, "Chromium of the killed node to exit", 0.2)
    finally:
        for pid in _alive(tree):
            os.kill(pid, signal.SIGKILL)

    survivor = 1 - index
    codes = fleet.wait(120)
    assert codes[survivor] == 0
    assert codes[index] == -signal.SIGKILL
    assert fleet.stat(survivor, "frontier/reaped") >= 1
    assert shop.stats()["product_hits"][str(victim)] == 2
    stored = _stored(mongo)
    assert set(stored) == set(catalogue)
    assert stored[victim]["rendered"] is True
    _assert_matches_catalogue(stored[victim], catalogue[victim], shop)
