"""The test shop's epochs (tests/site/epochs.py) and its conditional requests
(tests/site/conditional.py): a catalogue that changes between two crawls, and 304s."""

from __future__ import annotations

import datetime as dt
import random
import re
import socket
import time
import zlib
from email.utils import format_datetime
from html import escape
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.site.catalogue import generate_catalogue
from tests.site.conditional import BASE_TIME, entity_tag, not_modified
from tests.site.config import parse_args
from tests.site.epochs import MAX_EPOCH, CatalogueHistory, Changes, EpochShares, diff
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.site.server import Fetched

PRODUCTS = 300
SEED = 3
KINDS: dict[str, Any] = {
    "js_share": 0.1,
    "malformed_share": 0.1,
    "flaky_share": 0.1,
    "broken_share": 0.05,
}
_PRODUCT_LINK = re.compile(r'class="product-link" href="/product/(\d+)')
_RELATED_LINK = re.compile(r'class="related-link" href="/product/(\d+)')
_ETAG = re.compile(r'"[0-9a-f]{32}"')
_NO_CHANGES: dict[str, list[int]] = {"price": [], "availability": [], "added": [], "removed": []}


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopServer]:
    with ShopServer(PRODUCTS, seed=SEED, **KINDS) as server:
        yield server


@pytest.fixture
def epoch0(shop: ShopServer) -> Iterator[ShopServer]:
    """The module's shop at epoch 0 with fresh counters; back at epoch 0 afterwards."""
    shop.set_epoch(0)
    shop.reset()
    yield shop
    shop.set_epoch(0)


def _day(epoch: int) -> str:
    """Last-Modified of a page unchanged since *epoch*."""
    return format_datetime(BASE_TIME + dt.timedelta(days=epoch), usegmt=True)


def _by_id(payload: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["id"]: p for p in payload["products"]}


def _plain(payload: dict[str, Any]) -> list[int]:
    return [p["id"] for p in payload["products"] if p["kind"] == "plain"]


def _expected_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[int]]:
    """What differs between two catalogue payloads, computed here from the products alone."""
    before, after = _by_id(old), _by_id(new)
    both = sorted(before.keys() & after.keys())
    return {
        "price": [i for i in both if before[i]["price"] != after[i]["price"]],
        "availability": [i for i in both if before[i]["availability"] != after[i]["availability"]],
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
    }


def _listing_urls(payload: dict[str, Any]) -> list[str]:
    return [
        f"/category/{c['slug']}?page={page}"
        for c in payload["categories"]
        for page in range(1, c["pages"] + 1)
    ]


def _listed(shop: ShopServer, payload: dict[str, Any]) -> dict[int, set[str]]:
    """Slugs of the listings that show each product (as a product, not as a related one)."""
    listed: dict[int, set[str]] = {}
    for url in _listing_urls(payload):
        page = shop.fetch(url)
        assert page.status == 200, url
        slug = url.split("/")[2].split("?")[0]
        for pid in _PRODUCT_LINK.findall(page.text):
            listed.setdefault(int(pid), set()).add(slug)
    return listed


def _assert_shows(page: Fetched, product: dict[str, Any]) -> None:
    assert page.status == 200
    assert f'<h1 class="product-name">{escape(product["name"])}</h1>' in page.text
    price = f'<span class="price" data-currency="{product["currency"]}">{product["price"]}</span>'
    assert price in page.text
    assert f'<span class="availability">{product["availability"]}</span>' in page.text


def _validators(page: Fetched) -> tuple[str, str]:
    return page.headers["etag"], page.headers["last-modified"]


# -- epochs -------------------------------------------------------------------------------------


def _related_before_epochs(seed: int, catalogue: dict[str, Any], slug: str, page: int) -> list[int]:
    """The related products of a listing as the shop drew them before it had epochs."""
    products = catalogue["products"]
    rng = random.Random(zlib.crc32(f"{seed}:related:{slug}:{page}".encode()))
    wanted = rng.randint(2, 3)
    found: list[int] = []
    for _ in range(20 * wanted):
        candidate = products[rng.randrange(len(products))]
        if slug not in candidate["categories"] and candidate["id"] not in found:
            found.append(candidate["id"])
            if len(found) == wanted:
                break
    return found


def test_epoch_zero_is_the_catalogue_of_before(epoch0: ShopServer) -> None:
    payload = epoch0.catalogue()
    assert payload["epoch"] == 0
    assert payload["changes"] == {"since": None, **_NO_CHANGES}
    generated = generate_catalogue(PRODUCTS, SEED, **KINDS)
    assert [
        (p["id"], p["name"], p["price"], p["availability"], p["kind"]) for p in payload["products"]
    ] == [(p.id, p.name, p.price, p.availability, p.kind) for p in generated.products]
    assert [c["product_ids"] for c in payload["categories"]] == [
        list(c.product_ids) for c in generated.categories
    ]
    urls = ["/", *_listing_urls(payload), "/product/1", "/product/2", "/sitemap.xml"]
    with ShopServer(PRODUCTS, seed=SEED, epoch=0, **KINDS) as explicit:
        assert explicit.catalogue() == payload
        for url in urls:
            theirs, ours = explicit.fetch(url), epoch0.fetch(url)
            assert (theirs.status, theirs.body.replace(explicit.base_url.encode(), b"")) == (
                ours.status,
                ours.body.replace(epoch0.base_url.encode(), b""),
            ), url
    for url in _listing_urls(payload):
        slug, page = url.split("/")[2].split("?page=")
        related = [int(pid) for pid in _RELATED_LINK.findall(epoch0.fetch(url).text)]
        assert related == _related_before_epochs(SEED, payload, slug, int(page)), url


@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "epoch_price_share": 0.5,
            "epoch_stock_share": 0.3,
            "epoch_added": 0.1,
            "epoch_removed": 0.2,
        },
        {
            "epoch_price_share": 0.0,
            "epoch_stock_share": 0.0,
            "epoch_added": 0.0,
            "epoch_removed": 0.0,
        },
    ],
    ids=["defaults", "large", "none"],
)
def test_epoch_one_changes_the_configured_shares_of_plain_products(
    options: dict[str, Any],
) -> None:
    defaults = EpochShares()
    price = options.get("epoch_price_share", defaults.price)
    stock = options.get("epoch_stock_share", defaults.stock)
    added = options.get("epoch_added", defaults.added)
    removed = options.get("epoch_removed", defaults.removed)
    with ShopServer(PRODUCTS, seed=SEED, epoch=1, **KINDS, **options) as server:
        before, after = server.catalogue(0), server.catalogue()
    plain = _plain(before)
    changes = after["changes"]
    assert (after["epoch"], changes["since"]) == (1, 0)
    assert changes == {"since": 0, **_expected_changes(before, after)}
    assert len(changes["price"]) == round(price * len(plain))
    assert len(changes["availability"]) == round(stock * len(plain))
    assert len(changes["removed"]) == round(removed * len(plain))
    assert len(changes["added"]) == round(added * PRODUCTS)
    assert set(changes["price"]) | set(changes["availability"]) | set(changes["removed"]) <= set(
        plain
    )
    assert not set(changes["removed"]) & (set(changes["price"]) | set(changes["availability"]))

    old, new = _by_id(before), _by_id(after)
    for pid in old.keys() & new.keys():
        kept = {
            k: v for k, v in new[pid].items() if k not in ("price", "page_price", "availability")
        }
        assert kept == {k: old[pid][k] for k in kept}, pid
        if pid in changes["price"]:
            assert re.fullmatch(r"\d+\.\d\d", new[pid]["price"])
            assert new[pid]["page_price"] == new[pid]["price"]
        else:
            assert new[pid]["price"] == old[pid]["price"]
    slugs = {c["slug"]: c["name"] for c in before["categories"]}
    for pid in changes["added"]:
        product = new[pid]
        assert pid > max(old)
        assert (product["kind"], product["slow"], product["page_price"]) == (
            "plain",
            False,
            product["price"],
        )
        assert product["sku"] == f"SKU-{pid:06d}"
        assert set(product["categories"]) <= set(slugs)
        assert product["breadcrumb"] == ["Home", slugs[product["categories"][0]]]
    for old_category, new_category in zip(before["categories"], after["categories"], strict=True):
        slug = old_category["slug"]
        assert new_category["product_ids"] == [
            pid for pid in old_category["product_ids"] if pid not in changes["removed"]
        ] + [pid for pid in changes["added"] if slug in new[pid]["categories"]]


def test_removed_products_are_gone_and_added_ones_are_served_and_listed(
    epoch0: ShopServer,
) -> None:
    epoch0.set_epoch(1)
    payload = epoch0.catalogue()
    products = _by_id(payload)
    changes = payload["changes"]
    assert changes["removed"]
    assert changes["added"]
    for pid in changes["removed"]:
        assert epoch0.fetch(f"/product/{pid}").status == 404
        assert epoch0.fetch(f"/img/{pid}-1.jpg").status == 404
    for pid in changes["added"]:
        _assert_shows(epoch0.fetch(f"/product/{pid}"), products[pid])
        assert epoch0.fetch(products[pid]["images"][0]).status == 200
    listed = _listed(epoch0, payload)
    assert set(listed) == set(products)
    for pid, slugs in listed.items():
        assert slugs == set(products[pid]["categories"]), pid

    stats = epoch0.stats()
    assert stats["epoch"] == 1
    assert stats["products"] == len(products)
    assert set(stats["expected"]["plain"]) == set(_plain(payload))

    # The API serves the same epoch: an added product is on the last page of its category.
    newest = products[changes["added"][-1]]
    category = next(c for c in payload["categories"] if c["slug"] == newest["categories"][0])
    body = f'{{"category": "{category["slug"]}", "page": {category["pages"]}}}'.encode()
    answer = epoch0.fetch("/api/products", body).json()
    assert newest["id"] in [p["id"] for p in answer["products"]]


def test_changed_products_show_their_new_price_and_availability(epoch0: ShopServer) -> None:
    before = _by_id(epoch0.catalogue())
    epoch0.set_epoch(1)
    payload = epoch0.catalogue()
    after, changes = _by_id(payload), payload["changes"]
    for pid in changes["price"][:5] + changes["availability"][:5]:
        _assert_shows(epoch0.fetch(f"/product/{pid}"), after[pid])
    for pid in changes["price"][:5]:
        assert after[pid]["price"] != before[pid]["price"]
    for pid in changes["availability"][:5]:
        assert {after[pid]["availability"], before[pid]["availability"]} == {
            "in stock",
            "out of stock",
        }


def test_set_epoch_at_runtime_and_the_diff_of_any_two_epochs(epoch0: ShopServer) -> None:
    assert epoch0.epoch() == 0
    epoch0.set_epoch(3)
    assert epoch0.epoch() == 3
    assert epoch0.stats()["epoch"] == 3
    payload = epoch0.catalogue()
    assert payload["epoch"] == 3
    assert payload["changes"] == {"since": 2, **_expected_changes(epoch0.catalogue(2), payload)}
    with ShopServer(PRODUCTS, seed=SEED, epoch=3, **KINDS) as fresh:
        assert fresh.catalogue() == payload, "epochs are derived the same way every time"

    forward, backward = epoch0.changes(since=0), epoch0.changes(since=3, epoch=0)
    assert forward == {"epoch": 3, "since": 0, **_expected_changes(epoch0.catalogue(0), payload)}
    assert epoch0.catalogue(since=0)["changes"] == {
        "since": 0,
        **_expected_changes(epoch0.catalogue(0), payload),
    }
    assert (backward["added"], backward["removed"]) == (forward["removed"], forward["added"])
    assert (backward["price"], backward["availability"]) == (
        forward["price"],
        forward["availability"],
    )
    assert epoch0.changes(since=3) == {"epoch": 3, "since": 3, **_NO_CHANGES}
    assert epoch0.changes(epoch=1) == {"epoch": 1, **epoch0.catalogue(1)["changes"]}
    assert epoch0.fetch(f"/product/{forward['added'][-1]}").status == 200
    assert epoch0.fetch(f"/product/{forward['removed'][0]}").status == 404

    for bad in (-1, MAX_EPOCH + 1, 10**30):
        with pytest.raises(ValueError, match="epoch must be within"):
            epoch0.set_epoch(bad)
    assert epoch0.epoch() == 3, "a refused epoch changes nothing"
    counted = epoch0.stats()["total"]
    for path in (
        "/_epoch?set=abc",
        "/_epoch?set=" + "9" * 5000,
        "/_catalogue?since=x",
        "/_catalogue?epoch=-2",
        "/_changes?epoch=1.5",
        "/_changes?since=%FF",
    ):
        refused = epoch0.fetch(path)
        assert refused.status == 400, path
        assert "error" in refused.json()
    assert epoch0.stats()["total"] == counted, "control endpoints are not counted"


def test_epochs_are_deterministic_cumulative_and_never_reuse_an_id() -> None:
    base = generate_catalogue(200, 5, js_share=0.2, broken_share=0.1)
    history = CatalogueHistory(base, EpochShares())
    again = CatalogueHistory(
        generate_catalogue(200, 5, js_share=0.2, broken_share=0.1), EpochShares()
    )
    assert again.at(6) == history.at(6)
    assert history.at(0) is base
    other = CatalogueHistory(
        generate_catalogue(200, 6, js_share=0.2, broken_share=0.1), EpochShares()
    )
    assert other.changes(0, 1) != history.changes(0, 1)
    assert history.changes(4, 4) == diff(history.at(4), history.at(4)) == Changes()
    seen = {p.id for p in base.products}
    for epoch in range(1, 21):
        added = history.changes(epoch - 1, epoch).added
        assert not seen & set(added), epoch
        seen |= set(added)
        catalogue = history.at(epoch)
        listed = {pid for c in catalogue.categories for pid in c.product_ids}
        assert listed == {p.id for p in catalogue.products}
    # Only plain products change: every other kind is as generated, twenty epochs on.
    for product in base.products:
        if product.kind != "plain":
            assert history.at(20).product(product.id) == product


@pytest.mark.parametrize("products", [1, 5, 40])
def test_extreme_shares_still_give_a_consistent_catalogue(products: int) -> None:
    history = CatalogueHistory(generate_catalogue(products, 1), EpochShares(1.0, 1.0, 1.0, 1.0))
    for epoch in range(1, 30):
        catalogue = history.at(epoch)
        ids = [p.id for p in catalogue.products]
        assert ids == sorted(set(ids))
        assert {pid for c in catalogue.categories for pid in c.product_ids} == set(ids)
        assert history.changes(epoch - 1, epoch).removed == tuple(
            history.at(epoch - 1).ids_of_kind("plain")
        )
    gone = CatalogueHistory(generate_catalogue(products, 1), EpochShares(0, 0, 0, 1.0)).at(2)
    assert gone.products == ()
    assert [c.product_ids for c in gone.categories] == [()] * len(gone.categories)


def test_changed_at_is_the_epoch_since_which_a_page_is_the_same() -> None:
    history = CatalogueHistory(generate_catalogue(100, 2), EpochShares(price=0.3))

    def changes_in(pid: int) -> list[bool]:
        """Whether product *pid* differs from the epoch before, for epochs 1 to 5."""
        versions = [history.at(epoch).product(pid) for epoch in range(6)]
        return [versions[e] != versions[e - 1] for e in range(1, 6)]

    products = [p.id for p in history.at(0).products]
    pid = next(p for p in products if changes_in(p) == [False, True, False, False, False])
    untouched = next(p for p in products if not any(changes_in(p)))
    for epoch, expected in [(0, 0), (1, 0), (2, 2), (5, 2)]:
        assert history.changed_at(("product", pid), epoch, lambda c: c.product(pid)) == expected
    for epoch in (5, 3, 0):
        assert (
            history.changed_at(("product", untouched), epoch, lambda c: c.product(untouched)) == 0
        )


@pytest.mark.parametrize(
    "argv",
    [
        ["--epoch", "-1"],
        ["--epoch", str(MAX_EPOCH + 1)],
        ["--epoch", "x"],
        ["--epoch-price-share", "1.5"],
        ["--epoch-stock-share", "-0.1"],
        ["--epoch-added", "nan"],
        ["--epoch-removed", "2"],
    ],
)
def test_epoch_options_are_checked(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_epoch_options_parse() -> None:
    config = parse_args([])
    assert (
        config.epoch,
        config.epoch_price_share,
        config.epoch_stock_share,
        config.epoch_added,
        config.epoch_removed,
    ) == (0, 0.10, 0.05, 0.02, 0.02)
    config = parse_args(["--epoch", "4", "--epoch-price-share", "0.5", "--epoch-added", "0.1"])
    assert (config.epoch, config.epoch_price_share, config.epoch_added) == (4, 0.5, 0.1)
    assert config.as_dict()["epoch"] == 4


# -- validators and conditional requests --------------------------------------------------------


def _validated_paths(payload: dict[str, Any], expected: dict[str, list[int]]) -> list[str]:
    category = payload["categories"][0]
    return [
        "/",
        category["url"],
        f"/category/{category['slug']}?page={category['pages']}",
        f"/product/{expected['plain'][0]}",
        f"/product/{expected['malformed'][0]}",
        "/sitemap.xml",
        "/sitemaps/articles-1.xml.gz",
    ]


def test_pages_carry_validators(epoch0: ShopServer) -> None:
    expected = epoch0.stats()["expected"]
    for path in _validated_paths(epoch0.catalogue(), expected):
        page = epoch0.fetch(path)
        assert page.status == 200, path
        assert _ETAG.fullmatch(page.headers["etag"]), path
        assert page.headers["etag"] == entity_tag(page.body).decode(), path
        assert page.headers["last-modified"] == _day(0), path
        assert page.headers["cache-control"] == "no-cache", path
        assert _validators(epoch0.fetch(path + "&utm_source=x" if "?" in path else path)) == (
            _validators(page)
        ), path
    js, flaky, broken = expected["js"][0], expected["flaky"][0], expected["broken"][0]
    unvalidated = [
        f"/product/{js}",
        *[f"/product/{flaky}?try={i}" for i in range(3)],  # 503, 503, then 200
        f"/product/{broken}",
        "/robots.txt",
        "/img/1-1.jpg",
        "/api/categories",
        "/nope",
        f"/product/{PRODUCTS + 1000}",
    ]
    for path in unvalidated:
        headers = epoch0.fetch(path).headers
        assert "etag" not in headers, path
        assert "last-modified" not in headers, path
    assert epoch0.fetch(f"/product/{flaky}").status == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"If-None-Match": "{etag}"}, 304),
        ({"If-None-Match": "W/{etag}"}, 304),
        ({"If-None-Match": '"stale", {etag}'}, 304),
        ({"If-None-Match": "*"}, 304),
        ({"If-Modified-Since": "{modified}"}, 304),
        ({"If-Modified-Since": "{later}"}, 304),
        ({"If-None-Match": "{etag}", "If-Modified-Since": "{earlier}"}, 304),
        ({"If-Modified-Since": "{earlier}"}, 200),
        ({"If-None-Match": '"stale"'}, 200),
        ({"If-None-Match": "{etag}x"}, 200),
        # If-None-Match decides alone: a stale ETag is a 200 whatever If-Modified-Since says.
        ({"If-None-Match": '"stale"', "If-Modified-Since": "{later}"}, 200),
    ],
)
def test_conditional_requests(epoch0: ShopServer, headers: dict[str, str], status: int) -> None:
    values = {
        "modified": _day(0),
        "later": _day(30),
        "earlier": format_datetime(BASE_TIME - dt.timedelta(seconds=1), usegmt=True),
    }
    for path in _validated_paths(epoch0.catalogue(), epoch0.stats()["expected"]):
        page = epoch0.fetch(path)
        sent = {
            name: value.format(etag=page.headers["etag"], **values)
            for name, value in headers.items()
        }
        answer = epoch0.fetch(path, headers=sent)
        assert answer.status == status, (path, sent)
        assert _validators(answer) == _validators(page)
        if status == 304:
            assert answer.body == b""
            assert "content-length" not in answer.headers
            assert "content-type" not in answer.headers
        else:
            assert answer.body == page.body


def test_head_and_post_with_validators(epoch0: ShopServer) -> None:
    path = f"/product/{epoch0.stats()['expected']['plain'][0]}"
    etag = epoch0.fetch(path).headers["etag"]
    assert epoch0.fetch(path, method="HEAD", headers={"If-None-Match": etag}).status == 304
    # Only a GET or a HEAD is answered 304.
    assert epoch0.fetch(path, b"x", headers={"If-None-Match": etag}).status == 200


def test_an_unchanged_page_keeps_its_validators_across_epochs(epoch0: ShopServer) -> None:
    one, two = epoch0.changes(since=0, epoch=1), epoch0.changes(since=1, epoch=2)
    touched_one = set(one["price"]) | set(one["availability"]) | set(one["removed"])
    touched_two = set(two["price"]) | set(two["availability"]) | set(two["removed"])
    plain = epoch0.stats()["expected"]["plain"]
    unchanged = next(pid for pid in plain if pid not in touched_one | touched_two)
    changed = next(pid for pid in one["price"] if pid not in touched_two)
    payload = epoch0.catalogue()
    gone = one["removed"][0]
    home = next(c for c in payload["categories"] if gone in c["product_ids"])
    listing = f"/category/{home['slug']}?page={home['product_ids'].index(gone) // 20 + 1}"
    paths = {
        "unchanged": f"/product/{unchanged}",
        "changed": f"/product/{changed}",
        "root": "/",
        "listing": listing,
    }
    before = {name: epoch0.fetch(path) for name, path in paths.items()}
    assert {name: page.headers["last-modified"] for name, page in before.items()} == dict.fromkeys(
        paths, _day(0)
    )

    epoch0.set_epoch(1)
    after = {name: epoch0.fetch(path) for name, path in paths.items()}
    for name in ("unchanged", "root"):
        assert _validators(after[name]) == _validators(before[name]), name
        assert after[name].body == before[name].body
    for name in ("changed", "listing"):
        assert after[name].headers["etag"] != before[name].headers["etag"], name
        assert after[name].headers["last-modified"] == _day(1), name
    for name, page in before.items():
        etag, modified = _validators(page)
        again = 304 if name in ("unchanged", "root") else 200
        assert epoch0.fetch(paths[name], headers={"If-None-Match": etag}).status == again, name
        assert epoch0.fetch(paths[name], headers={"If-Modified-Since": modified}).status == again

    epoch0.set_epoch(2)
    later = epoch0.fetch(paths["changed"])
    assert _validators(later) == _validators(after["changed"]), "changed in 1, not since"
    etag = after["changed"].headers["etag"]
    assert epoch0.fetch(paths["changed"], headers={"If-None-Match": etag}).status == 304


def test_a_conditional_recrawl_sends_only_what_changed(epoch0: ShopServer) -> None:
    plain = epoch0.stats()["expected"]["plain"]
    first = {pid: epoch0.fetch(f"/product/{pid}") for pid in plain}
    first_bytes = epoch0.stats()["body_bytes"]
    assert first_bytes == sum(len(page.body) for page in first.values())

    epoch0.set_epoch(1)
    epoch0.reset()
    changes = epoch0.changes()
    second = {
        pid: epoch0.fetch(f"/product/{pid}", headers={"If-None-Match": page.headers["etag"]})
        for pid, page in first.items()
    }
    changed = set(changes["price"]) | set(changes["availability"])
    by_status: dict[int, set[int]] = {}
    for pid, page in second.items():
        by_status.setdefault(page.status, set()).add(pid)
    assert by_status == {
        304: set(plain) - changed - set(changes["removed"]),
        200: changed,
        404: set(changes["removed"]),
    }
    stats = epoch0.stats()
    assert stats["conditional"] == len(plain)
    assert stats["not_modified"] == len(by_status[304])
    assert stats["statuses"]["304"] == len(by_status[304])
    assert stats["body_bytes"] == sum(len(page.body) for page in second.values())
    assert stats["body_bytes"] < first_bytes / 2


def test_stats_count_not_modified_and_body_bytes(epoch0: ShopServer) -> None:
    path = f"/product/{epoch0.stats()['expected']['plain'][0]}"
    page = epoch0.fetch(path)
    etag = {"If-None-Match": page.headers["etag"]}
    assert epoch0.fetch(path, headers=etag).status == 304
    assert epoch0.fetch(path, method="HEAD", headers=etag).status == 304
    assert epoch0.fetch(path, method="HEAD").status == 200
    root, missing = epoch0.fetch("/"), epoch0.fetch("/nope")
    stats = epoch0.stats()
    assert stats["statuses"] == {"200": 3, "304": 2, "404": 1}
    assert (stats["not_modified"], stats["conditional"]) == (2, 2)
    assert stats["body_bytes"] == len(page.body) + len(root.body) + len(missing.body)
    epoch0.reset()
    stats = epoch0.stats()
    assert (stats["not_modified"], stats["conditional"], stats["body_bytes"]) == (0, 0, 0)


def test_latency_and_slow_pages_delay_304s_as_they_do_200s() -> None:
    with ShopServer(20, latency_ms=200, slow_share=0.5, slow_ms=300) as server:
        slow = set(server.stats()["expected"]["slow"])
        fast = next(pid for pid in range(1, 21) if pid not in slow)
        for pid, least in ((fast, 0.2), (min(slow), 0.5)):
            etag = server.fetch(f"/product/{pid}").headers["etag"]
            started = time.monotonic()
            assert server.fetch(f"/product/{pid}", headers={"If-None-Match": etag}).status == 304
            assert time.monotonic() - started >= least, pid
        server.reset()
        etag = server.fetch("/").headers["etag"]
        assert server.fetch("/", headers={"If-None-Match": etag}).status == 304
        for arrival, finish, *_ in server.timeline():
            assert finish is not None
            assert finish >= arrival + 0.2
        assert server.stats()["body_bytes"] > 0


# -- hostile validators -------------------------------------------------------------------------


def _raw_get(port: int, path: str, header: bytes) -> bytes:
    """The whole answer to a GET carrying *header* (a raw header line), or what came of it."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n".encode()
        + header
        + b"\r\n\r\n"
    )
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            conn.sendall(request)
            while chunk := conn.recv(65536):
                answer += chunk
        except OSError:  # the shop refused the request and closed while it was being sent
            pass
    return answer


_GARBAGE: list[bytes] = [
    b"x" * 12_000,
    b'"' + b"a" * 12_000 + b'"',
    b'"a", ' * 2_000,
    b"9" * 5_000,
    '"é", "ü"'.encode(),
    "Mié, 01 Ene 2025 00:00:00 GMT".encode(),
    b"\xff\xfe\x80\x81",
    b"Wed, 32 Jan 2025 00:00:00 GMT",
    b"Wed, 01 Jan 99999 00:00:00 GMT",
    b"Wed, 01 Jan 2025 99:99:99 GMT",
    b"Wed, 01 Jan 2025 00:00:00 +9999",
    b"Wed, 01 Foo 2030 00:00:00 GMT",
    b"-1",
    b"0",
    b"W/",
    b'"',
    b",,,",
    b"*, *",
    b"\t",
]


@pytest.mark.parametrize("name", [b"If-None-Match", b"If-Modified-Since"])
@pytest.mark.parametrize("value", _GARBAGE, ids=lambda v: repr(v[:24]))
def test_garbage_validators_get_a_normal_200(epoch0: ShopServer, name: bytes, value: bytes) -> None:
    path = f"/product/{epoch0.stats()['expected']['plain'][0]}"
    page = epoch0.fetch(path)
    answer = _raw_get(epoch0.port, path, name + b": " + value)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head[:200]
    assert body == page.body
    assert epoch0.stats()["statuses"] == {"200": 2}


@pytest.mark.parametrize(
    "header",
    [b"If-None-Match: a\x00b", b"If-Modified-Since: " + b"x" * 20_000],
    ids=["nul", "over-twisted's-16-KiB"],
)
def test_validators_twisted_refuses_are_no_server_error(epoch0: ShopServer, header: bytes) -> None:
    answer = _raw_get(epoch0.port, "/", header)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert epoch0.fetch("/").status == 200
    assert epoch0.stats()["statuses"] == {"200": 1}


_ETAG_VALUE = b'"0123456789abcdef0123456789abcdef"'


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.binary(max_size=200), max_size=3),
    st.lists(st.binary(max_size=200) | st.text(max_size=60).map(str.encode), max_size=3),
)
def test_not_modified_takes_any_header_value(
    if_none_match: list[bytes], if_modified_since: list[bytes]
) -> None:
    answer = not_modified(_ETAG_VALUE, BASE_TIME, if_none_match, if_modified_since)
    assert isinstance(answer, bool)
    joined = b",".join(if_none_match)
    if if_none_match and _ETAG_VALUE not in joined and b"*" not in joined:
        assert answer is False, "only the ETag or * matches"
    if not if_none_match and len(if_modified_since) != 1:
        assert answer is False, "no date, or two"


@settings(max_examples=200, deadline=None, database=None)
@given(st.datetimes(min_value=dt.datetime(1900, 1, 1), timezones=st.just(dt.UTC)))
def test_if_modified_since_compares_dates(when: dt.datetime) -> None:
    header = format_datetime(when, usegmt=True).encode()
    expected = when.replace(microsecond=0) >= BASE_TIME
    assert not_modified(_ETAG_VALUE, BASE_TIME, [], [header]) is expected
