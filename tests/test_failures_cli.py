"""``fleetcrawl failures list|retry|purge`` against a real Redis."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from project.frontier.site_queues import queued_requests
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
    ((payload, _),) = queued_requests(redis_client, keys, "shop.test")
    assert json.loads(payload) == {"url": request["url"], "priority": 3, "meta": {}}
    assert redis_client.zscore(keys.queue, "shop.test") is not None, "the site is ready"
    assert int(redis_client.get(keys.queued)) == 1
    assert redis_client.llen(keys.dead) == 1

    purged = fleetcrawl(redis_url, keyspace, "failures", "purge")
    assert "purged 1 dead letters" in purged.stdout
    assert redis_client.llen(keys.dead) == 0


SECRETS = {"Cookie": ["session=s3cret-cookie"], "Authorization": ["Basic czNjcmV0"],
           "proxy-authorization": "Basic cHJveHk="}  # fmt: skip


def _leaked(text: str) -> list[str]:
    return [s for s in ("s3cret-cookie", "czNjcmV0", "cHJveHk=", "pr0xypass") if s in text]


def test_failures_list_redacts_credentials(redis_url, redis_client, keyspace, keys):
    """Cookie, Authorization and Proxy-Authorization headers of dead letters are not shown."""
    request = {
        "url": "http://shop.test/account",
        "headers": {**SECRETS, "Accept": ["text/html"]},
        "meta": {"proxy": "http://user:pr0xypass@proxy.test:3128"},
    }
    seed = json.dumps({"url": "http://shop.test/", "headers": SECRETS})[:120]  # cut preview
    redis_client.lpush(keys.dead, _dead(request["url"], request), _dead(seed, None))

    as_json = fleetcrawl(redis_url, keyspace, "failures", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert _leaked(as_json.stdout) == []
    seed_record, request_record = json.loads(as_json.stdout)
    shown = json.loads(request_record["request"])
    assert shown["headers"] == {
        "Cookie": ["[redacted]"],
        "Authorization": ["[redacted]"],
        "proxy-authorization": "[redacted]",
        "Accept": ["text/html"],
    }
    assert shown["meta"]["proxy"] == "http://user:***@proxy.test:3128"
    assert '"Cookie": "[redacted]"' in seed_record["url"]

    listed = fleetcrawl(redis_url, keyspace, "failures", "list")
    assert listed.returncode == 0, listed.stderr
    assert _leaked(listed.stdout) == []
    # Redis still has them: retry must send the request as it was.
    assert b"s3cret-cookie" in redis_client.lindex(keys.dead, 1)


HOSTILE = "[/x] \x1b[31mred\x1b[0m over\rwrite bell\x07 del\x7f c1\x9b " + "A" * 10_000


def test_failures_list_prints_no_terminal_escapes(redis_url, redis_client, keyspace, keys) -> None:
    """`failures list` shows terminal escapes of dead letters escaped, never raw."""
    record = json.loads(_dead(HOSTILE, None))
    record.update(error=HOSTILE, node=HOSTILE, kind=HOSTILE, attempts=HOSTILE)
    redis_client.lpush(keys.dead, json.dumps(record), b"\x1b[2J not json", b"[1]")

    plain = fleetcrawl(redis_url, keyspace, "failures", "list")
    as_json = fleetcrawl(redis_url, keyspace, "failures", "list", "--json")
    for run in (plain, as_json):
        assert run.returncode == 0, run.stderr
        assert [c for c in run.stdout if c != "\n" and not c.isprintable()] == []
        assert "Traceback" not in run.stderr
    assert "[/x] \\x1b[31mred\\x1b[0m over\\x0dwrite" in plain.stdout
    assert "3 dead letters shown" in plain.stdout
    assert max(len(line) for line in plain.stdout.splitlines()) < 300, "10 kB values are cut"
    newest, undecodable, hostile = json.loads(as_json.stdout)
    assert hostile["error"] == HOSTILE, "--json keeps the whole value, escaped"
    assert undecodable["error"] == newest["error"] == "not a dead-letter record"


def test_clear_deletes_a_frontier_and_refuses_while_nodes_crawl(
    redis_url: str, redis_client, keyspace, keys
) -> None:
    """``fleetcrawl clear SPIDER``: the frontier goes, node records stay; refused (exit 1,
    nothing deleted) while a node's presence has not expired."""
    redis_client.sadd(keys.dupefilter, b"fp")
    redis_client.lpush(keys.start_urls, b"http://shop.test/")
    seconds, _ = redis_client.time()
    redis_client.zadd(keys.alive, {b"node-a": (int(seconds) + 60) * 1000})
    refused = fleetcrawl(redis_url, keyspace, "clear", "products")
    assert refused.returncode == 1
    assert "1 nodes still crawl products: stop them first" in refused.stderr
    assert redis_client.scard(keys.dupefilter) == 1
    redis_client.zadd(keys.alive, {b"node-a": (int(seconds) - 60) * 1000})  # expired
    cleared = fleetcrawl(redis_url, keyspace, "clear", "products")
    assert cleared.returncode == 0, cleared.stderr
    assert "keys of products's frontier" in cleared.stdout
    assert not redis_client.exists(keys.dupefilter, keys.start_urls)
