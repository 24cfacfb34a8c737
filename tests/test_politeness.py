"""Politeness across the fleet, measured by the shop on the server side."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pymongo
import pytest
import redis

from project.monitoring.status import frontier_snapshot
from tests.fleet import WAIT_FOR_SEED, Fleet, KeySpace, wait_for

if TYPE_CHECKING:
    from tests.site.server import ShopServer

pytestmark = pytest.mark.crawl


def _steady_rates(shop: ShopServer) -> list[int]:
    """Requests received per second, without the partial first and last seconds."""
    per_second = {int(k): v for k, v in shop.stats()["per_second"].items()}
    if not per_second:
        return []
    first, last = min(per_second), max(per_second)
    return [per_second.get(second, 0) for second in range(first + 1, last)]


@pytest.mark.slow("the fleet's rate is read at the shop over at least ten whole seconds")
def test_fleet_rate_limit_holds_across_three_nodes(fleet: Fleet, make_shop, redis_url) -> None:
    limit = 20
    shop = make_shop(products=400, latency_ms=20)
    fleet.seed(shop.url("/"))
    for _ in range(3):
        fleet.start_node(FRONTIER_SITE_RATE=limit)
    assert fleet.wait(120) == [0, 0, 0]

    rates = _steady_rates(shop)
    print(f"server-side requests/s with a fleet limit of {limit}: {rates}")
    assert len(rates) >= 10
    assert max(rates) <= limit * 1.1 + 1, rates
    # Never above; below by what starved nodes lose under the suite's load: a node that
    # wakes late loses the tokens past FRONTIER_BURST_SECONDS (0.1 s, two tokens here).
    assert limit * 0.8 <= statistics.mean(rates) <= limit * 1.05, rates
    # Whichever node asks first when tokens come due gets them: the split varies, but all work.
    assert all(fleet.stat(i, "frontier/dispatched") > 0 for i in range(3))
    with redis.Redis.from_url(redis_url) as client:
        (site,) = frontier_snapshot(client, fleet.keys)["sites"]
    assert site["site"] == urlsplit(shop.url("/")).netloc
    assert site["allowed_rate"] == limit
    assert site["leases"] == shop.stats()["total"] - 1  # robots.txt is not leased


def test_per_process_delays_alone_take_the_fleet_above_the_limit(fleet: Fleet, make_shop) -> None:
    limit = 20
    shop = make_shop(products=300, latency_ms=20)
    for _ in range(3):
        fleet.start_node(
            FRONTIER_SITE_RATE=0,
            DOWNLOAD_DELAY=1 / limit,
            RANDOMIZE_DOWNLOAD_DELAY=False,
            CONCURRENT_REQUESTS_PER_DOMAIN=1,
            **WAIT_FOR_SEED,
        )
    # the three crawl from the first second: one that starts late is not one process fewer
    fleet.wait_ready()
    fleet.seed(shop.url("/"))
    assert fleet.wait(120) == [0, 0, 0]
    rates = _steady_rates(shop)
    print(f"server-side requests/s with per-process delays of 1/{limit} s: {rates}")
    # About three times the limit on an idle machine. The suite's load lowers the mean (one
    # fresh clone: 19 of 20/s, its later seconds 9-17 while other crawls ran): what the
    # per-process delays cannot prevent is the seconds the fleet spends above the limit.
    assert max(rates) >= 1.5 * limit, rates
    assert sum(rate > limit for rate in rates) >= 2, rates


@pytest.mark.slow("two fleets crawl at once: a site alone, and its copy beside a throttled site")
def test_a_throttled_site_does_not_slow_the_other(
    fleet: Fleet, make_shop, redis_client, services, mongo_db, tmp_path
) -> None:
    # Two fleets at once, so the suite's load slows both alike: one crawls a site alone,
    # the other a copy of it beside a site throttled to 2 requests/s.
    slow = make_shop(products=100, latency_ms=10)
    fast_alone = make_shop(products=500, latency_ms=30)
    fast = make_shop(products=500, latency_ms=30)
    slow_site = urlsplit(slow.url("/")).netloc
    solo = Fleet(
        redis_url=fleet.redis_url,
        mongo_url=fleet.mongo_url,
        mongo_db=f"{mongo_db}_solo",
        log_dir=tmp_path / "solo",
        space=KeySpace(),
    )
    (tmp_path / "solo").mkdir()
    limits = {slow_site: {"rate": 2}}
    try:
        for _ in range(2):
            solo.start_node(**WAIT_FOR_SEED)
            fleet.start_node(FRONTIER_SITE_LIMITS=limits, **WAIT_FOR_SEED)
        solo.wait_ready()
        fleet.wait_ready()
        started = time.monotonic()
        solo.seed(fast_alone.url("/"))
        fleet.seed(slow.url("/"), fast.url("/"))
        done: dict[str, float] = {}

        def both_done() -> bool:
            for name, shop in (("alone", fast_alone), ("together", fast)):
                if name not in done and len(shop.stats()["product_hits"]) == 500:
                    done[name] = time.monotonic() - started
            return len(done) == 2

        wait_for(both_done, 120, "both fast sites", 0.2)
        assert solo.wait(60) == [0, 0]
        # the fast site may be done within a few seconds of the slow one's first request: the
        # slow one's rate is read over at least three whole seconds
        wait_for(lambda: len(_steady_rates(slow)) >= 3, 30, "three seconds of the slow site", 0.2)
        fleet.stop()
    finally:
        solo.stop()
        solo.space.delete(redis_client)
        with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as client:
            client.drop_database(solo.mongo_db)

    print(f"fast site alone {done['alone']:.1f} s, beside a throttled one {done['together']:.1f} s")
    assert done["together"] <= done["alone"] * 1.5 + 2, done
    # 2/s with a bucket of one token: at most 1 + 2 a second by grant time; a request granted
    # late in a second and slowed by the suite's load arrives in the next (one suite run saw
    # 4 in a second), so each second is held to twice the rate and the window to the rate
    rates = _steady_rates(slow)
    assert max(rates) <= 4, rates
    assert sum(rates) <= 2 * len(rates) + 3, rates
    assert len(slow.stats()["product_hits"]) < 100, "the slow site cannot be done yet"


def test_crawl_delay_is_honoured_fleet_wide(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=40, robots_crawl_delay=0.25)
    fleet.seed(shop.url("/"))
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0]

    stats = shop.stats()
    assert stats["hits"]["/robots.txt"] == 1, "robots.txt is fetched once per fleet"
    rates = _steady_rates(shop)
    assert max(rates) <= 4 * 1.1 + 1, rates
    assert statistics.mean(rates) <= 4 * 1.1, rates
    assert len(stats["product_hits"]) == 40


def test_retry_after_pauses_the_site_for_every_node(fleet: Fleet, make_shop) -> None:
    shop = make_shop(products=100, latency_ms=10, retry_after_burst=4, retry_after=3)
    fleet.seed(shop.url("/"))
    fleet.start_node()
    fleet.start_node()
    assert fleet.wait(120) == [0, 0]

    stats = shop.stats()
    assert stats["statuses"]["429"] == 4
    per_second = {int(k): v for k, v in stats["per_second"].items()}
    seconds = range(min(per_second), max(per_second) + 1)
    silent = [s for s in seconds if per_second.get(s, 0) == 0]
    assert silent, f"no pause in {per_second}"
    assert len(stats["product_hits"]) == 100
    paused = sum(fleet.stat(i, "frontier/site_paused") for i in (0, 1))
    assert paused >= 1


def test_per_ip_limit_covers_every_host_name_of_a_server(fleet: Fleet, make_shop) -> None:
    limit = 20
    shop = make_shop(products=100, latency_ms=10)
    port = urlsplit(shop.url("/")).port
    # Two names of one server: by domain they would get 20 requests/s each.
    fleet.seed(f"http://localhost:{port}/", f"http://127.0.0.1:{port}/")
    fleet.start_node(FRONTIER_SITE_KEY="ip", FRONTIER_SITE_RATE=limit)
    fleet.start_node(FRONTIER_SITE_KEY="ip", FRONTIER_SITE_RATE=limit)
    assert fleet.wait(120) == [0, 0]

    rates = _steady_rates(shop)
    assert max(rates) <= limit * 1.1 + 1, rates
    assert shop.stats()["total"] > 200, "both host names were crawled"


@pytest.mark.slow("the adaptive rate climbs from 2/s over a 150-product crawl at 100 ms")
def test_adaptive_rate_follows_the_fleets_latency(fleet: Fleet, make_shop, redis_client) -> None:
    shop = make_shop(products=150, latency_ms=100)
    site = urlsplit(shop.url("/")).netloc
    adaptive = {
        "FRONTIER_AUTOTHROTTLE_ENABLED": True,
        "FRONTIER_AUTOTHROTTLE_TARGET_CONCURRENCY": 2,
        "FRONTIER_AUTOTHROTTLE_START_RATE": 2,
    }
    fleet.seed(shop.url("/"))
    fleet.start_node(**adaptive)
    fleet.start_node(**adaptive)
    assert fleet.wait(120) == [0, 0]

    # Target concurrency 2 over ~0.1 s latency: about 20 requests/s, from a start at 2.
    rate = float(redis_client.hget(fleet.keys.rates, site))
    assert 6 < rate <= 25, rate
    assert max(_steady_rates(shop)) <= 25 * 1.1 + 1
