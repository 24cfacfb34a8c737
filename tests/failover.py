"""What a Redis failover loses: acknowledged writes probed across a kill -9 of the master.

Two writers run against the master that holds the frontier's keys until it dies: one
counts plain ``INCR`` replies, the other counts only the ``INCR`` s that ``WAIT`` saw on
``replicas`` replicas. After the promotion, each counter's value on the new master
against the replies its writer had says how many acknowledged writes the failover lost,
and the plain writer's rate turns that into the loss window in milliseconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from collections.abc import Callable

    import pymongo

    from project.ops.topology import ClusterInfo


#: A crawl slow enough to kill a master in the middle of it (tests/test_cluster.py,
#: tests/test_sentinel.py).
PRODUCTS = 300
SHOP = {"latency_ms": 60}
NODE = {"CONCURRENT_REQUESTS": 4}


@dataclass
class _Writer:
    key: str
    wait_replicas: int = 0
    acked: int = 0
    started: float = 0.0
    ended: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False)


@dataclass
class LossProbe:
    """Writers on *keys* (in the frontier's slot) at *master*, until it stops answering."""

    master: Callable[[], redis.Redis]
    plain_key: str
    wait_key: str
    replicas: int = 1
    interval: float = 0.001
    writers: list[_Writer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> LossProbe:
        self.writers = [_Writer(self.plain_key), _Writer(self.wait_key, self.replicas)]
        for writer in self.writers:
            writer.thread = threading.Thread(target=self._write, args=(writer,), daemon=True)
            writer.thread.start()
        return self

    def _write(self, writer: _Writer) -> None:
        client = self.master()
        writer.started = time.monotonic()
        try:
            while not self._stop.is_set():
                value = int(client.incr(writer.key))
                replicas = writer.wait_replicas
                if replicas and int(client.execute_command("WAIT", replicas, 1000)) < replicas:
                    continue  # not on enough replicas: not acknowledged
                writer.acked = value
                writer.ended = time.monotonic()
                time.sleep(self.interval)
        except (redis.RedisError, OSError):
            pass  # the master died
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        for writer in self.writers:
            if writer.thread is not None:
                writer.thread.join(10)

    def losses(self, survivor: redis.Redis) -> dict[str, float]:
        """Acknowledged writes missing on the new master, per writer, and the window."""
        self.stop()
        plain, waited = self.writers
        # at most 0: the write whose reply the kill cut off may have reached the replica
        lost_plain = max(0, plain.acked - int(survivor.get(plain.key) or 0))
        lost_waited = max(0, waited.acked - int(survivor.get(waited.key) or 0))
        rate = plain.acked / max(1e-9, plain.ended - plain.started)
        return {
            "acked_plain": plain.acked,
            "lost_plain": lost_plain,
            "window_ms": 1000.0 * lost_plain / rate if rate else 0.0,
            "plain_writes_per_s": rate,
            "acked_waited": waited.acked,
            "lost_waited": lost_waited,
        }


def slot_master(group: ClusterInfo, key: str, dead: int | None = None) -> tuple[int, int] | None:
    """(port, pid) of the master serving *key*'s slot now, as a live server sees it."""
    ask = next(port for port in group.ports if port != dead)
    with redis.Redis(group.host, ask, socket_timeout=5) as client:
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        for line in client.execute_command("CLUSTER", "NODES").decode().splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return port, group.pids[port]
    return None


def crawl_outcome(shop, mongo: pymongo.database.Database[Any]) -> dict[str, int]:
    stats = shop.stats()
    hits = stats["product_hits"]
    skus = [doc["sku"] for doc in mongo.products.find({}, {"sku": 1})]
    return {
        "products": PRODUCTS,
        "stored": len(set(skus)),
        "documents": len(skus),
        "lost": PRODUCTS - len(set(skus)),
        "fetched_twice": sum(1 for n in hits.values() if n > 1),
        "pages_fetched_twice": sum(1 for n in stats["hits"].values() if n > 1),
    }
