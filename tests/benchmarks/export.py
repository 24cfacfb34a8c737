"""Export and API against a plain pymongo read of the same collection, in one run.

    python -m tests.benchmarks.export [--items 100000] [--runs 3] [--uri mongodb://...]

A private Redis and FerretDB (the embedded store, as ``make demo`` runs it) unless ``--uri``;
a collection of ``--items`` product documents (as the store writes them, ``written_at``
included). Printed, medians of ``--runs``:

- export items/s: ``fleetcrawl export`` as users run it (JSON Lines to /dev/null; the time the
  same command takes to export an empty collection, its start, left out), against a plain
  pymongo ``find()`` iterating the whole collection (goal: at least 0.8);
- the export process' peak RSS (``wait4``'s ru_maxrss; goal: under 200 MB at 10^6);
- API page latency: ``GET /api/v1/items/<c>?limit=100`` of ``fleetcrawl dashboard`` at the
  cursor's end against its start (goal: within 1.5x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pymongo

from project.dataout.query import Cursor
from project.ops.services import ServicesConfig, free_port, start_mongo, start_redis, stop_service
from tests.benchmarks.dashboard_screenshot import dashboard_process

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "export_bench"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _fill(collection: Any, count: int) -> None:
    """*count* product documents, as the store writes them."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    batch = []
    for n in range(count):
        seen = start + timedelta(milliseconds=n)
        batch.append({
            "_id": f"http://shop.test/product/{n:07d}", "url": f"http://shop.test/product/{n:07d}",
            "name": f"Bench Product {n}", "price": 10 + n % 500 + 0.99, "currency": "EUR",
            "sku": f"SKU-{n:07d}", "availability": "in stock",
            "description": "Built to last and easy to clean. " * 3,
            "breadcrumb": ["Home", "Bench", f"Aisle {n % 40}"],
            "image_urls": [f"/img/{n}-1.jpg", f"/img/{n}-2.jpg"],
            "offers": {"price": 10 + n % 500 + 0.99, "currency": "EUR"},
            "content_hash": f"{n:064x}", "crawl_id": "bench-run", "source_spider": "products",
            "first_seen": seen, "last_seen": seen, "written_at": seen,
        })  # fmt: skip
        if len(batch) == 2000:
            collection.insert_many(batch)
            batch = []
    if batch:
        collection.insert_many(batch)


def _plain_read(collection: Any) -> float:
    """Items/s of a plain ``find()`` over the whole collection."""
    began = time.perf_counter()
    count = sum(1 for _ in collection.find())
    return count / (time.perf_counter() - began)


def _export(env: dict[str, str], count: int) -> tuple[float, int]:
    """Items/s of ``fleetcrawl export`` (first page to last) and its peak RSS in bytes."""
    argv = [sys.executable, "-m", "project.ops.cli", "export", "bench", "-o", os.devnull,
            "-s", "EXPORT_SETTLE_SECONDS=0"]  # fmt: skip
    began = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stderr is not None
    errors = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"export failed: {errors.decode(errors='replace')[-2000:]}")
    text = errors.decode()
    exported = int(text.split("exported ", 1)[1].split()[0])
    assert exported == count, text
    return count / elapsed, usage.ru_maxrss * 1024


def _startup(env: dict[str, str]) -> float:
    """Seconds of the same command exporting an empty collection: its start."""
    argv = [sys.executable, "-m", "project.ops.cli", "export", "empty_bench", "-o", os.devnull]
    began = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - began


def _latency(url: str, times: int = 7) -> float:
    spent = []
    for _ in range(times):
        began = time.perf_counter()
        with _OPENER.open(url, timeout=120) as response:
            response.read()
        spent.append(time.perf_counter() - began)
    return statistics.median(spent)


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.export",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--items", type=lambda t: int(float(t)), default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--uri", help="an existing MongoDB instead of a private FerretDB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="export-bench-") as name:
        services = ServicesConfig(state_dir=Path(name) / "state", redis_port=free_port(),
                                  mongo_port=free_port())  # fmt: skip
        start_redis(services)
        if args.uri is None:
            start_mongo(services)
        uri = args.uri or services.mongo_url
        env = dict(os.environ, MONGO_URI=uri, MONGO_DATABASE=DATABASE,
                   REDIS_URL=services.redis_url, PYTHONPATH=str(ROOT))  # fmt: skip
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
        try:
            collection = client[DATABASE]["bench"]
            collection.drop()
            began = time.perf_counter()
            _fill(collection, args.items)
            print(f"{args.items} items stored in {time.perf_counter() - began:.0f} s ({uri})")
            startup = _startup(env)
            plain, exported, rss = [], [], []
            for _ in range(args.runs):
                plain.append(_plain_read(collection))
                rate, peak = _export(env, args.items)
                # the export's own rate: its wall time less the command's start
                exported.append(args.items / max(args.items / rate - startup, 1e-6))
                rss.append(peak)
            ids = [d["_id"] for d in collection.find({}, {"_id": 1}).sort("_id", -1).limit(101)]
            with dashboard_process(env, Path(name) / "dashboard.log") as base:
                first = f"{base}api/v1/items/bench?limit=100"
                until = int(time.time() * 1000)
                last = f"{first}&cursor={Cursor(ids[-1], until).encode()}"
                _latency(first, 2)  # the index of _id as text is made by the first page
                start_ms, end_ms = _latency(first), _latency(last)
        finally:
            client.close()
            if args.uri is None:
                stop_service(services, "mongo")
            stop_service(services, "redis")
    base_rate, export_rate = statistics.median(plain), statistics.median(exported)
    print(f"plain find(): {base_rate:.0f} items/s; fleetcrawl export (jsonl, the command's"
          f" {startup:.1f} s start left out): {export_rate:.0f} items/s,"
          f" x{export_rate / base_rate:.2f} (goal >= 0.8)")  # fmt: skip
    print(f"export peak RSS: {statistics.median(rss) / 2**20:.0f} MiB (goal < 200 MiB at 10^6)")
    print(f"API page of 100: {start_ms * 1000:.1f} ms at the start, {end_ms * 1000:.1f} ms at the"
          f" end of the cursor, x{end_ms / start_ms:.2f} (goal <= 1.5)")  # fmt: skip


if __name__ == "__main__":
    main()
