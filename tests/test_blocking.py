"""Block detection: a site's refusal is never parsed as its page.

The policy (project/blocking/policy.py) on Scrapy responses as the downloader hands them
over; the middleware in real ``scrapy crawl`` nodes against the test shop defending itself
(tests/site/defense.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Response, TextResponse
from scrapy.settings import Settings

from project.blocking.config import BlockConfig
from project.blocking.policy import BlockPolicy
from tests.fleet import wait_for
from tests.site.defense import ANSWERS, Defense

if TYPE_CHECKING:
    import pymongo.database
    import redis

    from tests.fleet import Fleet

SITE = "shop.test"
_GOOD = (
    b'<html><head><title>Oak table | Shop</title></head><body><header><a class="home" href="/">'
    b'Shop</a></header><div class="product"><h1>Oak table</h1>' + b"<p>Solid oak.</p>" * 60
    + b"</div></body></html>"
)  # fmt: skip


def _policy(**settings: Any) -> BlockPolicy:
    return BlockPolicy(BlockConfig.from_settings(Settings(settings)))


def _html(body: bytes, status: int = 200, url: str = "http://shop.test/p/1", **meta: Any) -> Any:
    request = Request(url, meta=meta)
    return request, HtmlResponse(
        url, status=status, body=body, headers={"Content-Type": "text/html"}, request=request
    )


def _signal(policy: BlockPolicy, body: bytes, status: int = 200, **kwargs: Any) -> str | None:
    request, response = _html(body, status, **kwargs)
    return policy.blocked(request, response, SITE, Spider("s"))


def test_statuses_are_blocks_unless_they_say_when_to_come_back() -> None:
    policy = _policy()
    assert _signal(policy, b"denied", 403) == "status_403"
    assert _signal(policy, b"slow down", 429) == "status_429"
    assert _signal(policy, b"busy", 503) == "status_503"
    assert _signal(policy, b"gone", 404) is None
    for status in (429, 503):
        request = Request("http://shop.test/p/1")
        waiting = TextResponse(
            request.url, status=status, headers={"Retry-After": "5"}, body=b"", request=request
        )
        assert policy.blocked(request, waiting, SITE, Spider("s")) is None, "the retries pause"
        garbage = TextResponse(
            request.url, status=status, headers={"Retry-After": "soon"}, body=b"", request=request
        )
        assert policy.blocked(request, garbage, SITE, Spider("s")) == f"status_{status}"
    assert _signal(_policy(BLOCK_STATUSES=[403]), b"busy", 503) is None


def test_the_common_challenge_pages_are_recognised_and_a_page_is_not() -> None:
    policy = _policy()
    for page in (
        b"<html><head><title>Just a moment...</title></head><body></body></html>",
        b"<title>Attention Required! | Cloudflare</title>",
        b'<html><body><div id="challenge-running"></div></body></html>',
        b'<script src="/cdn-cgi/challenge-platform/h/b/orchestrate/jsch/v1"></script>',
        b"<html><body><iframe src='/_Incapsula_Resource?SWUDNSAI=31'></iframe></body></html>",
        b'<div id="px-captcha"></div>',
        b"<script src='https://ct.captcha-delivery.com/c.js'></script>",
        b"<title>Access Denied</title><h1>Access Denied</h1>Reference #18.5c3c1002.1700000000",
        Defense.reply("challenge", "/p/1").body,
    ):
        assert _signal(policy, page) == "challenge", page
    assert _signal(policy, _GOOD) is None
    # a marker far into a huge page is not looked for (BLOCK_SCAN_BYTES)
    assert _signal(policy, b"x" * 70_000 + b"<title>Just a moment...</title>") is None
    assert _signal(_policy(BLOCK_MARKERS=[]), b"<title>Just a moment...</title>") is None
    assert _signal(_policy(BLOCK_MARKER_CSS=["form#login-wall"]), b'<form id="login-wall">') == (
        "challenge"
    )


def test_a_redirect_to_a_challenge_url_is_a_block() -> None:
    policy = _policy()
    redirected = {"redirect_urls": ["http://shop.test/p/1"]}
    page = Defense.reply("soft", "/").body  # what the challenge URL shows does not matter
    assert _signal(policy, page, url="http://shop.test/challenge?next=%2Fp%2F1", **redirected) == (
        "challenge_url"
    )
    assert _signal(policy, _GOOD, url="http://shop.test/challenge-accepted", **redirected) is None
    assert _signal(policy, _GOOD, url="http://shop.test/challenge") is None, "not redirected there"
    request = Request("http://shop.test/p/1")
    held = Response(request.url, status=302, headers={"Location": "/challenge?next=/p/1"})
    assert policy.blocked(request, held, SITE, Spider("s")) == "challenge_url"


def test_a_page_without_its_content_is_a_soft_block() -> None:
    policy = _policy(BLOCK_REQUIRED_CSS={SITE: "div.product"})
    soft = Defense.reply("soft", "/p/1").body
    assert _signal(policy, soft) == "soft_missing"
    assert _signal(policy, _GOOD) is None
    # or the spider's attribute, for all its sites
    spider = Spider("s")
    spider.block_required_css = "header .home"  # type: ignore[attr-defined]
    request, response = _html(soft)
    assert _policy().blocked(request, response, SITE, spider) == "soft_missing"
    # a JSON answer has no selectors to miss
    json_response = TextResponse(
        "http://shop.test/api", body=b"{}", headers={"Content-Type": "application/json"}
    )
    assert policy.blocked(Request("http://shop.test/api"), json_response, SITE, spider) is None


def test_a_page_much_shorter_than_its_sites_good_pages_is_a_soft_block() -> None:
    policy = _policy(BLOCK_SOFT_MIN_SAMPLES=5)
    soft = Defense.reply("soft", "/p/1").body
    assert _signal(policy, soft) is None, "no median yet"
    for n in range(5):
        request, response = _html(_GOOD + b" " * n)
        assert policy.blocked(request, response, SITE, Spider("s")) is None
        policy.passed(response, SITE)
    assert _signal(policy, soft) == "soft_short"
    assert _signal(policy, _GOOD[: len(_GOOD) // 2]) is None, "half as long is a page"
    request, response = _html(soft)
    assert policy.blocked(request, response, "other.test", Spider("s")) is None, "per site"
    assert _signal(_policy(BLOCK_SOFT_RATIO=0), soft) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BLOCK_STATUSES", ["forbidden"]),
        ("BLOCK_MARKERS", ["(unclosed"]),
        ("BLOCK_CHALLENGE_URLS", ["[a-"]),
        ("BLOCK_SOFT_RATIO", 1.5),
        ("BLOCK_MAX_TRIES", 0),
    ],
)
def test_bad_block_settings_stop_the_node(name: str, value: object) -> None:
    with pytest.raises(NotConfigured, match=name):
        BlockConfig.from_settings(Settings({name: value}))


def _dead(client: redis.Redis, fleet: Fleet) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(fleet.keys.dead, 0, -1)]


@pytest.mark.crawl
def test_a_page_blocked_once_is_fetched_again_and_never_parsed(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any], redis_client: redis.Redis
) -> None:
    # every page's first answer is a block: a challenge (200), a 403, a page without content
    # (200) or a redirect to the challenge page, by the page
    shop = make_shop(products=60, block_first=1)
    fleet.start_node(
        BLOCK_REQUIRED_CSS={"*": "header .home"},
        FRONTIER_RETRY_BACKOFF_BASE=0.1,
        # sessions without proxies: a 403 is tried again as another visitor (a cookie jar
        # of its own); the one address is never cooled down here
        SESSION_ENABLED=True,
        PROXY_COOLDOWN_BASE=0,
    )
    fleet.seed(shop.url("/"))
    assert fleet.wait(180) == [0]

    stats = shop.stats()
    assert len(stats["product_hits"]) == 60
    assert set(stats["product_hits"].values()) == {2}, "each product: its block, then its page"
    assert mongo.products.count_documents({}) == 60
    assert (
        mongo.products.count_documents({"name": {"$regex": "moment|wrong", "$options": "i"}}) == 0
    )
    assert _dead(redis_client, fleet) == []
    node = fleet.stats(0)
    # the shop blocks each path once, whatever its query; robots.txt is never looked at
    paths = {uri.split("?")[0] for uri in stats["hits"]} - {"/challenge", "/robots.txt"}
    assert node["blocks/count"] == len(paths)
    by_signal = {k.split("/")[-1]: v for k, v in node.items() if k.startswith("blocks/signal/")}
    assert set(by_signal) == {"challenge", "status_403", "soft_missing", "challenge_url"}
    assert sum(by_signal.values()) == node["blocks/count"]
    site = shop.url("/").split("//")[1].rstrip("/")
    assert (
        sum(v for k, v in node.items() if k.startswith(f"blocks/{site}/")) == node["blocks/count"]
    )
    assert "playwright/fallback" not in node, "a soft-blocked page went on to Chromium"
    assert node.get("item_scraped_count") == 60
    # the run's report: blocks by signal and by site, and an alert (half the answers)
    report = wait_for(lambda: mongo.crawl_runs.find_one({}), 30, "the run's report")
    assert report["blocks"]["count"] == node["blocks/count"]
    assert report["blocks"]["by_signal"] == by_signal
    [entry] = report["blocks"]["sites"]
    assert entry["site"] == site
    assert entry["rate"] == pytest.approx(0.5, abs=0.02)
    assert any(alert.startswith(f"{site} blocked") for alert in report["alerts"])


@pytest.mark.crawl
def test_a_page_blocked_every_time_is_dead_lettered_with_its_signal(
    fleet: Fleet, make_shop, mongo: pymongo.database.Database[Any], redis_client: redis.Redis
) -> None:
    shop = make_shop(products=10, block_first=5, block_first_answer="challenge")
    products = [shop.url(p["url"]) for p in shop.catalogue()["products"][:4]]
    fleet.start_node(BLOCK_MAX_TRIES=2, FRONTIER_RETRY_BACKOFF_BASE=0.1)
    fleet.seed(*products)
    assert fleet.wait(120) == [0]

    dead = _dead(redis_client, fleet)
    assert sorted(d["url"] for d in dead) == sorted(products)
    assert {d["error"] for d in dead} == {"blocked: challenge"}
    assert {d["attempts"] for d in dead} == {2}
    hits = shop.stats()["product_hits"]
    assert sorted(hits.values()) == [2, 2, 2, 2], "BLOCK_MAX_TRIES tries each"
    assert mongo.products.count_documents({}) == 0
    node = fleet.stats(0)
    assert node["blocks/signal/challenge"] == 8
    assert node["frontier/retry/blocked"] == 4


def test_every_answer_of_the_defense_is_one_the_policy_tells_apart() -> None:
    policy = _policy(BLOCK_REQUIRED_CSS={"*": "header .home"})
    seen = set()
    for answer in ANSWERS:
        reply = Defense.reply(answer, "/product/1")
        request = Request("http://shop.test/product/1")
        headers = {"Content-Type": reply.content_type, **reply.headers}
        response = HtmlResponse(
            request.url, status=reply.status, body=reply.body, headers=headers, request=request
        )
        seen.add(policy.blocked(request, response, SITE, Spider("s")))
    assert seen == {"challenge", "status_403", "soft_missing", "challenge_url"}
