"""Getting the data out: ``fleetcrawl export``, the items and changes API with its feed, the
run's FLEET_FEEDS (a file and a local S3), and the results pages of the dashboard, after
two real two-node crawls of a shop that changes between them."""

from __future__ import annotations

import base64
import csv
import io
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from project.dataout.config import DataOutConfig
from project.dataout.formats import CsvWriter, JsonArrayWriter
from project.dataout.query import BadParameterError, Cursor, read_token, split_fields
from project.ops.services import free_port
from tests.benchmarks.dashboard_screenshot import chromium, dashboard_process
from tests.fleet import Fleet, run_cli, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pymongo.database

    from tests.site.server import ShopServer

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
#: Reads settle for a second: the tests wait that long after the nodes exit.
SETTLE = {"EXPORT_SETTLE_SECONDS": "1"}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_tokens_and_cursors_refuse_what_no_read_gave() -> None:
    assert read_token("w1733461234567") == 1733461234567
    cursor = Cursor("http://shop/product/1?a=1&b=é", 1733461234567)
    assert Cursor.decode(cursor.encode()) == cursor
    assert read_token("w1\n") == 1  # as a token file holds it
    for bad in ("", "1733", "w", "w-1", "w" + "9" * 14, "w12 ; drop", "\x00", "w1\nw2"):
        with pytest.raises(BadParameterError):
            read_token(bad)
    hostile = ["", "x" * 5000, "!!!", "eyJhIjoxfQ", Cursor("a", 1).encode()[:-3] + "%%%",
               "W3sidyI6MX1d", "eyJhIjoiYSIsInciOnRydWV9", "eyJhIjoiYSIsInciOi0xfQ"]  # fmt: skip
    for bad in hostile:
        with pytest.raises(BadParameterError):
            Cursor.decode(bad)
    assert split_fields("name, offers.price,,") == ("name", "offers.price")
    for bad in ("$where", "a..b", "a.", ".a", "a,a.b", "x" * 300, ",".join(["f"] * 300)):
        with pytest.raises(BadParameterError):
            split_fields(bad)


def test_fleet_feeds_that_cannot_be_written_stop_the_node_with_their_reason() -> None:
    def feeds(value: Any) -> list[Any]:
        return DataOutConfig.from_settings(Settings({"FLEET_FEEDS": value})).parsed_feeds()

    assert [f.uri for f in feeds({"file:///tmp/x/%(run)s.jsonl": {}})] == [
        "file:///tmp/x/%(run)s.jsonl"
    ]
    for bad, reason in (
        ("s3", "not a file: or s3: URI"),
        ("file", "not a file: or s3: URI"),
        ("http://example.invalid/x.jsonl", "not a file: or s3: URI"),
        ("s3://[bucket/key.jsonl", "not a URI"),
        ("s3://key:secret@bucket/x.jsonl", "has credentials"),
    ):
        with pytest.raises(NotConfigured, match=reason.replace(":", r"\:")) as raised:
            feeds({bad: {}})
        assert "secret" not in str(raised.value)
    with pytest.raises(NotConfigured, match="FLEET_FEEDS"):
        feeds("{nope")


def test_csv_flattens_nested_fields_into_dotted_columns() -> None:
    docs = [
        {"_id": "a", "name": 'Tea "green", 1kg', "offers": {"price": 3.5, "currency": "EUR"},
         "images": ["/1.jpg", "/2.jpg"], "n": None},
        {"_id": "b", "name": "Line\nbreak", "offers": {"price": 4}, "late": True},
    ]  # fmt: skip
    writer = CsvWriter()
    text = (writer.page(docs[:1]) + writer.page(docs[1:]) + writer.end()).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["_id", "name", "offers.price", "offers.currency", "images", "n"]
    assert rows[0]["name"] == 'Tea "green", 1kg'
    assert json.loads(rows[0]["images"]) == ["/1.jpg", "/2.jpg"]
    assert rows[1] == {"_id": "b", "name": "Line\nbreak", "offers.price": "4",
                       "offers.currency": "", "images": "", "n": ""}  # fmt: skip
    assert list(writer.left_out) == ["late"]
    chosen = CsvWriter(["offers.price", "name"])
    rows = list(csv.reader(io.StringIO((chosen.page(docs) + chosen.end()).decode())))
    assert rows == [["offers.price", "name"], ["3.5", 'Tea "green", 1kg'], ["4", "Line\nbreak"]]
    hostile = CsvWriter(["name", "price"])
    text = (hostile.page([{"name": '=HYPERLINK("http://x","y")', "price": "-3"},
                          {"name": "@SUM(A1)", "price": -3}]) + hostile.end()).decode()  # fmt: skip
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1:] == [['\'=HYPERLINK("http://x","y")', "-3"], ["'@SUM(A1)", "-3"]]
    array = JsonArrayWriter()
    assert json.loads(array.start() + array.page(docs) + array.page([]) + array.end()) == docs
    empty = JsonArrayWriter()
    assert json.loads(empty.start() + empty.end()) == []


@pytest.mark.crawl
def test_read_only_api_tokens_open_the_api_and_nothing_else(fleet: Fleet) -> None:
    """DASHBOARD_API_TOKENS: a bearer token reads /api/v1 (and only with GET); the dashboard
    itself still takes its basic credentials; without any, the API is closed too."""
    env = {**fleet.env(), "DASHBOARD_API_TOKENS": "t0ken-a, t0ken-b",
           "DASHBOARD_USERNAME": "ops", "DASHBOARD_PASSWORD": "pw"}  # fmt: skip
    with dashboard_process(
        env, fleet.log_dir / "dashboard.log", args=fleet.space.cli_args()
    ) as base:
        bearer = {"Authorization": "Bearer t0ken-b"}
        assert _get(base + "api/v1/collections", bearer)[0] == 200
        assert _get(base + "api/v1/openapi.json", {"Authorization": "Bearer t0ken-a"})[0] == 200
        assert _get(base + "api/v1/collections", {"Authorization": "Bearer nope"})[0] == 401
        assert _get(base + "api/v1/collections")[0] == 401
        assert _get(base + "api/status", bearer)[0] == 401, "a token opens the data API only"
        basic = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
        assert _get(base + "api/v1/collections", basic)[0] == 200
        assert _get(base + "api/status", basic)[0] == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            _OPENER.open(
                urllib.request.Request(base + "api/v1/collections", data=b"{}", headers=bearer),
                timeout=10,
            )
        refused.value.close()
        assert refused.value.code in (401, 405), "a token writes nothing"
    open_env = {**fleet.env(), "DASHBOARD_API_TOKENS": "t0ken-a"}
    with dashboard_process(open_env, fleet.log_dir / "d2.log", args=fleet.space.cli_args()) as base:
        assert _get(base + "api/status")[0] == 200, "the dashboard stays open without credentials"
        assert _get(base + "api/v1/collections")[0] == 401, "the API needs its token"


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    """A local S3 (moto's server) on 127.0.0.1 with a bucket ``feeds``; its environment."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "fleet",
           "AWS_SECRET_ACCESS_KEY": "s3cr3t-key", "AWS_REGION": "us-east-1"}  # fmt: skip
    try:
        client = _s3_client(env)
        wait_for(lambda: _try(lambda: client.create_bucket(Bucket="feeds")), 60, "moto's S3")
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


def _s3_client(env: dict[str, str]) -> Any:
    import botocore.session

    session = botocore.session.get_session()
    return session.create_client(
        "s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )  # fmt: skip


def _try(call: Any) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001 (not up yet, whatever it says)
        return False
    return True


def _crawl(fleet: Fleet, shop: ShopServer, **settings: Any) -> None:
    first = len(fleet.procs)
    for _ in range(2):
        fleet.start_node(**settings)
    fleet.seed(shop.url("/"))
    codes = [proc.wait(180) for proc in fleet.procs[first:]]
    assert codes == [0, 0], fleet.log(first)[-3000:]
    time.sleep(1.2)  # past EXPORT_SETTLE_SECONDS: everything stored is read


def _export(fleet: Fleet, *args: str) -> tuple[bytes, str]:
    """``fleetcrawl export`` as a user runs it: its output and its token."""
    out = fleet.log_dir / f"export-{time.monotonic_ns()}"
    token = fleet.log_dir / "token"
    cli = [f"{k}={v}" for k, v in SETTLE.items()]
    done = run_cli("export", *args, "-o", str(out), "--token-file", str(token),
                   *[a for pair in cli for a in ("-s", pair)], env=fleet.env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exported" in done.stderr
    return out.read_bytes(), token.read_text().strip()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


def _pages(base: str, path: str, key: str, limit: int) -> list[dict[str, Any]]:
    """Every page of an API read, cursor by cursor."""
    found: list[dict[str, Any]] = []
    separator = "&" if "?" in path else "?"
    url = f"{base}{path}{separator}limit={limit}"
    while True:
        status, _, body = _get(url)
        assert status == 200, body
        page = json.loads(body)
        assert page["count"] == len(page[key]) <= limit
        found += page[key]
        if page["cursor"] is None:
            return found
        url = f"{base}{path}{separator}limit={limit}&cursor={page['cursor']}"


def _feed(url: str, count: int) -> list[dict[str, Any]]:
    """The first *count* lines of an NDJSON change feed, then the connection is dropped."""
    lines: list[dict[str, Any]] = []
    with _OPENER.open(url, timeout=30) as response:
        while len(lines) < count:
            line = response.readline()
            assert line, "the feed ended"
            if line.strip():
                lines.append(json.loads(line))
    return lines


@pytest.mark.crawl
@pytest.mark.slow("two whole crawls, each exported")
def test_two_crawls_come_out_whole_once_and_since_gives_the_second_crawls_writes(
    fleet: Fleet, make_shop: Any, mongo: pymongo.database.Database[Any], s3: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    shop = make_shop(120, epoch_price_share=0.1, epoch_stock_share=0.05,
                     epoch_added=0.05, epoch_removed=0.05)  # fmt: skip
    fleet.settings.update({"FRONTIER_REVISIT": {".": "1s"}, **SETTLE})
    _crawl(fleet, shop)
    first_all, first_token = _export(fleet, "products")
    first_ids = [json.loads(line)["_id"] for line in first_all.splitlines()]
    assert sorted(first_ids) == sorted(d["_id"] for d in mongo.products.find({}, {"_id": 1}))
    assert len(first_ids) == len(set(first_ids)) == 120

    shop.set_epoch(1)
    time.sleep(1.2)  # past the revisit interval
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    feeds = {
        f"file://{fleet.log_dir}/feeds/%(name)s-%(run)s.jsonl": {"format": "jsonl"},
        "s3://feeds/%(name)s/%(time)s.csv": {"format": "csv", "fields": ["name", "price"]},
    }
    _crawl(fleet, shop, FLEET_FEEDS=feeds)
    changes = shop.changes()
    moved = {shop.url(f"/product/{p}") for kind in ("price", "availability", "added", "removed")
             for p in changes[kind]}  # fmt: skip
    changed = {shop.url(f"/product/{p}") for kind in ("price", "availability", "removed")
               for p in changes[kind]}  # fmt: skip
    assert changes["added"], "the epoch adds products"
    assert changes["removed"], "and removes some (their items are marked gone)"

    # an export since the first crawl's token: exactly what the second crawl wrote
    since, second_token = _export(fleet, "products", "--since", first_token)
    assert {json.loads(line)["_id"] for line in since.splitlines()} == moved
    assert len(since.splitlines()) == len(moved)
    again, _ = _export(fleet, "products", "--since", second_token)
    assert again == b"", "nothing was written after the second token"
    # CSV with chosen fields opens in Python's csv module
    table, _ = _export(fleet, "products", "--format", "csv", "--fields", "_id,name,price")
    rows = list(csv.DictReader(io.StringIO(table.decode())))
    assert list(rows[0]) == ["_id", "name", "price"]
    assert sorted(r["_id"] for r in rows) == sorted(d["_id"] for d in mongo.products.find())

    # the run's feeds: every item the second run saw, once, in a file and in S3
    report = wait_for(lambda: mongo.crawl_runs.find_one({"feeds": {"$exists": True}}), 30,
                      "the second run's report with its feeds")  # fmt: skip
    seen = sorted(d["_id"] for d in mongo.products.find({"gone_at": {"$exists": False}}))
    assert [f.get("error") for f in report["feeds"]] == [None, None], report["feeds"]
    [file_feed] = (fleet.log_dir / "feeds").glob("products-*.jsonl")
    assert file_feed.name == f"products-{report['_id']}.jsonl"
    assert sorted(json.loads(line)["_id"] for line in file_feed.read_bytes().splitlines()) == seen
    [listed] = _s3_client(s3).list_objects_v2(Bucket="feeds")["Contents"]
    body = _s3_client(s3).get_object(Bucket="feeds", Key=listed["Key"])["Body"].read()
    s3_rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert list(s3_rows[0]) == ["name", "price"]
    assert len(s3_rows) == len(seen) == report["feeds"][1]["items"]

    args = [*fleet.space.cli_args(), *[a for k, v in SETTLE.items() for a in ("-s", f"{k}={v}")]]
    with dashboard_process(fleet.env(), fleet.log_dir / "dashboard.log", args=args) as base:
        _the_api_pages_every_item_once(base, mongo, first_token, moved, changed)
        _the_results_pages_render_and_page_in_chromium(base)
        _the_change_feed_delivers_each_change_once_across_a_reconnect(base, mongo, first_token)


def _the_api_pages_every_item_once(
    base: str, mongo: pymongo.database.Database[Any], first_token: str, moved: set[str],
    changed: set[str],
) -> None:  # fmt: skip
    every = sorted(d["_id"] for d in mongo.products.find({}, {"_id": 1}))
    paged = _pages(base, "api/v1/items/products", "items", 7)
    assert [d["_id"] for d in paged] == every, "every item once, in _id order"
    since = _pages(base, f"api/v1/items/products?since={first_token}&fields=name", "items", 5)
    assert len(since) == len(moved)
    assert all(set(d) == {"name"} for d in since), "only the field asked for"
    status, headers, body = _get(f"{base}api/v1/items/products?format=csv&fields=_id,price&limit=3")
    assert status == 200
    assert headers["Content-Type"].startswith("text/csv")
    assert len(list(csv.DictReader(io.StringIO(body.decode())))) == 3
    assert "X-Next-Cursor" in headers
    assert 'rel="next"' in headers["Link"]
    status, _, body = _get(f"{base}api/v1/items/products?limit=1000000")
    assert json.loads(body)["limit"] == 1000
    for path, code in (
        ("api/v1/items/products?limit=-1", 400),
        ("api/v1/items/products?limit=abc", 400),
        ("api/v1/items/products?cursor=garbage", 400),
        ("api/v1/items/products?since=yesterday", 400),
        ("api/v1/items/products?format=xml", 400),
        ("api/v1/items/products?fields=$where", 400),
        ("api/v1/items/nowhere", 404),
        ("api/v1/items/bad$name", 400),
        ("api/v1/items/products?run=nope", 404),
        ("api/v1/runs/nope", 404),
    ):
        status, headers, body = _get(base + path)
        assert status == code, (path, body)
        assert "error" in json.loads(body)
    collections = json.loads(_get(base + "api/v1/collections")[2])["collections"]
    assert {"name": "products", "count": len(every)} in collections
    runs = json.loads(_get(base + "api/v1/runs")[2])["runs"]
    assert len(runs) == 2
    one = json.loads(_get(base + f"api/v1/runs/{runs[0]['_id']}")[2])
    assert one["_id"] == runs[0]["_id"]
    in_run = _pages(base, f"api/v1/items/products?run={runs[0]['_id']}", "items", 50)
    assert sorted(d["_id"] for d in in_run) == sorted(
        d["_id"] for d in mongo.products.find({"gone_at": {"$exists": False}})
    )
    changes = _pages(base, f"api/v1/changes?since={first_token}", "changes", 4)
    assert len(changes) == mongo.changes.count_documents({})
    assert {c["item_id"] for c in changes} == changed, "an insert is no change"
    from openapi_spec_validator import validate

    validate(json.loads(_get(base + "api/v1/openapi.json")[2]))


def _the_change_feed_delivers_each_change_once_across_a_reconnect(
    base: str, mongo: pymongo.database.Database[Any], first_token: str
) -> None:
    total = mongo.changes.count_documents({})
    assert total >= 4
    head = _feed(f"{base}api/v1/changes/feed?since={first_token}", total // 2)
    rest = _feed(f"{base}api/v1/changes/feed?cursor={head[-1]['cursor']}", total - total // 2)
    ids = [line["change"]["_id"] for line in head + rest]
    assert sorted(ids) == sorted(d["_id"] for d in mongo.changes.find({}, {"_id": 1}))
    assert len(ids) == len(set(ids)), "a change twice across the reconnect"
    # a change stored while a client listens reaches it
    listening = _OPENER.open(f"{base}api/v1/changes/feed?cursor={head[-1]['cursor']}", timeout=30)
    with listening:
        for _ in range(total - total // 2):
            listening.readline()
        mongo.changes.insert_one({"_id": f"{int(time.time() * 1000):013d}|late", "field": "x"})
        late = b""
        while not late.strip():
            late = listening.readline()
    assert json.loads(late)["change"]["_id"].endswith("|late")


def _the_results_pages_render_and_page_in_chromium(base: str) -> None:
    console: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.goto(base + "items")
        page.wait_for_function("document.querySelectorAll('#results tbody tr').length > 0")
        page.fill("#fields", "_id,name,price,last_seen")
        page.select_option("#limit", "20")
        page.click("button[type=submit]")
        page.wait_for_function("results.state.pages === 1")
        first = page.locator("#results tbody tr td:first-child").all_inner_texts()
        assert len(first) == 20
        assert page.locator("#results thead th").all_inner_texts() == [
            "_id", "name", "price", "last_seen"]  # fmt: skip
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "items.png"), full_page=True)
        page.click("#next")
        page.wait_for_function("results.state.pages === 2")
        second = page.locator("#results tbody tr td:first-child").all_inner_texts()
        assert second
        assert not set(second) & set(first)
        page.goto(base + "changes")
        page.wait_for_function("document.querySelectorAll('#results tbody tr').length > 0")
        fields = set(page.locator("#results tbody tr td:nth-child(4)").all_inner_texts())
        assert fields & {"price", "availability", "gone_at"}, fields
        page.screenshot(path=str(ARTIFACTS / "changes.png"), full_page=True)
    assert console == [], console
