"""Real Redis and FerretDB processes started through project.ops.services."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
import pytest
import redis
from bson import ObjectId

from project.ops.install import FERRETDB_BUILD, ensure_ferretdb, ensure_redis_server
from project.ops.services import (
    SERVICE_NAMES,
    ServiceError,
    ServicesConfig,
    free_port,
    start_mongo,
    start_redis,
    status,
    stop_service,
)
from project.ops.services_cli import main
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pymongo.collection import Collection

    from project.ops.services import ServiceInfo

START = {"redis": start_redis, "mongo": start_mongo}
PID_FILES = {"redis": "redis/redis.pid", "mongo": "ferretdb/ferretdb.pid"}


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return Path(f"/proc/{pid}").exists()


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[ServicesConfig]:
    config = ServicesConfig(
        state_dir=tmp_path / "state", redis_port=free_port(), mongo_port=free_port()
    )
    yield config
    for name in SERVICE_NAMES:
        with contextlib.suppress(ServiceError):
            stop_service(config, name)


@pytest.fixture
def spawned() -> Iterator[list[int]]:
    """Pids to kill at teardown if a test failed before stopping them."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is neither redis-server nor ferretdb."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _redis_ping(url: str) -> bool:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        return bool(client.ping())


def _start(cfg: ServicesConfig, name: str, spawned: list[int]) -> ServiceInfo:
    info = START[name](cfg)
    spawned.append(info.pid)
    return info


def test_redis_answers_and_second_start_is_idempotent(
    cfg: ServicesConfig, spawned: list[int]
) -> None:
    info = _start(cfg, "redis", spawned)
    assert info.url == f"redis://127.0.0.1:{cfg.redis_port}/0"
    assert _redis_ping(info.url)
    config = (cfg.state_dir / "redis" / "redis.conf").read_text()
    assert "appendonly yes" in config
    assert "bind 127.0.0.1" in config
    again = start_redis(cfg)
    assert again.pid == info.pid
    assert (cfg.state_dir / "redis" / "redis.pid").read_text().strip() == str(info.pid)


def test_redis_password_stays_private(
    tmp_path: Path, spawned: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    secret = 's3cr et"@/x'
    cfg = ServicesConfig(tmp_path / "state", redis_port=free_port(), redis_password=secret)
    caplog.set_level(logging.DEBUG, logger="project.ops.services")
    try:
        info = _start(cfg, "redis", spawned)
        config_file = cfg.state_dir / "redis" / "redis.conf"
        assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
        assert secret.encode() not in Path(f"/proc/{info.pid}/cmdline").read_bytes()
        assert _redis_ping(info.url)
        with pytest.raises(redis.AuthenticationError):
            _redis_ping(f"redis://127.0.0.1:{cfg.redis_port}/0")
        assert "s3cr" not in mask_url(info.url)
        assert start_redis(cfg).pid == info.pid
    finally:
        stop_service(cfg, "redis")
    assert "s3cr" not in caplog.text
    assert "s3cr" not in repr(cfg)


def test_mongo_round_trip_and_second_start_is_idempotent(
    cfg: ServicesConfig, spawned: list[int]
) -> None:
    info = _start(cfg, "mongo", spawned)
    assert info.url == f"mongodb://127.0.0.1:{cfg.mongo_port}/"
    assert info.data_dir == cfg.state_dir / "ferretdb" / "data"
    client: pymongo.MongoClient[dict[str, Any]]
    with pymongo.MongoClient(info.url, serverSelectionTimeoutMS=5000) as client:
        collection: Collection[dict[str, Any]] = client["fleetcrawl_test"]["items"]
        collection.insert_one({"_id": "a", "price": 3})
        assert collection.find_one({"_id": "a"}) == {"_id": "a", "price": 3}
    assert start_mongo(cfg).pid == info.pid


def test_the_embedded_mongodb_finds_and_updates_by_id_through_its_index(
    services: ServicesConfig, mongo_db: str
) -> None:
    """The patched FerretDB build (project/ops/ferretdb/fleetcrawl_id.go): a filter's ``_id``,
    alone, in a ``$in`` or beside other fields, is searched in the ``_id`` index, so storing an
    item costs the same at 10^6 documents as at 10^4; other filters still scan."""
    with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as client:
        database = client[mongo_db]
        database.items.insert_many([{"_id": f"k{n}", "v": n} for n in range(20)])

        def plan(query: dict[str, Any]) -> str:
            explained = database.command("explain", {"find": "items", "filter": query})
            return " ".join(explained["queryPlanner"]["Plan"])

        for query in ({"_id": "k1"}, {"_id": {"$in": ["k1", "k2"]}}, {"_id": "k3", "v": 3}):
            assert "USING INDEX" in plan(query), query
        assert "SCAN" in plan({"v": 1})
        # what an index search brings back is still filtered whole
        found = list(database.items.find({"_id": {"$in": ["k1", "k2", "k9"]}, "v": {"$gt": 1}}))
        assert sorted(doc["_id"] for doc in found) == ["k2", "k9"]
        update = database.items.update_many({"_id": {"$in": ["k4", "k5"]}}, {"$set": {"w": 1}})
        assert update.modified_count == 2
        assert database.items.count_documents({"w": 1}) == 2
    version = subprocess.run(
        [str(ensure_ferretdb()), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"version: {FERRETDB_BUILD}" in version


def test_the_embedded_mongodb_pages_by_id_in_mongodbs_order_through_an_index(
    services: ServicesConfig, mongo_db: str
) -> None:
    """The patched build (project/ops/ferretdb/fleetcrawl_order.go): a keyset page, a range of
    strings on ``_id`` sorted by ``_id``, is searched and sorted in an index of ``_id`` as
    text, in MongoDB's order (UTF-8 bytes, whatever JSON escapes), with other fields filtered
    and ids of other types left out."""
    rng = random.Random(7)
    ids = {
        "k" + "".join(rng.choice('a&<>!"\\ é€z/?=') for _ in range(rng.randint(0, 6)))
        for _ in range(600)
    }
    with pymongo.MongoClient(services.mongo_url, serverSelectionTimeoutMS=5000) as client:
        items = client[mongo_db].items
        items.insert_many([{"_id": key, "odd": n % 2} for n, key in enumerate(sorted(ids))])
        # other types: ObjectIds (FerretDB stores them as hex text, which sorts first), a
        # number, a document
        others: list[dict[str, Any]] = [{"_id": ObjectId(), "odd": 1} for _ in range(40)]
        items.insert_many([*others, {"_id": 5, "odd": 1}, {"_id": {"k": 1}, "odd": 1}])
        expected = sorted(ids, key=str.encode)
        for query, size, want in (({}, 37, expected), ({"odd": 1}, 23, expected[1::2])):
            got: list[str] = []
            last = ""
            while page := list(
                items.find({"_id": {"$gt": last}, **query}).sort("_id", 1).limit(size)
            ):
                got += [doc["_id"] for doc in page]
                last = got[-1]
            assert got == sorted(want, key=str.encode)
        newest = items.find({"_id": {"$lt": "\U0010ffff"}}).sort("_id", -1).limit(3)
        assert [doc["_id"] for doc in newest] == expected[::-1][:3]
        explained = client[mongo_db].command(
            "explain", {"find": "items", "filter": {"_id": {"$gt": "k"}}, "sort": {"_id": 1}}
        )
    assert "USING INDEX" in " ".join(explained["queryPlanner"]["Plan"])


def test_status_reports_running_and_stopped(cfg: ServicesConfig, spawned: list[int]) -> None:
    assert {name: found.state for name, found in status(cfg).items()} == {
        "redis": "stopped",
        "mongo": "stopped",
    }
    pids = {name: _start(cfg, name, spawned).pid for name in SERVICE_NAMES}
    report = status(cfg)
    for name in SERVICE_NAMES:
        assert report[name].running
        assert report[name].pid == pids[name]
        assert str(report[name]).startswith(f"{name}: running pid {pids[name]} at ")


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_stop_kills_and_second_stop_is_clean(
    cfg: ServicesConfig, spawned: list[int], name: str
) -> None:
    pid = _start(cfg, name, spawned).pid
    assert stop_service(cfg, name) is True
    assert not _alive(pid)
    assert not (cfg.state_dir / PID_FILES[name]).exists()
    assert stop_service(cfg, name) is False
    assert status(cfg)[name].state == "stopped"


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_stale_pidfile_of_dead_process_is_replaced(
    cfg: ServicesConfig, spawned: list[int], name: str
) -> None:
    probe = subprocess.Popen(["true"])
    probe.wait()
    pid_file = cfg.state_dir / PID_FILES[name]
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{probe.pid}\n")
    assert status(cfg)[name].state == "stale pidfile"
    info = _start(cfg, name, spawned)
    assert info.pid != probe.pid
    assert pid_file.read_text().strip() == str(info.pid)


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_stale_pidfile_of_foreign_process_is_left_alone(
    cfg: ServicesConfig, spawned: list[int], sleeper: subprocess.Popen[bytes], name: str
) -> None:
    pid_file = cfg.state_dir / PID_FILES[name]
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{sleeper.pid}\n")
    assert stop_service(cfg, name) is False
    assert sleeper.poll() is None
    assert not pid_file.exists()
    pid_file.write_text(f"{sleeper.pid}\n")
    info = _start(cfg, name, spawned)
    assert info.pid != sleeper.pid
    assert sleeper.poll() is None


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_port_taken_by_another_process(cfg: ServicesConfig, name: str) -> None:
    port = cfg.redis_port if name == "redis" else cfg.mongo_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(ServiceError, match=rf"port {port} on 127\.0\.0\.1 is already in use"):
            START[name](cfg)
    assert not (cfg.state_dir / PID_FILES[name]).exists()


def _break_redis(state_dir: Path) -> None:
    # A file where Redis wants its AOF folder.
    (state_dir / "redis").mkdir(parents=True)
    (state_dir / "redis" / "appendonlydir").write_text("not a folder")


def _break_ferretdb(state_dir: Path) -> None:
    (state_dir / "ferretdb" / "data").mkdir(parents=True)
    (state_dir / "ferretdb" / "data" / "crawl.sqlite").write_text("not a database")


@pytest.mark.parametrize(("name", "breaker"), [("redis", _break_redis), ("mongo", _break_ferretdb)])
def test_startup_failure_reports_the_log(
    cfg: ServicesConfig, name: str, breaker: Callable[[Path], None]
) -> None:
    breaker(cfg.state_dir)
    with pytest.raises(ServiceError, match="exited before answering") as caught:
        START[name](cfg)
    assert "last lines of" in str(caught.value)
    assert "fleetcrawl services: starting" not in str(caught.value)
    assert len(str(caught.value).splitlines()) > 1
    assert not (cfg.state_dir / PID_FILES[name]).exists()


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:secret@h:1/0", "redis://:***@h:1/0"),
        ("mongodb://u:p@h/", "mongodb://u:***@h/"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("mongodb://user@h:27017/db", "mongodb://user@h:27017/db"),
        ("rediss://default:p%40ss@h:6380/1", "rediss://default:***@h:6380/1"),
        (
            "mongodb://u:pa@ss/w@h1:1,h2:2/db?replicaSet=rs",
            "mongodb://u:***@h1:1,h2:2/db?replicaSet=rs",
        ),
        ("redis://h:1/0?password=x&db=2", "redis://h:1/0?password=***&db=2"),
        ("not a url", "not a url"),
        ("", ""),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_config_is_absolute_and_loopback_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert ServicesConfig(Path(".state")).state_dir == tmp_path / ".state"
    assert ServicesConfig(Path("s"), host="localhost").host == "127.0.0.1"
    with pytest.raises(ValueError, match="loopback"):
        ServicesConfig(Path("s"), host="0.0.0.0")


def test_cli_start_status_stop(
    cfg: ServicesConfig,
    spawned: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("MONGO_URI", raising=False)
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)
    options = [
        f"--state-dir={cfg.state_dir}",
        f"--redis-port={cfg.redis_port}",
        f"--mongo-port={cfg.mongo_port}",
    ]
    assert main([*options, "start"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pids = {name: int(line.split()[3]) for name, line in zip(SERVICE_NAMES, lines, strict=True)}
    spawned.extend(pids.values())
    assert lines == [
        f"redis: running pid {pids['redis']} at redis://127.0.0.1:{cfg.redis_port}/0",
        f"mongo: running pid {pids['mongo']} at mongodb://127.0.0.1:{cfg.mongo_port}/",
    ]
    assert main(["status", *options]) == 0
    assert capsys.readouterr().out.splitlines() == lines
    assert main([*options, "stop"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"redis: stopped pid {pids['redis']}",
        f"mongo: stopped pid {pids['mongo']}",
    ]
    assert main([*options, "stop"]) == 0
    assert capsys.readouterr().out.splitlines() == ["redis: not running", "mongo: not running"]
    assert main([*options, "status"]) == 3


def test_cli_uses_external_mongo_uri(
    cfg: ServicesConfig,
    spawned: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MONGO_URI", "mongodb://crawler:hunter2@db.internal:27017/")
    monkeypatch.setenv("FLEETCRAWL_STATE_DIR", str(cfg.state_dir))
    monkeypatch.setenv("FLEETCRAWL_REDIS_PORT", str(cfg.redis_port))
    assert main(["start"]) == 0
    out = capsys.readouterr().out
    spawned.append(int(out.split()[3]))
    assert "mongo: using MONGO_URI (external) mongodb://crawler:***@db.internal:27017/" in out
    assert "hunter2" not in out
    assert not (cfg.state_dir / "ferretdb").exists()


def test_cli_reports_taken_port(
    cfg: ServicesConfig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MONGO_URI", "mongodb://db.internal/")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", cfg.redis_port))
        squatter.listen()
        code = main([f"--state-dir={cfg.state_dir}", "start", f"--redis-port={cfg.redis_port}"])
    assert code == 1
    assert f"redis: error: cannot start redis: port {cfg.redis_port}" in capsys.readouterr().err


def test_ensure_ferretdb_without_go_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCRAWL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="cannot build ferretdb: go is not on PATH"):
        ensure_ferretdb()


def test_ensure_redis_server_without_apt_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match=r"cannot install redis-server: .*apt-get"):
        ensure_redis_server()
