"""Helpers to run real ``scrapy crawl`` nodes against the test services."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent

#: Settings every test node gets: fast termination, short leases.
FAST_SETTINGS: dict[str, Any] = {
    "FRONTIER_IDLE_GRACE": 1.0,
    "FRONTIER_LEASE_SECONDS": 6.0,
    "FRONTIER_HEARTBEAT_SECONDS": 1.5,
    "FRONTIER_MAINTENANCE_SECONDS": 0.5,
    "LOG_LEVEL": "INFO",
}


@dataclass
class Fleet:
    """Several ``scrapy crawl`` processes sharing one Redis and one MongoDB."""

    redis_url: str
    mongo_url: str
    mongo_db: str
    log_dir: Path
    spider: str = "products"
    settings: dict[str, Any] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            REDIS_URL=self.redis_url,
            MONGO_URI=self.mongo_url,
            MONGO_DATABASE=self.mongo_db,
            PYTHONPATH=str(ROOT),
        )
        return env

    def start_node(self, **settings: Any) -> subprocess.Popen[bytes]:
        merged = {**FAST_SETTINGS, **self.settings, **settings}
        argv = [sys.executable, "-m", "scrapy", "crawl", self.spider]
        for key, value in merged.items():
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            argv += ["-s", f"{key}={text}"]
        index = len(self.procs)
        with (self.log_dir / f"node{index}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def log(self, index: int) -> str:
        return (self.log_dir / f"node{index}.log").read_text(errors="replace")

    def seed(self, *seeds: str | bytes) -> None:
        """Push seeds the way users do: ``redis-cli lpush <spider>:start_urls``."""
        cmd = ["redis-cli", "-u", self.redis_url, "lpush", f"{self.spider}:start_urls"]
        for raw in seeds:
            # redis-cli takes argv strings; bytes that are not UTF-8 go through redis-py.
            if isinstance(raw, bytes):
                redis.Redis.from_url(self.redis_url).lpush(f"{self.spider}:start_urls", raw)
            else:
                subprocess.run([*cmd, raw], check=True, capture_output=True)

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


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the ``fleetcrawl`` command as users do, from the project folder."""
    return subprocess.run(
        [sys.executable, "-m", "project.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(condition, timeout: float, what: str, interval: float = 0.02):
    """Poll *condition* until it returns something true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def finish_reason(log: str) -> str | None:
    marker = "'finish_reason': '"
    at = log.rfind(marker)
    if at < 0:
        return None
    return log[at + len(marker) :].split("'", 1)[0]


def stat(log: str, key: str) -> int:
    marker = f"'{key}': "
    at = log.rfind(marker)
    if at < 0:
        return 0
    return int(log[at + len(marker) :].split(",", 1)[0].split("}", 1)[0])
