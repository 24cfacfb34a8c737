"""Seen-set benchmark: bytes per URL and enqueue throughput of each form.

    python -m tests.benchmarks.seen [--counts 1e5,1e6,1e7] [--runs 1]

For stock scrapy-redis (40-character hex fingerprints, ``SADD``), today's plain set (raw
20-byte fingerprints through lua/seen.lua) and FRONTIER_SEEN_MODE ``exact`` and ``bloom``
(sized for the count, 1e-6), each count in a fresh database of a private Redis:
``used_memory`` (``INFO memory``) before and after, over the count; URLs per second, in
batches of 1000 (one script call or one pipelined ``SADD`` each). Ratios are against stock
scrapy-redis measured in the same run; with ``--runs`` above 1, medians. Then the enqueue
phase itself: ``--step-urls`` requests (100,000) through the step script (lua/step.lua, batches
of 500 with payloads, as nodes send them), URLs per second for each of fleetcrawl's forms
against the plain set. Bloom mode is also
checked for false positives on as many fresh fingerprints (at most 1e6), marking none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import redis

from project.frontier import lua
from project.frontier.seen import SeenConfig
from project.ops.services import ServicesConfig, free_port, start_redis, stop_service

_BATCH = 1000
_KEY = "bench:dupefilter"


def _fingerprints(start: int, count: int) -> list[bytes]:
    return [
        hashlib.sha1(b"%d" % i, usedforsecurity=False).digest() for i in range(start, start + count)
    ]


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _fill(client: redis.Redis, form: str, count: int) -> tuple[float, float, float | None]:
    """Bytes per URL, URLs per second, false-positive rate (bloom) of one form at *count*."""
    client.flushdb()
    script = client.register_script(lua.load("seen").source)
    cfg = {"mode": "set"} if form in ("stock", "set") else SeenConfig(form, count, 1e-6).form()
    encoded = json.dumps(cfg)
    # the script loaded and Lua's heap grown before: only the seen-set is measured
    script(keys=[_KEY], args=[json.dumps({**cfg, "do": "test"}), *_fingerprints(0, _BATCH)])
    before = _used(client)
    script(keys=[_KEY], args=[json.dumps({**cfg, "do": "prepare"})])
    elapsed = 0.0
    for start in range(0, count, _BATCH):
        fps = _fingerprints(start, min(_BATCH, count - start))
        began = time.perf_counter()
        if form == "stock":
            client.sadd(_KEY, *[fp.hex() for fp in fps])
        else:
            script(keys=[_KEY], args=[encoded, *fps])
        elapsed += time.perf_counter() - began
    per_url = (_used(client) - before) / count
    false_positive = None
    if form == "bloom":
        seen = 0
        probe = min(count, 1_000_000)
        test = json.dumps({**cfg, "do": "test"})
        for start in range(count, count + probe, _BATCH):
            fps = _fingerprints(start, min(_BATCH, count + probe - start))
            seen += int(script(keys=[_KEY], args=[test, *fps]))
        false_positive = seen / probe
    client.flushdb()
    return per_url, count / elapsed, false_positive


def _step_rate(url: str, form: str, count: int) -> float:
    """URLs per second through the step script's enqueue phase, in the given seen-set form."""
    import asyncio

    import redis.asyncio

    from project.frontier.config import SiteLimits
    from project.frontier.keys import FrontierKeys
    from project.frontier.queue import LeasedQueue, StepBatch

    keys = FrontierKeys.for_spider("bench")
    config = SeenConfig(form, count, 1e-6)

    async def run() -> float:
        client = redis.asyncio.from_url(url)
        await client.flushdb()
        queue = LeasedQueue(client, None, keys, "bench", 60_000, SiteLimits(concurrency=0))  # type: ignore[arg-type]
        queue.seen_form = config.form()
        if form == "bloom":
            script = client.register_script(lua.load("seen").source)
            await script(
                keys=[keys.dupefilter], args=[json.dumps({**config.form(), "do": "prepare"})]
            )
        elapsed = 0.0
        for start in range(0, count, 500):
            fps = _fingerprints(start, min(500, count - start))
            batch = StepBatch(enqueue=[
                (b"f" + fp, f"site{i % 50}", 0, b'{"url":"http://site%d/p/%d"}' % (i % 50, start + i), "")
                for i, fp in enumerate(fps)
            ])  # fmt: skip
            began = time.perf_counter()
            await queue.step(batch)
            elapsed += time.perf_counter() - began
        await client.flushdb()
        await client.aclose()
        return count / elapsed

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", default="1e5,1e6,1e7")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--step-urls", type=int, default=100_000, help="0: no step table")
    parser.add_argument("--forms", default="stock,set,exact,bloom", help="stock is the baseline")
    args = parser.parse_args()
    counts = [int(float(c)) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as state:
        cfg = ServicesConfig(state_dir=Path(state), redis_port=free_port(), mongo_port=free_port())
        start_redis(cfg)
        try:
            client = redis.Redis.from_url(cfg.redis_url, socket_timeout=900)
            print("| URLs | form | bytes/URL | x stock | URLs/s | x stock | false positives |")
            print("|---|---|---|---|---|---|---|")
            for count in counts:
                results = {}
                for form in ["stock", *[f for f in args.forms.split(",") if f != "stock"]]:
                    runs = [_fill(client, form, count) for _ in range(args.runs)]
                    results[form] = (
                        statistics.median(r[0] for r in runs),
                        statistics.median(r[1] for r in runs),
                        runs[0][2],
                    )
                stock_bytes, stock_rate, _ = results["stock"]
                for form, (per_url, rate, fp_rate) in results.items():
                    shown = "" if fp_rate is None else f"{fp_rate:.1e}"
                    print(
                        f"| {count:.0e} | {form} | {per_url:.1f} | {per_url / stock_bytes:.2f}"
                        f" | {rate:,.0f} | {rate / stock_rate:.2f} | {shown} |",
                        flush=True,
                    )
            if not args.step_urls:
                return
            print()
            print("| form | enqueue (step script) URLs/s | x set |")
            print("|---|---|---|")
            rates = {f: statistics.median(_step_rate(cfg.redis_url, f, args.step_urls)
                                          for _ in range(args.runs)) for f in ("set", "exact", "bloom")}  # fmt: skip
            for form, rate in rates.items():
                print(f"| {form} | {rate:,.0f} | {rate / rates['set']:.2f} |", flush=True)
            client.close()
        finally:
            stop_service(cfg, "redis")


if __name__ == "__main__":
    main()
