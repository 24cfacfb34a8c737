"""MongoDB write benchmark: the batched store vs one write per item.

    python -m tests.benchmarks.mongo_writes [--items 500] [--runs 5] [--uri mongodb://...]
    python -m tests.benchmarks.mongo_writes --sizes 10000,100000 [--runs 1] [--uri ...]
        [--passes new,touched] [--repeat 3]

Same run, same FerretDB (a private one unless ``--uri``), fresh database per variant and run.
Each run writes ``--items`` new products (insert pass), then the same products again
(re-crawl pass: all unchanged). Variants:

- ``store batched``: ``MongoStore`` as the pipeline uses it, items submitted concurrently
  (as Scrapy's CONCURRENT_ITEMS does), ``MONGO_BATCH_SIZE=100``;
- ``update_one``: one ``update_one(..., upsert=True)`` per item, awaited in turn.

Prints items/s (median of ``--runs``) and the ratio batched / one-by-one. On FerretDB (SQLite)
every modified document costs about the same however it is sent, so the re-crawl pass
(``last_seen`` bumps) gains little there; inserts gain the most.

``--sizes``: the cost of storing an item as the collection grows. For each size N, in a fresh
database, ``MongoStore`` stores N new products (the rate of the last tenth is the rate at N),
then all N again unchanged (a recrawl: ``last_seen`` bumps), then all N again with one in ten
changed (new price: a content rewrite and a change-history document), then touches all N
(``last_seen`` moved without content, as a 304 does: one record per page of one item), then
marks one in ten gone (as a listing that no longer names them does: a record per 10 items,
each a ``gone_at`` and a change-history document). Building the products (the spider's work)
is not counted. Prints items/s of each pass and the per-item cost at each size as a ratio to
the smallest (goal: at most 1.5x from 10^4 to 10^6, and at least 1,000 items/s at 10^6).
``--passes`` times some of the passes (new always runs: the others need its collection);
``--repeat K`` runs each pass but new and gone K times on the same collection and keeps the
median, so one pass can be measured several times at 10^6 without rebuilding it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from scrapy import Spider
from scrapy.utils.test import get_crawler

from project.ops.services import ServicesConfig, free_port, start_mongo, stop_service
from project.schema import Product
from project.storage.store import MongoStore

VARIANTS = ("store batched", "update_one")


class _BenchSpider(Spider):
    name = "bench"


def _products(count: int, start: int = 0, epoch: int = 0) -> list[Product]:
    """Products *start* to *start + count*; in *epoch* > 0 one in ten has another price."""
    return [
        Product.model_validate(
            {
                "url": f"http://shop.test/product/{n}?ref=bench",
                "canonical_url": f"http://shop.test/product/{n}",
                "name": f"Bench Product {n}",
                "price": f"{(n + (epoch if n % 10 == 0 else 0)) % 500 + 1}.99",
                "currency": "EUR",
                "sku": f"SKU-{n:06d}",
                "availability": "in stock",
                "description": "Built to last and easy to clean.",
                "breadcrumb": ["Home", "Bench"],
                "image_urls": [f"/img/{n}-1.jpg", f"/img/{n}-2.jpg"],
            }
        )
        for n in range(start, start + count)
    ]


async def _store_pass(
    uri: str, database: str, journal: Path, products: list[Product], batch_size: int
) -> float:
    store = _bench_store(uri, database, journal, MONGO_BATCH_SIZE=batch_size)
    await store.open()
    started = time.perf_counter()
    await asyncio.gather(*(store.save_product(p) for p in products))
    elapsed = time.perf_counter() - started
    await store.close()
    return elapsed


def _bench_store(uri: str, database: str, journal: Path, **settings: Any) -> MongoStore:
    """A store on *database*, journaling to *journal*, with *settings* over the defaults."""
    crawler = get_crawler(
        _BenchSpider,
        {"MONGO_URI": uri, "MONGO_DATABASE": database, "MONGO_JOURNAL_DIR": str(journal),
         **settings},
    )  # fmt: skip
    return MongoStore.from_crawler(crawler)


async def _update_one_pass(uri: str, database: str, products: list[Product]) -> float:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    collection = client[database]["products"]
    await collection.create_index("sku", name="sku")
    started = time.perf_counter()
    for product in products:
        now = time.time()
        doc = {
            **product.content(),
            "url": product.url,
            "content_hash": product.content_hash(),
            "last_seen": now,
        }
        await collection.update_one(
            {"_id": product.canonical_url},
            {"$set": doc, "$setOnInsert": {"first_seen": now}},
            upsert=True,
        )
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed


async def _run(
    variant: str, uri: str, products: list[Product], journal: Path
) -> tuple[float, float]:
    """Seconds of the insert pass and of the re-crawl pass."""
    database = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        passes = []
        for _ in range(2):
            if variant == "update_one":
                passes.append(await _update_one_pass(uri, database, products))
            else:
                passes.append(await _store_pass(uri, database, journal, products, 100))
        return passes[0], passes[1]
    finally:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        await client.drop_database(database)
        await client.close()


_CHUNK = 2000  # products submitted at once (CONCURRENT_ITEMS across a fleet's nodes)


async def _sized_pass(
    uri: str, database: str, journal: Path, size: int, epoch: int
) -> tuple[float, float]:
    """Store products 0..size-1 (epoch: see _products): seconds of the pass, and items/s of
    its last tenth (from the first chunk past nine tenths); building products not counted."""
    store = _bench_store(uri, database, journal)
    await store.open()
    spent, tenth_spent, tenth_from = 0.0, None, 0
    for start in range(0, size, _CHUNK):
        if tenth_spent is None and start >= size - size // 10:
            tenth_spent, tenth_from = spent, start
        chunk = _products(min(_CHUNK, size - start), start, epoch)
        began = time.perf_counter()
        await asyncio.gather(*(store.save_product(p) for p in chunk))
        spent += time.perf_counter() - began
    began = time.perf_counter()
    await store.close()  # the last batches are written
    spent += time.perf_counter() - began
    return spent, (size - tenth_from) / (spent - (tenth_spent or 0.0))


async def _refs_pass(
    uri: str, database: str, journal: Path, size: int, per_record: int, gone: bool
) -> float:
    """Seconds to touch products 0..size-1 (*gone*: mark one in ten gone), *per_record* ids
    in each touch or gone record."""
    store = _bench_store(uri, database, journal)
    await store.open()
    step = 10 if gone else 1
    keys = [f"http://shop.test/product/{n}" for n in range(0, size, step)]
    refs = [("products", key) for key in keys]
    before = time.time()  # every product was seen before it: all of them are marked
    began = time.perf_counter()
    per_chunk = _CHUNK * per_record
    for start in range(0, len(refs), per_chunk):
        chunk = refs[start : start + per_chunk]
        records = [chunk[i : i + per_record] for i in range(0, len(chunk), per_record)]
        if gone:
            await asyncio.gather(*(store.gone(r, before=before) for r in records))
        else:
            await asyncio.gather(*(store.touch(r) for r in records))
    await store.close()
    spent = time.perf_counter() - began
    if gone:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        marked = await client[database]["products"].count_documents(
            {"_id": {"$in": keys[:50]}, "gone_at": {"$exists": True}}
        )
        await client.close()
        assert marked == min(50, len(keys)), f"{marked} of the first 50 marked gone"
    return spent


#: Passes of ``--sizes``, in order.
_PASSES = ("new", "unchanged", "10% changed", "touched", "10% gone")


async def _sized(
    uri: str, size: int, journal: Path, passes: tuple[str, ...], repeat: int
) -> tuple[float, ...]:
    """items/s of each of *passes* (of _PASSES) at *size*, new at the last tenth; a pass other
    than new and gone is run *repeat* times on the same collection, its median kept (changed
    passes alternate two prices, so each repeat rewrites the same one in ten)."""
    database = f"bench_{uuid.uuid4().hex[:8]}"
    rates: list[float] = []

    async def timed(name: str, turn: int) -> float:
        if name == "new":
            return (await _sized_pass(uri, database, journal, size, 0))[1]
        if name == "unchanged":
            return size / (await _sized_pass(uri, database, journal, size, 0))[0]
        if name == "10% changed":
            return size / (await _sized_pass(uri, database, journal, size, 1 + turn % 2))[0]
        if name == "touched":
            return size / await _refs_pass(uri, database, journal, size, 1, gone=False)
        return size / 10 / await _refs_pass(uri, database, journal, size, 10, gone=True)

    try:
        for name in _PASSES:
            if name != "new" and name not in passes:
                continue  # new always runs: the other passes need its collection
            turns = [
                await timed(name, turn)
                for turn in range(1 if name in ("new", "10% gone") else repeat)
            ]
            if name in passes:
                rates.append(statistics.median(turns))
                shown = " ".join(f"{t:.0f}" for t in turns)
                print(f"  {size}: {name} {rates[-1]:.0f}/s ({shown})", flush=True)
        return tuple(rates)
    finally:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        await client.drop_database(database)
        await client.close()


def _print_sizes(
    uri: str, sizes: list[int], passes: tuple[str, ...], rates: dict[int, list[tuple[float, ...]]]
) -> None:
    runs = len(next(iter(rates.values())))
    print(f"items/s by collection size, median of {runs} runs ({uri})")
    print(f"{'size':>9} " + " ".join(f"{name:>12}" for name in passes))
    base = None
    for size in sizes:
        medians = [statistics.median(r[i] for r in rates[size]) for i in range(len(passes))]
        base = base or medians
        print(f"{size:>9} " + " ".join(f"{m:12.0f}" for m in medians))
        ratios = " ".join(
            f"{'x' + format(b / m, '.2f'):>12}" for b, m in zip(base, medians, strict=True)
        )
        print(f"{'cost':>9} {ratios}")


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.mongo_writes", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--items", type=int, default=500, help="products per pass (default: %(default)s)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=5,
        help="repetitions; medians are printed (default: %(default)s)",
    )
    parser.add_argument("--uri", help="an existing MongoDB/FerretDB instead of a private FerretDB")
    parser.add_argument(
        "--sizes", help="collection sizes, comma-separated (10000,100000,1000000): see above"
    )
    parser.add_argument(
        "--passes",
        default=",".join(_PASSES),
        help="with --sizes: the passes to time, comma-separated; new always runs first "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="with --sizes: run each pass but new and gone this many times on one collection "
        "and keep the median (cheaper than --runs, which rebuilds it; default: %(default)s)",
    )
    args = parser.parse_args()
    if args.sizes:
        passes = tuple(name for name in _PASSES if name in args.passes.split(","))
        unknown = set(args.passes.split(",")) - set(_PASSES)
        if unknown:
            parser.error(f"unknown passes {sorted(unknown)}; they are {', '.join(_PASSES)}")
        sizes = [int(float(n)) for n in args.sizes.split(",")]
        _main_sizes(sizes, args.runs, args.uri, passes, args.repeat)
        return
    products = _products(args.items)

    with tempfile.TemporaryDirectory() as tmp:
        services = None
        uri = args.uri
        if uri is None:
            services = ServicesConfig(
                state_dir=Path(tmp) / "state", redis_port=free_port(), mongo_port=free_port()
            )
            start_mongo(services)
            uri = services.mongo_url
        try:
            results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
            for run in range(args.runs):
                # Rotate the order so no variant always runs on a warmer (or fuller) server.
                order = VARIANTS[run % 2 :] + VARIANTS[: run % 2]
                for variant in order:
                    journal = Path(tmp) / (f"journal-{variant.replace(' ', '_')}-{run}")
                    results[variant].append(asyncio.run(_run(variant, uri, products, journal)))
        finally:
            if services is not None:
                stop_service(services, "mongo")

    print(f"{args.items} items per pass, {args.runs} runs, median items/s ({uri})")
    print(f"{'variant':<15} {'insert':>12} {'re-crawl':>12}")
    rates: dict[str, tuple[float, float]] = {}
    for variant in VARIANTS:
        insert = statistics.median(args.items / first for first, _ in results[variant])
        again = statistics.median(args.items / second for _, second in results[variant])
        rates[variant] = (insert, again)
        print(f"{variant:<15} {insert:12.0f} {again:12.0f}")
    insert = rates["store batched"][0] / rates["update_one"][0]
    again = rates["store batched"][1] / rates["update_one"][1]
    print(f"batched / one-by-one: x{insert:.1f} insert, x{again:.1f} re-crawl")


def _main_sizes(
    sizes: list[int], runs: int, uri: str | None, passes: tuple[str, ...], repeat: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        services = None
        if uri is None:
            services = ServicesConfig(
                state_dir=Path(tmp) / "state", redis_port=free_port(), mongo_port=free_port()
            )
            start_mongo(services)
            uri = services.mongo_url
        rates: dict[int, list[tuple[float, ...]]] = {size: [] for size in sizes}
        try:
            for run in range(runs):
                for size in sizes:
                    journal = Path(tmp) / f"journal-{size}-{run}"
                    rates[size].append(asyncio.run(_sized(uri, size, journal, passes, repeat)))
                    print(f"run {run + 1}, {size}: {rates[size][-1]}", flush=True)
        finally:
            if services is not None:
                stop_service(services, "mongo")
    _print_sizes(uri, sizes, passes, rates)


if __name__ == "__main__":
    main()
