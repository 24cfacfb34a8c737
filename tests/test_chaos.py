"""Chaos: nodes killed with kill -9, Redis and MongoDB restarted, at random moments of one crawl.

Each round is one crawl of the test shop by three nodes with a schedule of faults drawn
from a seeded random generator (the seed is printed, so a failing round can be replayed).
Every round must store every product exactly once. ``CHAOS_ROUNDS`` sets the number of
rounds: 1 in the suite (CI), more on demand (``CHAOS_ROUNDS=10 pytest tests/test_chaos.py``);
``CHAOS_SEED`` the first round's seed (1000).
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from project.ops.services import start_mongo, start_redis, stop_service
from tests.fleet import wait_for

if TYPE_CHECKING:
    from project.ops.services import ServicesConfig
    from tests.fleet import Fleet

pytestmark = pytest.mark.crawl

ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
FIRST_SEED = int(os.environ.get("CHAOS_SEED", "1000"))
PRODUCTS = 300


def _faults(rng: random.Random) -> list[tuple[float, str]]:
    """When, in seconds from the seed, each fault strikes: two kills and one of each restart."""
    kinds = ["kill", "kill", "redis", "mongo"]
    rng.shuffle(kinds)
    moments = sorted(rng.uniform(1.0, 9.0) for _ in kinds)
    return list(zip(moments, kinds, strict=True))


def _alive(fleet: Fleet) -> list[int]:
    return [i for i, proc in enumerate(fleet.procs) if proc.poll() is None]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_kill_9_and_restarts_at_random_moments_lose_and_duplicate_nothing(
    fleet: Fleet, make_shop, mongo, services: ServicesConfig, tmp_path, round_: int
) -> None:
    seed = FIRST_SEED + round_
    rng = random.Random(seed)
    faults = _faults(rng)
    print(f"chaos round {round_}: seed {seed}, faults {faults}")
    shop = make_shop(products=PRODUCTS, latency_ms=40)
    # One journal folder for the fleet: a node started after a kill adopts the dead one's slot.
    fleet.settings = {"MONGO_JOURNAL_DIR": str(tmp_path / "journal"), "FRONTIER_IDLE_GRACE": 2.0}
    for _ in range(3):
        fleet.start_node()
    fleet.seed(shop.url("/"))
    started = time.monotonic()
    for moment, kind in faults:
        time.sleep(max(0.0, started + moment - time.monotonic()))
        if kind == "kill":
            alive = _alive(fleet)
            if alive:
                fleet.kill(rng.choice(alive))
                fleet.start_node()  # the fleet keeps three nodes
        elif kind == "redis":
            stop_service(services, "redis")
            time.sleep(rng.uniform(0.5, 2.0))
            start_redis(services)
        else:
            stop_service(services, "mongo")
            time.sleep(rng.uniform(0.5, 3.0))
            start_mongo(services)
    # The survivors finish the crawl; killed nodes exited with -9.
    for index in _alive(fleet):
        try:
            code = fleet.procs[index].wait(240)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"node{index} {code} (seed {seed}):\n{fleet.log(index)[-4000:]}"

    def stored() -> bool:
        return mongo.products.count_documents({}) == PRODUCTS

    wait_for(stored, 30, f"{PRODUCTS} products in MongoDB (seed {seed})", 0.5)
    skus = [doc["sku"] for doc in mongo.products.find({}, {"sku": 1})]
    assert len(skus) == len(set(skus)) == PRODUCTS, f"lost or duplicated (seed {seed})"
    assert set(skus) == {p["sku"] for p in shop.catalogue()["products"]}
    assert len(shop.stats()["product_hits"]) == PRODUCTS
