"""Real services for the suite: Redis, a MongoDB-protocol server, the test shop."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis

from project.ops.services import (
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    stop_service,
)
from tests import forkserver
from tests.fleet import Fleet, KeySpace
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from project.frontier.keys import FrontierKeys


#: Fixtures that start real processes besides the session's services: a test that uses one
#: is a ``crawl`` test (left out of ``make test-fast``).
_PROCESS_FIXTURES = frozenset({"fleet", "make_shop", "scrapyds", "two_crawls"})
#: A test that takes longer carries ``slow`` with the reason (make test prints the others).
SLOW_SECONDS = 20.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is not None and not (marker.args or marker.kwargs.get("reason")):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow needs a reason")
        if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.crawl)


_over: list[tuple[float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
        _over.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _over:
        terminalreporter.section(f"over {SLOW_SECONDS:.0f} s without a slow marker")
        for duration, nodeid in sorted(_over, reverse=True):
            terminalreporter.line(f"{duration:6.1f}s {nodeid}")


@pytest.fixture(scope="session", autouse=True)
def forked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Nodes, shops and commands forked from a warm interpreter (tests/forkserver.py);
    ``FLEET_TESTS_FORK=0`` starts each with its own interpreter instead."""
    if os.environ.get("FLEET_TESTS_FORK", "1") == "0":
        yield
        return
    with forkserver.serve(tmp_path_factory.mktemp("fork")):
        yield


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServicesConfig]:
    """A private Redis and FerretDB for the whole run, on free ports."""
    cfg = ServicesConfig(
        state_dir=tmp_path_factory.mktemp("state"),
        redis_port=free_port(),
        mongo_port=free_port(),
    )
    start_redis(cfg)
    try:
        start_mongo(cfg)
        yield cfg
    finally:
        stop_service(cfg, "mongo")
        stop_service(cfg, "redis")


@pytest.fixture
def redis_url(services: ServicesConfig) -> str:
    """The test Redis, shared by every test: each works in its own :func:`keyspace`."""
    return services.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def keyspace(redis_client: redis.Redis) -> Iterator[KeySpace]:
    """This test's own Redis keys (a prefix in every key template), deleted afterwards."""
    space = KeySpace()
    yield space
    space.delete(redis_client)


@pytest.fixture
def keys(keyspace: KeySpace) -> FrontierKeys:
    """The ``products`` spider's keys in this test's key space."""
    return keyspace.keys("products")


@pytest.fixture
def mongo_db(services: ServicesConfig) -> Iterator[str]:
    """A database of its own for each test, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as client:
        client.drop_database(name)


@pytest.fixture
def mongo(services: ServicesConfig, mongo_db: str) -> Iterator[pymongo.database.Database[Any]]:
    with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as client:
        yield client[mongo_db]


@pytest.fixture
def make_shop() -> Iterator[Callable[..., ShopServer]]:
    """Start test shops with given options; all are stopped after the test."""
    shops: list[ShopServer] = []

    def make(products: int = 200, **options: Any) -> ShopServer:
        shop = ShopServer(products, **options).start()
        shops.append(shop)
        return shop

    yield make
    for shop in shops:
        shop.stop()


@pytest.fixture
def fleet(
    services: ServicesConfig, redis_url: str, mongo_db: str, tmp_path: Path, keyspace: KeySpace
) -> Iterator[Fleet]:
    """Crawler nodes as real ``scrapy crawl`` processes; killed if still running."""
    crew = Fleet(
        redis_url=redis_url,
        mongo_url=services.mongo_url,
        mongo_db=mongo_db,
        log_dir=tmp_path,
        space=keyspace,
    )
    yield crew
    crew.stop()
