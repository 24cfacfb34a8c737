"""The frontier's components built the way Scrapy builds them, against a real Redis.

``get_crawler`` with the add-on and this test's key space, then ``build_from_crawler``:
the scheduler, the retry and robots.txt middlewares, and every Config class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from protego import Protego
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.robotstxt import ProtegoRobotParser
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from project.addon import FleetAddon
from project.frontier.config import FrontierConfig, RetryConfig, SiteLimits
from project.frontier.keys import FrontierKeys, KeyTemplates
from project.frontier.meta import LEASE_META_KEY, OUTCOME_META_KEY, RETRY_COPY_META_KEY
from project.frontier.retry import FrontierRetryMiddleware
from project.frontier.robots import (
    CACHED_FLAG,
    ExpiringRobotsTxtMiddleware,
    RobotsCacheMiddleware,
    RobotsConfig,
)
from project.frontier.scheduler import FleetScheduler
from project.frontier.stopping import cut, send_back
from project.monitoring.node import MonitorConfig
from project.monitoring.statsfile import StatsFileConfig
from project.rendering.config import RenderingConfig
from project.rendering.middleware import RenderWait
from project.storage.config import MongoConfig
from spiders.products import ProductsSpider

if TYPE_CHECKING:
    import redis

    from tests.fleet import KeySpace


def _crawler(
    redis_url: str, keyspace: KeySpace, spidercls: type[Spider] = ProductsSpider, **settings: Any
):
    crawler = get_crawler(
        spidercls,
        {
            "ADDONS": {FleetAddon: 0},
            "REDIS_URL": redis_url,
            "ROBOTSTXT_OBEY": True,
            **keyspace.settings,
            **settings,
        },
    )
    crawler.spider = spidercls.from_crawler(crawler)
    return crawler


async def _until(condition, timeout: float = 5.0, what: str = "the condition"):
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := condition()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


# -- the scheduler ----------------------------------------------------------------------------


def _crawl(crawler) -> None:
    """A real crawl in this process: Scrapy without a Twisted reactor, on asyncio."""

    async def main() -> None:
        await crawler.crawl_async()

    asyncio.run(main())


# Scrapy's own asyncio HTTP handler: this process has no Twisted reactor for Playwright's.
IN_PROCESS = {
    "DOWNLOAD_HANDLERS": {
        "http": "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler",
        "https": "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler",
    },
    "ITEM_PIPELINES": {
        "pipelines.validation.ValidationPipeline": None,
        "pipelines.mongo.MongoPipeline": None,
    },
    "FRONTIER_IDLE_GRACE": 0.3,
    "FRONTIER_MAINTENANCE_SECONDS": 0.2,
    "MONITOR_ENABLED": False,
    "LOG_LEVEL": "INFO",
}


def _seeded_crawl(redis_url: str, redis_client, keyspace: KeySpace, shop, **settings: Any):
    """Seed the shop's home page and crawl it in this process, as one node."""
    redis_client.lpush(keyspace.keys("products").start_urls, shop.url("/"))
    settings = {"ADDONS": {FleetAddon: 0}, "REDIS_URL": redis_url, **keyspace.settings,
                **IN_PROCESS, **settings}  # fmt: skip
    crawler = get_crawler(ProductsSpider, settings)
    _crawl(crawler)
    return crawler


def test_scheduler_runs_a_crawl_through_the_shared_frontier(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys, make_shop
) -> None:
    shop = make_shop(products=30)
    crawler = _seeded_crawl(redis_url, redis_client, keyspace, shop, FRONTIER_NODE_ID="unit")

    stats = crawler.stats.get_stats()
    hits = shop.stats()["hits"]
    assert len(shop.stats()["product_hits"]) == 30
    assert max(hits.values()) == 1, "a page was fetched twice"
    pages = sum(hits.values()) - hits.get("/robots.txt", 0)
    assert stats["finish_reason"] == "finished"
    assert stats["frontier/leased"] == pages
    assert stats["frontier/acked"] == pages + stats["frontier/seeds/accepted"] == pages + 1
    assert stats["item_scraped_count"] == 30
    assert stats["robotstxt/response_count"] == 1, "Scrapy's robots.txt middleware at work"
    assert redis_client.zcard(keys.inflight) == 0
    assert redis_client.get(keys.queued) == b"0"
    assert redis_client.scard(keys.dupefilter) == pages
    assert (
        json.loads(redis_client.hget(keys.robots, urlsplit(shop.url("/")).netloc))["status"] == 200
    )


def test_scheduler_gives_unstarted_leases_back_when_it_closes(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys, make_shop
) -> None:
    shop = make_shop(products=200)
    crawler = _seeded_crawl(
        redis_url, redis_client, keyspace, shop, CLOSESPIDER_PAGECOUNT=5, CONCURRENT_REQUESTS=2
    )

    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "closespider_pagecount"
    assert redis_client.zcard(keys.inflight) == 0, "leases left behind by a clean close"
    assert int(redis_client.get(keys.queued)) > 0, "the rest waits for other nodes"


# -- the retry middleware ------------------------------------------------------------------------


def _leased(url: str, **meta: Any) -> Request:
    return Request(url, meta={LEASE_META_KEY: True, **meta})


def test_retry_middleware_sends_a_failure_back_to_redis_with_a_pause(
    redis_url: str, keyspace: KeySpace
) -> None:
    crawler = _crawler(redis_url, keyspace, RETRY_TIMES=1)
    middleware = build_from_crawler(FrontierRetryMiddleware, crawler)
    request = _leased("http://shop.test/p")
    busy = Response(request.url, status=429, headers={"Retry-After": "7"}, request=request)
    copy = middleware.process_response(request, busy)
    # Scrapy's retry request goes back to the engine (so no errback fires for it), and the
    # scheduler hands it to the lease's settlement instead of queueing it twice.
    assert isinstance(copy, Request)
    assert copy is not request
    assert (copy.meta["retry_times"], copy.priority, copy.dont_filter) == (1, -1, True)
    assert copy.meta[RETRY_COPY_META_KEY] is True
    outcome = request.meta[OUTCOME_META_KEY]
    assert (outcome["action"], outcome["pause"], outcome["request"]) == ("retry", 7.0, copy)
    assert outcome["delay"] >= 7.0
    stats = crawler.stats
    assert stats.get_value("retry/count") == 1
    assert stats.get_value("retry/reason_count/429 Unknown Status") == 1
    # The copy's failure is the last one: a dead letter, and the response goes on.
    again = middleware.process_response(copy, busy)
    assert again is busy
    dead = {"action": "dead", "error": "HTTP 429", "attempts": 2, "pause": 7.0}
    assert copy.meta[OUTCOME_META_KEY] == dead, "the site still pauses"
    assert stats.get_value("retry/max_reached") == 1
    assert stats.get_value("frontier/retry/max_reached") == 1


def test_a_download_cut_by_the_stop_goes_back_unseen_by_errbacks_and_uncounted(
    redis_url: str, keyspace: KeySpace
) -> None:
    crawler = _crawler(redis_url, keyspace, RETRY_TIMES=1)
    middleware = build_from_crawler(FrontierRetryMiddleware, crawler)
    request = _leased("http://shop.test/p")
    exception = cut(request, 20.0)  # what the download handler raises at the grace's end
    copy = middleware.process_exception(request, exception)
    # a request back to the engine, which the scheduler drops (no errback fires); the lease
    # settles as a retry due at once with the request itself, not as another attempt
    assert isinstance(copy, Request)
    assert copy.meta[RETRY_COPY_META_KEY] is True
    outcome = request.meta[OUTCOME_META_KEY]
    assert (outcome["action"], outcome["delay"], outcome["request"]) == ("retry", 0.0, request)
    assert "retry_times" not in request.meta
    # a page put off while its render pattern learns goes back the same way, due later
    waiting = _leased("http://shop.test/w")
    send_back(waiting, 1.0, "RenderWait: samples out")
    assert isinstance(middleware.process_exception(waiting, RenderWait("samples out")), Request)
    assert waiting.meta[OUTCOME_META_KEY]["delay"] == 1.0
    assert crawler.stats.get_value("frontier/sent_back") == 2
    assert crawler.stats.get_value("frontier/retry/reason/RenderWait") == 1
    # an IgnoreRequest of any other kind is still passed on, unsettled by the middleware
    other = _leased("http://shop.test/q")
    assert middleware.process_exception(other, IgnoreRequest("offsite")) is None
    assert OUTCOME_META_KEY not in other.meta


def test_max_retry_times_in_meta_wins_over_retry_times(redis_url: str, keyspace: KeySpace) -> None:
    crawler = _crawler(redis_url, keyspace, RETRY_TIMES=5, RETRY_HTTP_CODES=[502])
    middleware = build_from_crawler(FrontierRetryMiddleware, crawler)
    request = _leased("http://shop.test/p", max_retry_times=0)
    failed = Response(request.url, status=502, request=request)
    assert middleware.process_response(request, failed) is failed
    assert request.meta[OUTCOME_META_KEY]["action"] == "dead"
    not_retried = _leased("http://shop.test/q")
    teapot = Response(not_retried.url, status=503, request=not_retried)
    assert middleware.process_response(not_retried, teapot) is teapot, "503 is not in the codes"
    assert OUTCOME_META_KEY not in not_retried.meta


@pytest.mark.parametrize("meta", [{"max_retry_times": "many"}, {"priority_adjust": [1]}])
def test_retry_meta_that_is_not_a_number_falls_back_to_the_settings(
    redis_url: str, keyspace: KeySpace, meta: dict[str, Any]
) -> None:
    """A payload from Redis may carry anything in meta: the page still retries, never lost."""
    crawler = _crawler(redis_url, keyspace, RETRY_TIMES=2)
    middleware = build_from_crawler(FrontierRetryMiddleware, crawler)
    request = _leased("http://shop.test/p", **meta)
    copy = middleware.process_response(request, Response(request.url, status=500, request=request))
    assert isinstance(copy, Request)
    assert (copy.meta["retry_times"], copy.priority) == (1, -1)


def test_retry_middleware_leaves_requests_it_did_not_lease_alone(
    redis_url: str, keyspace: KeySpace
) -> None:
    middleware = build_from_crawler(FrontierRetryMiddleware, _crawler(redis_url, keyspace))
    robots = Request("http://shop.test/robots.txt", meta={"dont_obey_robotstxt": True})
    failed = Response(robots.url, status=503, request=robots)
    assert middleware.process_response(robots, failed) is failed
    assert OUTCOME_META_KEY not in robots.meta


# -- the robots.txt cache -----------------------------------------------------------------------


def test_robots_txt_is_fetched_once_for_the_fleet_and_its_crawl_delay_caps_the_site(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys
) -> None:
    body = b"User-agent: *\nCrawl-delay: 0.5\nDisallow: /private\n"

    async def main() -> None:
        nodes = []
        for _ in range(2):
            crawler = _crawler(redis_url, keyspace)
            middleware = build_from_crawler(RobotsCacheMiddleware, crawler)
            middleware.spider_opened(crawler.spider)
            nodes.append(middleware)
        first, second = nodes

        def robots() -> Request:  # what RobotsTxtMiddleware downloads
            return Request("http://shop.test/robots.txt", meta={"dont_obey_robotstxt": True})

        fetched = robots()
        assert await first.process_request(fetched) is None, "no copy yet: node one fetches it"
        # Node two waits for node one's copy instead of fetching it too.
        waiting = asyncio.ensure_future(second.process_request(robots()))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await first.process_response(fetched, Response(fetched.url, body=body, request=fetched))
        cached = await asyncio.wait_for(waiting, 5)
        assert isinstance(cached, Response)
        assert (cached.status, cached.body, cached.flags) == (200, body, [CACHED_FLAG])
        # Scrapy's middleware parses it and sends robots_parsed; the rate follows Crawl-delay.
        await second.robots_parsed(ProtegoRobotParser(body, None), Request("http://shop.test/x"))
        for middleware in nodes:
            await middleware.spider_closed(middleware.crawler.spider)

    asyncio.run(main())
    assert json.loads(redis_client.hget(keys.robots, "shop.test"))["status"] == 200
    # the site keeps the fleet's concurrency cap (FRONTIER_SITE_CONCURRENCY) under its new rate
    assert redis_client.hget(keys.limits, "shop.test") == b"2.0 32"
    assert not redis_client.exists(keys.robots_lock("shop.test"))


def test_a_redirected_robots_txt_is_cached_for_the_site_that_asked(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys
) -> None:
    async def main() -> None:
        crawler = _crawler(redis_url, keyspace)
        middleware = build_from_crawler(RobotsCacheMiddleware, crawler)
        middleware.spider_opened(crawler.spider)
        asked = Request("http://shop.test/robots.txt", meta={"dont_obey_robotstxt": True})
        assert await middleware.process_request(asked) is None
        moved = Response(asked.url, status=301, headers={"Location": "https://www.shop.test/r"})
        assert await middleware.process_response(asked, moved) is moved, "not stored yet"
        # RedirectMiddleware follows it with the same meta, to another host and path.
        followed = asked.replace(url="https://www.shop.test/r")
        assert await middleware.process_request(followed) is None
        body = b"User-agent: *\nDisallow: /x\n"
        await middleware.process_response(followed, Response(followed.url, body=body))
        await middleware.spider_closed(crawler.spider)

    asyncio.run(main())
    assert (
        json.loads(redis_client.hget(keys.robots, "shop.test"))["body"]
        == "User-agent: *\nDisallow: /x\n"
    )
    assert not redis_client.exists(keys.robots_lock("shop.test")), "the lock was released"


def test_a_nodes_parsed_robots_txt_expires(redis_url: str, keyspace: KeySpace) -> None:
    """Scrapy's own parser cache lives as long as the process; the fleet's expires."""
    crawler = _crawler(redis_url, keyspace, FRONTIER_ROBOTSTXT_CACHE_SECONDS=0.3)
    crawler.stats.open_spider()
    bodies = iter([b"User-agent: *\nDisallow: /a\n", b"User-agent: *\nDisallow: /b\n"])
    fetched: list[str] = []

    class _Engine:  # all robot_parser asks of the engine: download the site's robots.txt
        async def download_async(self, request: Request) -> Response:
            fetched.append(request.url)
            return Response(request.url, body=next(bodies), request=request)

    crawler.engine = _Engine()
    middleware = build_from_crawler(ExpiringRobotsTxtMiddleware, crawler)

    async def main() -> None:
        with pytest.raises(IgnoreRequest):
            await middleware.process_request(Request("http://shop.test/a"))
        await middleware.process_request(Request("http://shop.test/b"))  # the same copy
        await asyncio.sleep(0.4)
        await middleware.process_request(Request("http://shop.test/a"))  # the new copy
        with pytest.raises(IgnoreRequest):
            await middleware.process_request(Request("http://shop.test/b"))

    asyncio.run(main())
    assert fetched == ["http://shop.test/robots.txt"] * 2
    assert crawler.stats.get_value("robotstxt/expired") == 1
    assert crawler.stats.get_value("robotstxt/response_count") == 2


def test_the_addon_puts_the_expiring_robots_middleware_in_scrapys_place(
    redis_url: str, keyspace: KeySpace
) -> None:
    crawler = _crawler(redis_url, keyspace)
    middlewares = crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    loaded = build_component_list(middlewares)
    assert ExpiringRobotsTxtMiddleware in loaded
    assert RobotsTxtMiddleware not in loaded
    assert loaded.index(ExpiringRobotsTxtMiddleware) + 1 == loaded.index(RobotsCacheMiddleware)


def test_robots_cache_is_off_without_robotstxt_obey(redis_url: str, keyspace: KeySpace) -> None:
    crawler = _crawler(redis_url, keyspace, ROBOTSTXT_OBEY=False)
    with pytest.raises(NotConfigured):
        build_from_crawler(RobotsCacheMiddleware, crawler)


def test_protego_agrees_with_the_parser_scrapy_builds() -> None:
    body = "User-agent: *\nCrawl-delay: 0.5\n"
    parser = ProtegoRobotParser(body.encode(), None)
    assert parser.crawl_delay("fleetcrawl") == Protego.parse(body).crawl_delay("fleetcrawl")


# -- every Config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls",
    [SiteLimits, KeyTemplates, MonitorConfig, StatsFileConfig],
)
def test_a_config_read_from_empty_settings_is_its_defaults(cls: type) -> None:
    assert cls.from_settings(Settings()) == cls()


def test_robots_config_takes_scrapys_user_agent_and_the_fleets_concurrency() -> None:
    config = RobotsConfig.from_settings(Settings({"FRONTIER_SITE_CONCURRENCY": 5}))
    assert (config.max_age, config.lock_seconds, config.concurrency) == (86400.0, 30.0, 5)
    assert config.user_agent.startswith("Scrapy/")
    assert RobotsConfig.from_settings(Settings({"ROBOTSTXT_USER_AGENT": "me"})).user_agent == "me"


def test_frontier_config_defaults_and_what_it_computes() -> None:
    config = FrontierConfig.from_settings(Settings({"CONCURRENT_REQUESTS": 16}))
    assert config.lease_seconds == 60.0
    assert config.heartbeat_seconds == 15.0, "a quarter of the lease"
    assert config.limits == SiteLimits()
    assert config.limits.concurrency == 32
    assert config.node_id.count(":") == 2
    assert config.site_caps() == {"*": "0.0 32"}


def test_frontier_config_reads_the_settings_a_node_is_given(redis_url: str, keyspace) -> None:
    crawler = _crawler(
        redis_url,
        keyspace,
        FRONTIER_LEASE_SECONDS="8",
        FRONTIER_SITE_LIMITS='{"Shop.Test": {"rate": 2}}',
        CONCURRENT_REQUESTS=4,
    )
    config = FrontierConfig.from_settings(crawler.settings)
    assert (config.lease_seconds, config.heartbeat_seconds, config.concurrency) == (8.0, 2.0, 4)
    assert config.redis_url == redis_url
    assert config.site_caps()["shop.test"] == "2.0 0"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"FRONTIER_LEASE_SECONDS": 10, "FRONTIER_HEARTBEAT_SECONDS": 10}, "below"),
        ({"FRONTIER_BATCH_MAX": 0}, "FRONTIER_BATCH_MAX"),
        ({"FRONTIER_SITE_KEY": "path"}, "FRONTIER_SITE_KEY"),
        ({"FRONTIER_NODE_ID": "a\nb"}, "newline"),
        ({"FRONTIER_LEASE_SECONDS": "soon"}, "FRONTIER_LEASE_SECONDS"),
        ({"FRONTIER_SITE_CONCURRENCY": -1}, "FRONTIER_SITE_CONCURRENCY"),
        ({"FRONTIER_SITE_LIMITS": {"a": {"speed": 1}}}, "FRONTIER_SITE_LIMITS"),
        ({"FRONTIER_SITE_LIMITS": "not json"}, "FRONTIER_SITE_LIMITS"),
    ],
)
def test_frontier_config_refuses_what_cannot_work(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(NotConfigured, match=message):
        FrontierConfig.from_settings(Settings({"CONCURRENT_REQUESTS": 16, **settings}))


def test_retry_config_reads_codes_and_exceptions() -> None:
    config = RetryConfig.from_settings(
        Settings(
            {
                "RETRY_HTTP_CODES": "500,503",
                "RETRY_EXCEPTIONS": ["builtins.TimeoutError"],
            }
        )
    )
    assert (config.http_codes, config.exceptions) == ([500, 503], (TimeoutError,))
    with pytest.raises(NotConfigured, match="RETRY_HTTP_CODES"):
        RetryConfig.from_settings(Settings({"RETRY_HTTP_CODES": "5xx"}))


def test_key_templates_follow_the_scrapy_redis_settings() -> None:
    settings = Settings(
        {"SCHEDULER_QUEUE_KEY": "q:%(spider)s", "REDIS_START_URLS_KEY": "seeds:%(name)s"}
    )
    keys = FrontierKeys.from_settings(settings, "books")
    assert (keys.queue, keys.start_urls, keys.dupefilter) == (
        "q:books",
        "seeds:books",
        "books:dupefilter",
    )
    assert (keys.inflight, keys.site_index("a.test")) == ("books:inflight", "q:books|i|a.test")
    assert keys.site_list("a.test", "-10") == "q:books|p-10|a.test"


def test_every_config_of_a_node_is_read_from_the_add_ons_settings(
    redis_url: str, keyspace: KeySpace
) -> None:
    settings = _crawler(redis_url, keyspace).settings
    rendering = RenderingConfig.from_settings(settings)
    assert (rendering.max_contexts, rendering.max_pages_per_context) == (1, 6)
    assert MongoConfig.from_settings(settings, spider_name="products").database == "fleetcrawl"
    assert MonitorConfig.from_settings(settings).redis_url == redis_url
    assert FrontierKeys.from_settings(settings, "products") == keyspace.keys("products")


# -- Retry-After, bounded twice -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "action", "pause"),
    [
        ("99999999999", "dead", 60.0),  # would park the site for good: capped, dead at once
        ("7200", "dead", 60.0),  # over FRONTIER_RETRY_AFTER_MAX_WAIT (1 h)
        ("30", "retry", 30.0),
        ("soon", "retry", None),  # unparseable: as if absent
        ("Fri, 31 Dec 99999 23:59:59 GMT", "retry", None),
        ("", "retry", None),
    ],
)
def test_retry_after_is_bounded_and_garbage_is_ignored(
    redis_url: str, keyspace: KeySpace, header: str, action: str, pause: float | None
) -> None:
    middleware = build_from_crawler(FrontierRetryMiddleware, _crawler(redis_url, keyspace))
    request = _leased("http://shop.test/p")
    busy = Response(request.url, status=503, headers={"Retry-After": header}, request=request)
    with contextlib.suppress(IgnoreRequest):  # a dead letter ends the request here
        middleware.process_response(request, busy)
    outcome = request.meta[OUTCOME_META_KEY]
    assert outcome["action"] == action
    assert outcome.get("pause") == pause
    if action == "dead":
        assert "Retry-After" in outcome["error"]


# -- the frontier's enqueue path refuses what no node should fetch --------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///dev/zero", "scheme"),
        ("ftp://shop.test/x", "scheme"),
        ("data:,x", "scheme"),
        ("http:///nohost", "invalid"),  # Scrapy's Request refuses worse ones itself
        ("http://shop.test/" + "a" * 3000, "too_long"),
    ],
)
def test_the_scheduler_refuses_urls_no_node_should_fetch(
    redis_url: str, keyspace: KeySpace, url: str, reason: str
) -> None:
    crawler = _crawler(redis_url, keyspace)

    async def main() -> bool:
        scheduler = build_from_crawler(FleetScheduler, crawler)
        await maybe_deferred_to_future(scheduler.open(crawler.spider))
        try:
            return scheduler.enqueue_request(Request(url))
        finally:
            await maybe_deferred_to_future(scheduler.close("finished"))

    assert asyncio.run(main()) is False
    assert crawler.stats.get_value(f"frontier/refused/{reason}") == 1


def test_a_child_request_never_carries_its_pages_revisit_record(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace
) -> None:
    """A child made with meta=response.meta (or request.replace()) would carry its page's
    record and validators through Redis: its fetch would then judge the page's items gone by
    what the child yields, and send the page's ETag for another URL."""
    from project.frontier.meta import REVISIT_META_KEY
    from project.frontier.site_queues import queued_requests

    crawler = _crawler(redis_url, keyspace, FRONTIER_FOLLOW="any")
    record = {"etag": '"v1"', "items": [["products", "http://shop.test/product/1"]], "t": 5.0}
    child = Request("http://shop.test/product/2", meta={REVISIT_META_KEY: record},
                    headers={"If-None-Match": '"v1"'})  # fmt: skip

    async def main() -> bool:
        scheduler = build_from_crawler(FleetScheduler, crawler)
        await maybe_deferred_to_future(scheduler.open(crawler.spider))
        try:
            return scheduler.enqueue_request(child)  # sent by the close's last step
        finally:
            await maybe_deferred_to_future(scheduler.close("finished"))

    assert asyncio.run(main()) is True
    keys = keyspace.keys("products")
    ((payload, _),) = queued_requests(redis_client, keys, "shop.test")
    assert b"revisit" not in payload
    assert b"If-None-Match" not in payload
    assert b"v1" not in payload


def test_fast_discovery_settles_every_lease_without_a_reap(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, make_shop
) -> None:
    """A backlog of discovered requests never holds acks back until their leases expire:
    settlements go with the round trip that sends their children, and
    the leases that wait for it keep their heartbeats."""
    shop = make_shop(products=150)
    crawler = _seeded_crawl(
        redis_url,
        redis_client,
        keyspace,
        shop,
        FRONTIER_BATCH_MAX=3,
        FRONTIER_LEASE_SECONDS=1.5,
        FRONTIER_HEARTBEAT_SECONDS=0.3,
        CONCURRENT_REQUESTS=8,
    )
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert stats.get("frontier/reaped", 0) == 0
    assert len(shop.stats()["product_hits"]) == 150
    assert max(shop.stats()["hits"].values()) == 1, "a page was fetched twice"


# -- FRONTIER_SITE_KEY = "ip": limits are written under the names leases are read by -----------------


def test_ip_mode_writes_site_limits_and_crawl_delay_under_addresses(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys
) -> None:
    crawler = _crawler(
        redis_url,
        keyspace,
        FRONTIER_SITE_KEY="ip",
        FRONTIER_SITE_LIMITS={"localhost:8080": {"rate": 2, "concurrency": 3}},
        FRONTIER_ALLOWED_SITES=["localhost:8081"],
    )

    async def main() -> None:
        scheduler = build_from_crawler(FleetScheduler, crawler)
        await maybe_deferred_to_future(scheduler.open(crawler.spider))
        await scheduler._connect(crawler.spider)  # what spider_opened does
        robots = build_from_crawler(RobotsCacheMiddleware, crawler)
        robots.spider_opened(crawler.spider)
        body = b"User-agent: *\nCrawl-delay: 4\n"
        await robots.robots_parsed(
            ProtegoRobotParser(body, None), Request("http://localhost:8082/x")
        )
        await robots.spider_closed(crawler.spider)
        await maybe_deferred_to_future(scheduler.close("finished"))

    asyncio.run(main())
    assert redis_client.hget(keys.limits, "127.0.0.1:8080") == b"2.0 3"
    assert redis_client.hget(keys.limits, "localhost:8080") is None
    assert redis_client.hget(keys.limits, "127.0.0.1:8082") == b"0.25 32"
    assert redis_client.smembers(keys.allowed) == {b"127.0.0.1:8081"}


class _UnstorablePipeline:
    """A store that cannot take product 7, as a full disk or a broken server would refuse it."""

    def process_item(self, item):
        if str(getattr(item, "url", "")).endswith("/product/7"):
            raise OSError(28, "No space left on device")
        return item


def test_a_page_whose_item_was_not_stored_is_retried_not_acked(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys, make_shop
) -> None:
    """A pipeline error is not an ack: the page is retried, then dead-lettered."""
    shop = make_shop(products=20)
    crawler = _seeded_crawl(
        redis_url,
        redis_client,
        keyspace,
        shop,
        ITEM_PIPELINES={_UnstorablePipeline: 300, **IN_PROCESS["ITEM_PIPELINES"]},
        RETRY_TIMES=1,
        FRONTIER_RETRY_BACKOFF_BASE=0.1,
    )
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert stats["frontier/item_errors"] == 2, "the first fetch and its one retry"
    assert shop.stats()["product_hits"]["7"] == 2
    (record,) = [json.loads(raw) for raw in redis_client.lrange(keys.dead, 0, -1)]
    assert record["url"].endswith("/product/7")
    assert record["error"].startswith("item not stored: OSError")
    assert stats["item_scraped_count"] == 19


def test_a_huge_robots_txt_is_cut_before_it_is_parsed_or_shared(
    redis_url: str, redis_client: redis.Redis, keyspace: KeySpace, keys: FrontierKeys
) -> None:
    """A robots.txt of any size costs at most FRONTIER_ROBOTSTXT_MAX_BYTES, in Redis and parsed."""
    crawler = _crawler(redis_url, keyspace, FRONTIER_ROBOTSTXT_MAX_BYTES=1000)

    async def main() -> Response:
        middleware = build_from_crawler(RobotsCacheMiddleware, crawler)
        middleware.spider_opened(crawler.spider)
        asked = Request("http://shop.test/robots.txt", meta={"dont_obey_robotstxt": True})
        assert await middleware.process_request(asked) is None
        huge = b"User-agent: *\nDisallow: /a\n" + b"# padding\n" * 100_000
        answer = await middleware.process_response(asked, Response(asked.url, body=huge))
        await middleware.spider_closed(crawler.spider)
        return answer

    answer = asyncio.run(main())
    assert len(answer.body) == 1000, "Scrapy's RobotsTxtMiddleware parses the cut copy"
    assert answer.body.startswith(b"User-agent: *\nDisallow: /a\n")
    assert len(json.loads(redis_client.hget(keys.robots, "shop.test"))["body"]) == 1000
    assert crawler.stats.get_value("robotstxt/truncated") == 1
