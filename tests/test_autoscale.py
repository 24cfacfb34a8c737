"""``fleetcrawl autoscale`` on two real scrapyd servers: jobs follow the crawl's useful nodes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from project.ops.autoscale import Jobs, counted, decide
from project.ops.scrapyd import ScrapydNode
from tests.fleet import FAST_SETTINGS, ROOT, wait_for
from tests.test_deploy import PASSWORD, USER, fleetcrawl, scrapyds  # noqa: F401 (a fixture)


def test_decide_starts_at_once_and_stops_after_the_cooldown() -> None:
    assert decide(5, 1, least=0, most=3, since_change=0.0, cooldown=60) == 2  # up to --max
    assert decide(0, 0, least=1, most=3, since_change=0.0, cooldown=60) == 1  # --min
    assert decide(1, 3, least=0, most=3, since_change=10.0, cooldown=60) == 0  # cooling down
    assert decide(1, 3, least=0, most=3, since_change=60.0, cooldown=60) == -2
    assert decide(2, 2, least=0, most=3, since_change=999.0, cooldown=60) == 0


def test_a_node_that_cannot_be_asked_counts_the_nodes_the_frontier_sees_alive() -> None:
    """Its jobs may still run: counted as none, the autoscaler would start them again."""
    node = ScrapydNode.parse("http://127.0.0.1:1")
    listed = [Jobs(node, running=["a", "b"]), Jobs(node, pending=["c"])]
    assert counted(listed, alive=5) == 3  # every node answered: what they list
    assert counted([*listed, Jobs(node, reachable=False)], alive=5) == 5
    assert counted([*listed, Jobs(node, reachable=False)], alive=1) == 3


@pytest.mark.crawl
@pytest.mark.slow("two scrapyd servers, a scale-out, then a cool-down before the scale-in")
def test_jobs_scale_out_for_many_sites_and_in_for_one_capped_site(
    scrapyds,  # noqa: F811
    redis_url,
    mongo_db,
    mongo,
    make_shop,
    keyspace,
    keys,
    redis_client,
) -> None:
    """Five sites, one download at a time each, one a job: the jobs go up to --max 3; once
    only the big site is left, one job is useful and the others are stopped (SIGTERM, their
    leases handed back). Every product is stored once."""
    a, b = scrapyds
    nodes = f"{a.url},{b.url}"
    assert fleetcrawl("deploy", nodes=nodes).returncode == 0
    small = [make_shop(products=12, latency_ms=300, seed=i) for i in range(4)]
    big = make_shop(products=80, latency_ms=300, seed=9)
    shops = [*small, big]
    redis_client.lpush(keys.start_urls, *[shop.url("/") for shop in shops])
    settings = {
        **FAST_SETTINGS,
        **keyspace.settings,
        "MONGO_DATABASE": mongo_db,
        "CONCURRENT_REQUESTS": 1,
        "FRONTIER_SITE_CONCURRENCY": 1,
        "MONITOR_INTERVAL": 0.5,
    }
    options = [arg for key, value in settings.items() for arg in ("-s", f"{key}={value}")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEETCRAWL_NODES": nodes,
           "SCRAPYD_USERNAME": USER, "SCRAPYD_PASSWORD": PASSWORD, "REDIS_URL": redis_url}  # fmt: skip
    command = [sys.executable, "-m", "project.ops.cli", "autoscale", "products", "--min", "0",
               "--max", "3", "--interval", "1", "--cooldown", "3", "--rounds", "150", *options]  # fmt: skip
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as scaler:
        try:
            total = 4 * 12 + 80
            wait_for(lambda: mongo.products.count_documents({}) >= total, 150, "every product")
            time.sleep(2)  # the last look: nothing useful
        finally:
            scaler.terminate()
        output = scaler.communicate(timeout=30)[0]
    print(output)
    looks = re.findall(
        r"useful (\d+) \(\d+ downloads at once\), jobs (\d+): (started|stopped|-)", output
    )
    assert looks, output
    jobs = [int(n) for _, n, _ in looks]
    assert max(jobs) == 3, "out to --max while five sites had work"
    first_full = jobs.index(3)
    assert min(jobs[first_full:]) <= 1, "in again once only the capped site was left"
    assert "stopped" in output
    assert mongo.products.count_documents({}) == 4 * 12 + 80
    for shop in shops:
        assert set(shop.stats()["product_hits"].values()) == {1}, "a product fetched twice"
