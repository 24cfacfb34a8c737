"""``fleetcrawl failures list|retry|purge`` against a real Redis."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from tests.fleet import KeySpace, run_cli

if TYPE_CHECKING:
    import subprocess


def fleetcrawl(redis_url: str, space: KeySpace, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as users run it, with this test's key names given by ``-s``."""
    return run_cli(*args, *space.cli_args(), env={"REDIS_URL": redis_url})


def _dead(url: str, request: dict | None) -> bytes:
    record = {
        "url": url,
        "attempts": 4,
        "error": "HTTP 503",
        "kind": "request" if request else "seed",
        "time": time.time(),
        "node": "vm:1:abcd",
        "request": json.dumps(request) if request else None,
    }
    return json.dumps(record).encode()


def test_list_retry_and_purge_dead_letters(redis_url: str, redis_client, keyspace, keys) -> None:
    request = {"url": "http://shop.test/product/7", "priority": 3, "meta": {"retry_times": 3}}
    redis_client.lpush(keys.dead, _dead(request["url"], request), _dead("not a url", None))

    listed = fleetcrawl(redis_url, keyspace, "failures", "list")
    assert listed.returncode == 0, listed.stderr
    assert "http://shop.test/product/7" in listed.stdout
    assert "2 dead letters shown" in listed.stdout

    retried = fleetcrawl(redis_url, keyspace, "failures", "retry")
    assert retried.returncode == 0, retried.stderr
    assert "requeued 1 requests; 1 invalid seeds stay dead-lettered" in retried.stdout
    (payload,) = redis_client.zrange(keys.site_queue("shop.test"), 0, -1)
    assert json.loads(payload) == {"url": request["url"], "priority": 3, "meta": {}}
    assert redis_client.zscore(keys.queue, "shop.test") is not None, "the site is ready"
    assert int(redis_client.get(keys.queued)) == 1
    assert redis_client.llen(keys.dead) == 1

    purged = fleetcrawl(redis_url, keyspace, "failures", "purge")
    assert "purged 1 dead letters" in purged.stdout
    assert redis_client.llen(keys.dead) == 0
