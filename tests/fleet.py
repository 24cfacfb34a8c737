"""Helpers to run real ``scrapy crawl`` nodes and the ``fleetcrawl`` command against the
test services, each test in its own Redis key space."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from project.frontier.keys import FrontierKeys, KeyTemplates
from tests import forkserver

if TYPE_CHECKING:
    from collections.abc import Iterable

    from project.frontier.connection import RedisTarget

ROOT = Path(__file__).resolve().parent.parent

#: Settings every test node gets: fast termination, short leases.
FAST_SETTINGS: dict[str, Any] = {
    "FRONTIER_IDLE_GRACE": 1.0,
    "FRONTIER_LEASE_SECONDS": 6.0,
    "FRONTIER_HEARTBEAT_SECONDS": 1.5,
    "FRONTIER_MAINTENANCE_SECONDS": 0.5,
    "LOG_LEVEL": "INFO",
}

#: For nodes started before their seed (:meth:`Fleet.wait_ready`, then seed): one that finds
#: no crawl waits this long, so none gives up while the others are still starting.
WAIT_FOR_SEED: dict[str, Any] = {"FRONTIER_IDLE_GRACE": 60.0}


@dataclass(frozen=True)
class KeySpace:
    """A test's own Redis keys: every key name template with a prefix of its own.

    Tests share one Redis server; each runs under customised
    ``SCHEDULER_QUEUE_KEY``, ``SCHEDULER_DUPEFILTER_KEY``, ``REDIS_START_URLS_KEY``
    and ``FRONTIER_KEY_PREFIX``, so every node and reader must honour them.
    """

    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")
    #: Keys as on a Redis Cluster: every key of a spider in its seeds' key's slot.
    tagged: bool = False

    @property
    def settings(self) -> dict[str, str]:
        p = self.prefix
        return {
            "SCHEDULER_QUEUE_KEY": f"{p}:%(spider)s:requests",
            "SCHEDULER_DUPEFILTER_KEY": f"{p}:%(spider)s:dupefilter",
            "REDIS_START_URLS_KEY": f"{p}:%(name)s:start_urls",
            "FRONTIER_KEY_PREFIX": f"{p}:%(spider)s",
        }

    def keys(self, spider: str = "products") -> FrontierKeys:
        templates = KeyTemplates(
            queue=self.settings["SCHEDULER_QUEUE_KEY"],
            dupefilter=self.settings["SCHEDULER_DUPEFILTER_KEY"],
            start_urls=self.settings["REDIS_START_URLS_KEY"],
            prefix=self.settings["FRONTIER_KEY_PREFIX"],
            tagged=self.tagged,
        )
        return FrontierKeys.for_spider(spider, templates)

    def cli_args(self) -> list[str]:
        """``-s NAME=VALUE`` options that point the ``fleetcrawl`` command at these keys."""
        return [arg for name, value in self.settings.items() for arg in ("-s", f"{name}={value}")]

    def existing(self, client: redis.Redis) -> list[bytes]:
        """Every key of this space (tagged: ``{<prefix>:<spider>:start_urls}:...`` too)."""
        match = f"*{self.prefix}:*" if self.tagged else f"{self.prefix}:*"
        return list(client.scan_iter(match=match, count=1000))

    def delete(self, client: redis.Redis) -> None:
        found = self.existing(client)
        if found and self.tagged:
            for key in found:  # a cluster deletes one slot at a time
                client.delete(key)
        elif found:
            client.delete(*found)


@dataclass
class Fleet:
    """Several ``scrapy crawl`` processes sharing one Redis and one MongoDB."""

    redis_url: str
    mongo_url: str
    mongo_db: str
    log_dir: Path
    space: KeySpace = field(default_factory=KeySpace)
    spider: str = "products"
    settings: dict[str, Any] = field(default_factory=dict)
    #: ``-a NAME=VALUE`` spider arguments of every node.
    spider_args: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes] | forkserver.Forked] = field(default_factory=list)
    cwd: Path = ROOT
    #: A Redis Cluster or Sentinel group (its settings go to every node); None: redis_url.
    target: RedisTarget | None = None

    @property
    def keys(self) -> FrontierKeys:
        return self.space.keys(self.spider)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            REDIS_URL=self.redis_url,
            MONGO_URI=self.mongo_url,
            MONGO_DATABASE=self.mongo_db,
            PYTHONPATH=str(ROOT),
        )
        return env

    def start_node(
        self, *wrapper: str, **settings: Any
    ) -> subprocess.Popen[bytes] | forkserver.Forked:
        """A ``scrapy crawl`` node; *wrapper* is a command it runs under (faketime, prlimit)."""
        index = len(self.procs)
        merged = {
            **FAST_SETTINGS,
            **self.space.settings,
            "MONITOR_STATS_FILE": str(self.log_dir / f"node{index}.stats.json"),
            **self.settings,
            **settings,
        }
        args = ["crawl", self.spider]
        for key, value in merged.items():
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            args += ["-s", f"{key}={text}"]
        for key, value in self.spider_args.items():
            args += ["-a", f"{key}={value}"]
        with (self.log_dir / f"node{index}.log").open("wb") as log:
            proc = forkserver.spawn(
                "scrapy",
                args,
                cwd=self.cwd,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                wrapper=wrapper,
            )
        self.procs.append(proc)
        return proc

    def wait_ready(self, nodes: int | None = None, timeout: float = 60.0) -> None:
        """Until *nodes* (all started) step in Redis: a seed pushed then reaches each of them."""
        want = len(self.procs) if nodes is None else nodes
        with self.client() as client:
            deadline = time.monotonic() + timeout
            while int(client.zcard(self.keys.holders)) < want:
                exited = [i for i, proc in enumerate(self.procs) if proc.poll() is not None]
                if exited:
                    raise AssertionError(
                        f"node{exited[0]} exited before stepping:\n{self.log(exited[0])[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"{want} nodes not stepping after {timeout}s")
                time.sleep(0.05)

    def log(self, index: int) -> str:
        return (self.log_dir / f"node{index}.log").read_text(errors="replace")

    def stats(self, index: int) -> dict[str, Any]:
        """The final stats node *index* wrote (MONITOR_STATS_FILE); {} if it wrote none."""
        path = self.log_dir / f"node{index}.stats.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def stat(self, index: int, key: str) -> int:
        return int(self.stats(index).get(key, 0))

    def seed(self, *seeds: str | bytes) -> None:
        """Push seeds the way users do: ``redis-cli lpush <spider>:start_urls``."""
        key = self.keys.start_urls
        for raw in seeds:
            # redis-cli takes argv strings; bytes that are not UTF-8 go through redis-py.
            if isinstance(raw, bytes) or (self.target is not None and self.target.sentinels):
                with self.client() as client:
                    client.lpush(key, raw)
            else:
                # -c: on a cluster, redis-cli follows the MOVED to the seeds' key's master
                cluster = ["-c"] if self.target is not None and self.target.cluster else []
                cmd = ["redis-cli", *cluster, "-u", self.redis_url, "lpush", key, raw]
                subprocess.run(cmd, check=True, capture_output=True)

    def client(self) -> redis.Redis:
        """A client of the fleet's Redis: the cluster's or the sentinels' master, if any."""
        if self.target is None:
            return redis.Redis.from_url(self.redis_url)
        return self.target.sync_client(socket_timeout=10)

    def wait(self, timeout: float = 180.0) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for index, proc in enumerate(self.procs):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                codes.append(proc.wait(remaining))
            except subprocess.TimeoutExpired:
                self.stop()
                raise AssertionError(
                    f"node{index} still running after {timeout}s:\n{self.log(index)[-3000:]}"
                ) from None
        return codes

    def kill(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def queue_requests(
    client: redis.Redis, keys: FrontierKeys, requests: Iterable[tuple[str, dict[str, Any]]]
) -> None:
    """Queue ``(site, request)`` pairs as the frontier does, by its own script
    (lua/requeue_dead.lua puts requests back in their sites' queues), 1000 a call."""
    from project.frontier import lua

    script = lua.load("requeue_dead")
    put_back = client.register_script(script.source)
    flat: list[str] = []
    for site, request in requests:
        flat += [site, json.dumps(request)]
    for start in range(0, len(flat), 2000):
        chunk = flat[start : start + 2000]
        put_back(
            keys=script.keys_from(keys, work=keys.dead + ":fill"), args=[0, len(chunk) // 2, *chunk]
        )


def lease_one_each(
    client: redis.Redis, keys: FrontierKeys, sites: Iterable[str], *, granted: int, pushed: int
) -> None:
    """Each of *sites* with one request leased to ``node-a``, its lease counter at *granted*
    and *pushed* requests queued in all (``site_counts``), as the frontier counts them."""
    pipe = client.pipeline(transaction=False)
    for site in sites:
        pipe.zadd(keys.inflight, {f"node-a\nR{site}\n{{}}": 1e15})
        pipe.hincrby(keys.leases, site, granted)
        pipe.hincrby(keys.site_counts, site, pushed)
    pipe.execute()


def scrapy_project(where: Path, package: str, settings: str, **spiders: str) -> Path:
    """Someone's Scrapy project in *where*, as `scrapy startproject` leaves it: *settings* is
    its settings.py, *spiders* its spider modules by name."""
    (where / package / "spiders").mkdir(parents=True)
    (where / "scrapy.cfg").write_text(f"[settings]\ndefault = {package}.settings\n")
    (where / package / "__init__.py").write_text("")
    (where / package / "spiders" / "__init__.py").write_text("")
    (where / package / "settings.py").write_text(settings)
    for name, source in spiders.items():
        (where / package / "spiders" / f"{name}.py").write_text(source)
    return where


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the ``fleetcrawl`` command as users do, from the project folder."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = forkserver.spawn(
            "project.ops.cli",
            args,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=err,
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, code, _text(out.read()), _text(err.read()))


def _text(data: bytes) -> str:
    """Output as ``subprocess.run(text=True)`` gives it: universal newlines."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def wait_for(condition, timeout: float, what: str, interval: float = 0.02):
    """Poll *condition* until it returns something true; fail after *timeout* seconds.

    The one wait helper of the suite.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
