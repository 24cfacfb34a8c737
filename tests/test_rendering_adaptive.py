"""Adaptive rendering: which pages need the browser, learnt by the fleet; and a cheaper render.

The crawls run real ``scrapy crawl`` nodes against the test shop's mixed section
(tests/site/mixed.py): static product pages (``/mixed/shelf/<id>``), pages only JavaScript
builds (``/mixed/app/<id>``) and a pattern that turns into JavaScript part-way
(``/mixed/deal/<id>``). Renders are counted at the shop (a beacon only a browser sends).
"""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from project.frontier.queue import StepBatch
from project.items import ProductItem
from project.monitoring.status import render_patterns
from project.rendering.evidence import agree, path_template, pattern_key, summarize
from project.rendering.middleware import RenderingMiddleware, RenderWait
from project.rendering.plan import (
    MODE_BROWSER,
    MODE_HTTP,
    ROLE_BROWSER,
    ROLE_HTTP,
    ROLE_SAMPLE,
    ROLE_WAIT,
    WAIT_SECONDS,
    Pattern,
    RenderPlan,
    plan_of,
)
from project.rendering.wire import ADAPTIVE_META_KEY, WAITS_META_KEY
from project.utils import child_processes
from spiders.products import ProductsSpider
from tests.fleet import run_cli, wait_for
from tests.test_frontier_step import run

if TYPE_CHECKING:
    import redis

    from project.frontier.keys import FrontierKeys
    from project.frontier.queue import LeasedQueue
    from tests.fleet import Fleet

_AVAILABILITY = {"in stock": "in_stock", "out of stock": "out_of_stock"}
_ADAPTIVE = {"PLAYWRIGHT_ADAPTIVE": True}


# -- patterns and summaries ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "template"),
    [
        ("https://shop.test/product/123?ref=home#x", "/product/{n}"),
        ("https://shop.test/p/sku-000123/reviews", "/p/sku-{n}/reviews"),
        ("https://shop.test/item/5f2b9c0e8d1a4b7c9e3f", "/item/{id}"),
        ("https://shop.test/product/blue-cotton-shirt", "/product/{slug}"),
        ("https://shop.test/category/shoes", "/category/shoes"),
        ("https://shop.test/", "/"),
        ("https://shop.test/a/b/c/d/e/f/g/h/i", "/a/b/c/d/e/f/{...}"),
        ("https://shop.test/" + "x" * 5000, "/{id}"),
        ("https://[::1/bad", "/"),
    ],
)
def test_a_path_template_leaves_out_what_varies_page_to_page(url: str, template: str) -> None:
    assert path_template(url) == template


def test_a_pattern_is_site_template_and_callback() -> None:
    key = pattern_key("https://shop.test/product/7\t", "parse_product")
    assert key.split("\t") == ["shop.test", "/product/{n}", "parse_product"]


def _item(**fields: Any) -> ProductItem:
    return ProductItem(url="https://shop.test/p/1", **fields)


def test_summaries_agree_after_normalising_whitespace_and_numbers() -> None:
    links = [Request(f"https://shop.test/p/{n}") for n in range(20)]
    plain = summarize(
        "https://shop.test/p/1",
        [_item(name="  Oak\n Chair ", price="1,299.00", rendered=False), *links],
        frozenset({"rendered"}),
    )
    browser = summarize(
        "https://shop.test/p/1",
        [_item(name="Oak Chair", price="1299", rendered=True), *links[:18]],
        frozenset({"rendered"}),
    )
    assert agree(plain, browser)  # two links fewer is within a few


@pytest.mark.parametrize(
    ("plain_output", "reason"),
    [
        ([], "no item"),
        ([_item(name="Oak Chair")], "a field missing"),
        ([_item(name="Oak Chair", price="12.99")], "a value differs"),
        ([_item(name="Oak Chair", price="1299"), _item(name="x")], "an item more"),
    ],
)
def test_a_plain_page_that_misses_what_the_browser_found_does_not_agree(
    plain_output: list[Any], reason: str
) -> None:
    browser = summarize(
        "https://shop.test/p/1", [_item(name="Oak Chair", price="1299")], frozenset()
    )
    plain = summarize("https://shop.test/p/1", plain_output, frozenset())
    assert not agree(plain, browser), reason


def test_links_far_apart_do_not_agree_and_a_page_asking_for_itself_is_no_link() -> None:
    url = "https://shop.test/c/1"
    browser = summarize(url, [Request(f"https://shop.test/p/{n}") for n in range(40)], frozenset())
    plain = summarize(url, [Request(url, meta={"playwright": True})], frozenset())
    assert plain["l"] == []
    assert plain["n"] == 0
    assert not agree(plain, browser)


def test_a_hostile_output_costs_a_bounded_summary() -> None:
    huge = "word " * 1_000_000
    deep: Any = []
    for _ in range(500):
        deep = [deep]
    output = [_item(name=huge, description=deep, price=float("nan")) for _ in range(1000)]
    output += [Request(f"https://shop.test/p/{n}") for n in range(10_000)]
    summary = summarize("https://shop.test/", output, frozenset())
    assert len(summary["i"]) == 20
    assert len(summary["l"]) == 300
    assert summary["n"] == 10_000
    assert len(json.dumps(summary)) < 40_000


# -- the node's plan ------------------------------------------------------------------


def _plan(draw: float = 0.99) -> RenderPlan:
    crawler = get_crawler(ProductsSpider, _ADAPTIVE)
    crawler.stats.open_spider()
    return RenderPlan(crawler.stats, draw=lambda: draw)


def test_a_learning_pattern_is_sampled_then_rendered_until_the_fleet_answers() -> None:
    plan = _plan()
    roles = [plan.decide("s\t/p/{n}\tparse") for _ in range(5)]
    assert roles == [ROLE_SAMPLE] * 3 + [ROLE_BROWSER] * 2


def test_a_leased_page_of_a_learning_pattern_waits_for_the_fleets_answer_a_few_times() -> None:
    """While its samples are out, a leased page of the pattern goes back to the fleet unfetched
    (a retry due in WAIT_SECONDS, not an attempt) rather than to the browser, at most
    MOST_WAITS times; a page that is not leased (no frontier) is rendered."""
    from project.frontier.meta import LEASE_META_KEY, OUTCOME_META_KEY
    from project.rendering.plan import MOST_WAITS

    crawler = get_crawler(ProductsSpider, _ADAPTIVE)
    crawler.stats.open_spider()
    middleware = build_from_crawler(RenderingMiddleware, crawler)
    plan = plan_of(crawler)
    assert plan is not None
    assert [plan.decide("k", can_wait=True) for _ in range(4)] == [ROLE_SAMPLE] * 3 + [ROLE_WAIT]

    def page(n: int, **meta: Any) -> Request:
        return Request(f"https://shop.test/p/{n}", meta={LEASE_META_KEY: b"m", **meta})

    for n in range(3):  # the samples
        request = page(n)
        middleware.process_request(request)
        assert request.meta[ADAPTIVE_META_KEY]["r"] == ROLE_SAMPLE
    waiting = page(3)
    with pytest.raises(RenderWait):
        middleware.process_request(waiting)
    outcome = waiting.meta[OUTCOME_META_KEY]
    assert (outcome["action"], outcome["delay"]) == ("retry", WAIT_SECONDS)
    assert outcome["request"] is waiting
    assert "retry_times" not in waiting.meta
    assert waiting.meta[WAITS_META_KEY] == 1
    assert "playwright" not in waiting.meta
    # waited enough (or a count no wait leaves, from a stranger in Redis): rendered
    for waits in (MOST_WAITS, -1):
        tired = page(4, **{WAITS_META_KEY: waits})
        middleware.process_request(tired)
        assert tired.meta["playwright"] is True
    unleased = Request("https://shop.test/p/5")
    middleware.process_request(unleased)
    assert unleased.meta["playwright"] is True
    assert crawler.stats.get_value("render/adaptive/wait") == 1


def test_a_settled_pattern_is_sampled_again_more_while_its_evidence_is_thin() -> None:
    """More re-checks while the evidence is thin; fewer of an http pattern whose pages rescues
    guard (a re-check is a render) than of a browser one (a re-check is a plain fetch) or of
    an http pattern that yields no item (nothing else would notice it change)."""
    plan = _plan(draw=0.02)
    plan.patterns["thin http"] = Pattern(MODE_HTTP, agree=3, items=1)  # 0.10 / 4 = 2.5 %
    plan.patterns["proven http"] = Pattern(MODE_HTTP, agree=60, items=1)  # 1 %
    plan.patterns["listing"] = Pattern(MODE_HTTP, agree=60, items=0)  # no rescue: 3 %
    plan.patterns["thin browser"] = Pattern(MODE_BROWSER, miss=3)  # 0.25 / 4 = 6.25 %
    plan.patterns["proven browser"] = Pattern(MODE_BROWSER, agree=0, miss=60)  # 3 %
    assert plan.decide("thin http") == ROLE_SAMPLE
    assert plan.decide("proven http") == ROLE_HTTP
    assert plan.decide("listing") == ROLE_SAMPLE
    assert plan.decide("proven browser") == ROLE_SAMPLE
    plan._draw = lambda: 0.05
    assert plan.decide("thin http") == ROLE_HTTP
    assert plan.decide("listing") == ROLE_HTTP
    assert plan.decide("thin browser") == ROLE_SAMPLE
    assert plan.decide("proven browser") == ROLE_BROWSER
    plan._draw = lambda: 0.99
    assert plan.decide("thin browser") == ROLE_BROWSER
    assert plan.stats.get_value("render/adaptive/rechecks") == 4


def test_a_plain_page_yielding_less_than_its_pattern_renders_looks_short() -> None:
    plan = _plan()
    plan.patterns["k"] = Pattern(MODE_HTTP, agree=5, items=1, fields=("name", "price"))
    full = summarize("u", [_item(name="a", price="1")], frozenset())
    empty = summarize("u", [], frozenset())
    priceless = summarize("u", [_item(name="a")], frozenset())
    assert not plan.looks_short("k", full)
    assert plan.looks_short("k", empty)
    assert plan.looks_short("k", priceless)
    assert not plan.looks_short("unknown", empty)


def test_the_users_meta_and_render_rules_win_over_the_plan() -> None:
    crawler = get_crawler(ProductsSpider, {**_ADAPTIVE, "PLAYWRIGHT_RENDER_URLS": ["/always/"]})
    crawler.stats.open_spider()
    middleware = build_from_crawler(RenderingMiddleware, crawler)
    plan = plan_of(crawler)
    assert plan is not None
    assert middleware.plan is plan
    plan.patterns[pattern_key("https://shop.test/p/1", "parse")] = Pattern(MODE_BROWSER, miss=9)
    plain = Request("https://shop.test/p/1", meta={"playwright": False})
    middleware.process_request(plain)
    assert plain.meta["playwright"] is False
    assert ADAPTIVE_META_KEY not in plain.meta
    ruled = Request("https://shop.test/always/1")
    middleware.process_request(ruled)
    assert ruled.meta["playwright"] is True
    assert ADAPTIVE_META_KEY not in ruled.meta
    posted = Request("https://shop.test/p/1", method="POST")
    middleware.process_request(posted)
    assert ADAPTIVE_META_KEY not in posted.meta
    decided = Request("https://shop.test/p/2")
    middleware.process_request(decided)
    assert decided.meta[ADAPTIVE_META_KEY]["r"] in (ROLE_BROWSER, ROLE_SAMPLE)


# -- the fleet's patterns in Redis (lua/step/render.lua) ----------------------------------


def _options(version: int = -1, most: int = 2000) -> dict[str, Any]:
    return {"known": version, "most": most, "forget_ms": 60_000}


def _told(key: str, outcome: str, items: int = 1) -> tuple[str, str, str]:
    return (key, outcome, json.dumps({"i": items, "f": ["name", "price"]}))


def test_outcomes_settle_a_pattern_for_every_node(redis_url: str, keys: FrontierKeys) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        first = await a.step(
            StepBatch(render=[_told("s\t/p\tparse", "a")] * 3, render_options=_options(), seq=1)
        )
        version, changes, full = first.render
        assert json.loads(changes)["s\t/p\tparse"][0] == MODE_HTTP
        assert not full
        # the other node hears of it in its next step; a node that knows it hears nothing
        seen = await b.step(StepBatch(render_options=_options()))
        assert json.loads(seen.render[1])["s\t/p\tparse"][:3] == [MODE_HTTP, 3, 0]
        quiet = await b.step(StepBatch(render_options=_options(version)))
        assert quiet.render == (version, b"", False)
        # one miss: the browser, for everyone; the same step again changes nothing
        batch = StepBatch(
            render=[_told("s\t/p\tparse", "m", 2)], render_options=_options(version), seq=2
        )
        missed = await a.step(batch)
        assert (await a.step(batch)).replayed
        assert json.loads(missed.render[1])["s\t/p\tparse"] == [
            MODE_BROWSER,
            3,
            1,
            1,
            ["name", "price"],
        ]

    run(redis_url, keys, scenario)


def test_the_fleet_keeps_a_bounded_number_of_patterns(
    redis_url: str, redis_client: redis.Redis, keys: FrontierKeys
) -> None:
    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        told = [_told(f"s\t/p{n}\tparse", "a") for n in range(5)]
        result = await a.step(StepBatch(render=told, render_options=_options(most=3), seq=3))
        assert len(json.loads(result.render[1])) == 3
        assert result.render[2]
        # garbage outcomes and data are no evidence, and cost nothing
        junk = [("s\t/x\tparse", "?", "{}"), ("s\t/p0\tparse", "a", "not json" * 1000)]
        await a.step(StepBatch(render=junk, render_options=_options(most=10), seq=4))
        assert redis_client.hlen(keys.render) == 3
        assert json.loads(redis_client.hget(keys.render, "s\t/p0\tparse"))["a"] == 2

    run(redis_url, keys, scenario)


def test_hostile_records_cost_the_fleet_nothing(
    redis_url: str, redis_client: redis.Redis, keys: FrontierKeys
) -> None:
    """Anyone may write Redis: a record that is not one is made again by the next outcome,
    and status and the nodes read what they can of the rest."""
    redis_client.hset(keys.render, "s\t/p\tparse", '{"h": 5, "a": "x"}')
    redis_client.hset(keys.render, "s\t/q\tparse", '{"mode": "[/]", "a": "x", "m": 1e999}')
    redis_client.hset(keys.render, "junk", "not json")

    async def scenario(a: LeasedQueue, b: LeasedQueue) -> None:
        result = await a.step(
            StepBatch(render=[_told("s\t/p\tparse", "m")], render_options=_options(), seq=5)
        )
        changed = json.loads(result.render[1])
        assert changed["s\t/p\tparse"][:3] == [MODE_BROWSER, 0, 1]
        plan = _plan()
        plan.apply(result.render)
        plan.apply((result.render[0] + 1, b'{"k": ["http", "x", 1e999, null, [1, "a"]]}', False))
        assert plan.patterns["k"] == Pattern(MODE_HTTP, 0, 0, -1, ("a",))

    run(redis_url, keys, scenario)
    view = render_patterns(redis_client.hgetall(keys.render))
    assert view["count"] == 2
    hostile = next(p for p in view["patterns"] if p["template"] == "/q")
    assert (hostile["mode"], hostile["agreed"], hostile["missed"]) == ("learn", 0, 0)


# -- crawls of the mixed site ------------------------------------------------------------


def _start(fleet: Fleet, **settings: Any):
    journal = fleet.log_dir / f"journal{len(fleet.procs)}"
    return fleet.start_node(MONGO_JOURNAL_DIR=str(journal), **{**_ADAPTIVE, **settings})


def _stored(mongo) -> dict[str, dict]:
    return {doc["url"]: doc for doc in mongo.products.find({})}


def _assert_as_the_browser_finds(stored: dict[str, dict], expected: dict[str, dict]) -> None:
    assert set(stored) == set(expected)
    for url, product in expected.items():
        doc = stored[url]
        for field in ("name", "price", "currency", "sku", "description"):
            assert doc[field] == product[field], (url, field)
        assert doc["availability"] == _AVAILABILITY[product["availability"]]


def _plain_and_rendered(shop, pattern: str) -> tuple[int, int, int]:
    """(pages of the pattern, plain fetches of them, renders of them), counted at the shop."""
    stats = shop.stats()
    paths = [p for p in stats["mixed_hits"] if p.startswith(f"/mixed/{pattern}/")]
    renders = sum(stats["mixed_renders"].get(p, 0) for p in paths)
    hits = sum(stats["mixed_hits"][p] for p in paths)
    return len(paths), hits - renders, renders


def _patterns(fleet: Fleet) -> dict[str, dict[str, Any]]:
    status = run_cli("status", "--json", *fleet.space.cli_args(), env=fleet.env())
    assert status.returncode == 0, status.stderr
    return {p["template"]: p for p in json.loads(status.stdout)["rendering"]["patterns"]}


@pytest.mark.crawl
@pytest.mark.slow("two nodes with Chromium crawl the whole mixed site")
def test_two_nodes_learn_the_mixed_site_and_store_every_product_as_the_browser_finds_it(
    fleet: Fleet, make_shop, mongo
) -> None:
    shop = make_shop(mixed=150, mixed_js_share=0.3, mixed_deal_share=0.3, mixed_switch_after=10)
    expected = shop.mixed_expected()["products"]
    _start(fleet)
    _start(fleet)
    fleet.seed(shop.url("/mixed/"))
    assert fleet.wait(150) == [0, 0]

    stored = _stored(mongo)
    _assert_as_the_browser_finds(stored, expected)  # each once: keyed by URL
    patterns = _patterns(fleet)
    assert patterns["/mixed/shelf/{n}"]["mode"] == MODE_HTTP
    assert patterns["/mixed/app/{n}"]["mode"] == MODE_BROWSER
    # the deal pages turned into JavaScript after 10: noticed, and none stored empty
    assert shop.mixed_expected()["switched"]
    assert patterns["/mixed/deal/{n}"]["mode"] == MODE_BROWSER
    assert patterns["/mixed/deal/{n}"]["missed"] >= 1
    # static pages settled on plain HTTP: those fetched after it went without a browser
    renders = shop.stats()["mixed_renders"]
    shelves = [p for p in shop.stats()["mixed_hits"] if p.startswith("/mixed/shelf/")]
    assert [p for p in shelves if not renders.get(p)], "no static page went plainly"
    stats = [fleet.stats(i) for i in (0, 1)]
    assert sum(s.get("render/adaptive/http", 0) for s in stats) > 0
    assert sum(s.get("render/adaptive/agreed", 0) for s in stats) >= 3


@pytest.mark.crawl
def test_a_pattern_one_node_settled_on_the_browser_is_rendered_directly_by_another(
    fleet: Fleet, make_shop, mongo
) -> None:
    shop = make_shop(mixed=160, mixed_js_share=1.0, page_size=20)
    first, second = shop.url("/mixed/category/1?page=1"), shop.url("/mixed/category/2?page=1")
    _start(fleet)
    fleet.seed(first)
    assert fleet.wait(120) == [0]
    assert _patterns(fleet)["/mixed/app/{n}"]["mode"] == MODE_BROWSER
    shop.reset()
    _start(fleet)
    fleet.seed(second)
    assert fleet.wait(120)[1] == 0
    pages, plain, renders = _plain_and_rendered(shop, "app")
    assert pages > 0
    assert renders == pages
    # rendered straight away, but for the re-check share
    assert plain <= pages // 2
    assert fleet.stat(1, "render/adaptive/browser") >= pages // 2
    stored = _stored(mongo)
    assert all(stored[url]["name"] for url in stored)


@pytest.mark.crawl
def test_a_browser_killed_mid_render_costs_no_page(fleet: Fleet, make_shop, mongo) -> None:
    shop = make_shop(products=40, js_share=1.0, latency_ms=150)
    node = _start(fleet, PLAYWRIGHT_ADAPTIVE=False, PLAYWRIGHT_RENDER_URLS='["/product/"]')
    fleet.seed(shop.url("/"))
    wait_for(lambda: len(shop.stats()["product_hits"]) >= 8, 60, "renders under way")
    killed = _kill_browsers(node.pid)
    assert killed, "no Chromium to kill"
    assert fleet.wait(150) == [0]
    assert len(list(mongo.products.find({}))) == 40
    assert fleet.stat(0, "playwright/browser_count") >= 2  # launched again


def _kill_browsers(root: int) -> list[int]:
    todo, killed = child_processes(str(root)), []
    while todo:
        pid = todo.pop()
        todo += child_processes(pid)
        try:
            with open(f"/proc/{pid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        if name.startswith("chrom"):
            os.kill(int(pid), signal.SIGKILL)
            killed.append(int(pid))
    return killed


@pytest.mark.crawl
def test_a_browser_past_its_memory_bound_is_recycled_and_no_page_is_lost(
    fleet: Fleet, make_shop, mongo
) -> None:
    shop = make_shop(products=40, js_share=1.0, latency_ms=200)
    _start(
        fleet,
        PLAYWRIGHT_ADAPTIVE=False,
        PLAYWRIGHT_MAX_RSS=1,
        PLAYWRIGHT_RENDER_URLS='["/product/"]',
    )
    fleet.seed(shop.url("/"))
    assert fleet.wait(150) == [0]
    assert len(list(mongo.products.find({}))) == 40
    assert fleet.stat(0, "playwright/browser_recycled") >= 1
    assert fleet.stat(0, "playwright/browser_count") >= 2


@pytest.mark.crawl
def test_a_rules_wait_and_aborts_replace_the_defaults(fleet: Fleet, make_shop, mongo) -> None:
    shop = make_shop(products=20, js_share=1.0)
    rule = {"/product/": {"wait_for": ".product .sku", "abort": ["font"]}}
    _start(fleet, PLAYWRIGHT_ADAPTIVE=False, PLAYWRIGHT_RENDER_URLS=json.dumps(rule))
    fleet.seed(shop.url("/"))
    assert fleet.wait(90) == [0]
    assert len(list(mongo.products.find({"sku": {"$ne": None}}))) == 20
    images = [path for path in shop.stats()["hits"] if path.startswith("/img/")]
    assert images, "the rule lets images through"
    assert fleet.stat(0, "playwright/page_reused") > 0
