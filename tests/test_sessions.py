"""The fleet's sessions and proxies: two nodes' pools stepping through a real Redis
(lua/step/sessions.lua), then real ``scrapy crawl`` nodes through real local proxies against
the test shop defending itself."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler

from project.blocking.config import SessionConfig, parse_proxy_pool
from project.blocking.last_hop import SessionLastHopMiddleware, dress
from project.blocking.pool import Session, SessionPool, SessionRetired
from project.frontier.queue import LeasedQueue, StepBatch
from tests.fleet import run_cli
from tests.site.proxies import ProxyRig
from tests.site.stats import open_at_once
from tests.test_frontier_step import run

if TYPE_CHECKING:
    import pymongo.database
    import redis as sync_redis

    from project.frontier.keys import FrontierKeys
    from tests.fleet import Fleet

P1, P2, P3 = "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"


def _pool(**settings: Any) -> SessionPool:
    given = {"PROXY_POOL": [P1, P2], "SESSION_POOL_SIZE": 2, **settings}
    return SessionPool(SessionConfig.from_settings(Settings(given), environ={}))


async def _step(queue: LeasedQueue, pool: SessionPool) -> None:
    entries = pool.take_entries()
    result = await queue.step(StepBatch(sessions=entries, session_options=pool.options(entries)))
    pool.apply(result.sessions, result.retired, result.probes)


def _done(pool: SessionPool, session: Session, blocked: bool) -> None:
    """A download through *session* is over: it left the downloader, a page or a block."""
    pool.left(session)
    pool.ended(session, blocked)


def _picked(pool: SessionPool, site: str = "s") -> Session:
    pick = pool.pick(site)
    assert pick.session is not None, pick
    pool.started(pick.session)
    return pick.session


def test_a_session_retired_by_one_node_is_gone_for_the_other_at_its_next_step(
    redis_url: str, redis_client: sync_redis.Redis, keys: FrontierKeys
) -> None:
    a = _pool(SESSION_MAX_ERROR_SCORE=2, PROXY_BAN_SCORE=10)
    b = _pool(SESSION_MAX_ERROR_SCORE=2, PROXY_BAN_SCORE=10)

    async def scenario(qa: LeasedQueue, qb: LeasedQueue) -> None:
        assert a.pick("s").session is None, "no pair tried yet: a probe of the fleet's first"
        await _step(qa, a)
        first, second = _picked(a), _picked(a)
        assert {first.proxy, second.proxy} == {P1, P2}, "spread over the proxies"
        for session in (first, second):
            _done(a, session, False)
        await _step(qa, a)
        b.pick("s")  # b's first request of the site: it asks for the fleet's sessions
        await _step(qb, b)
        assert {s.id for s in b._views["s"].sessions.values()} == {first.id, second.id}
        # blocks through the first one retire the session at SESSION_MAX_ERROR_SCORE (a page
        # takes 0.5 off; a page between blocks keeps its proxy from a ban)
        for blocked in (True, False, True, False, True):
            a.started(first)
            _done(a, first, blocked)
        assert first.id in a._views["s"].retired, "the reporting node retires it at once"
        await _step(qa, a)
        await _step(qb, b)
        assert first.id not in b._views["s"].sessions, "the other node, at its next step"
        for _ in range(20):
            assert _picked(b).id != first.id

    run(redis_url, keys, scenario)
    retired = redis_client.zrange(f"{keys.sessions}:retired", 0, -1)
    assert retired == [f"s\n{a._views['s'].retired.pop()}".encode()]
    last = json.loads(redis_client.hget(f"{keys.sessions}:retired:last", retired[0]))
    assert last["e"] == 2
    assert last["u"] == 6


def test_a_pair_banned_on_probation_costs_the_fleet_one_request_and_cools_down_for_all(
    redis_url: str, keys: FrontierKeys
) -> None:
    a, b = _pool(SESSION_POOL_SIZE=4), _pool(SESSION_POOL_SIZE=4)

    async def scenario(qa: LeasedQueue, qb: LeasedQueue) -> None:
        a.pick("s")
        await _step(qa, a)  # a holds the probes of both pairs
        b.pick("s")
        await _step(qb, b)
        assert b.pick("s").session is None, "another node probes them: b waits"
        through_p1, through_p2 = sorted((_picked(a), _picked(a)), key=lambda s: s.proxy)
        assert (through_p1.proxy, through_p2.proxy) == (P1, P2)
        held = a.pick("s")
        assert held.session is None, "one download of the fleet at a time on probation"
        assert held.wait < 1
        _done(a, through_p1, True)  # P1 is banned for "s"
        _done(a, through_p2, False)
        await _step(qa, a)
        await _step(qb, b)
        for pool in (a, b):
            for _ in range(10):
                assert _picked(pool).proxy == P2
        assert b.describe("s")["cooling"] == [P1]

    run(redis_url, keys, scenario)


def test_a_node_with_nothing_of_the_site_to_fetch_lets_its_probes_go(
    redis_url: str, keys: FrontierKeys
) -> None:
    """The node that asked first holds the pairs on probation only while a request of the
    site waits on it: idle, it lets them go, and the node whose request waits takes them (it
    waited for a minute before: the seed page had gone to the node without the probes)."""
    a, b = _pool(), _pool()

    async def scenario(qa: LeasedQueue, qb: LeasedQueue) -> None:
        a.pick("s")
        await _step(qa, a)
        b.pick("s")
        await _step(qb, b)
        assert b.pick("s").session is None, "a holds both probes"
        a._views["s"].wanted -= 60  # a's requests of the site went, a minute ago
        await _step(qa, a)
        await _step(qb, b)
        assert _picked(b).proxy in (P1, P2)

    run(redis_url, keys, scenario)


def test_every_proxy_cooling_means_waiting_for_the_first_to_come_back(
    redis_url: str, keys: FrontierKeys
) -> None:
    a = _pool(PROXY_COOLDOWN_BASE=100, PROXY_COOLDOWN_MAX=100)

    async def scenario(qa: LeasedQueue, _: LeasedQueue) -> None:
        a.pick("s")
        await _step(qa, a)
        for _ in range(2):
            _done(a, _picked(a), True)
        pick = a.pick("s")
        assert pick.session is None
        assert 0 <= pick.wait <= 100
        await _step(qa, a)
        assert a.pick("s").session is None, "the fleet's cool-downs as the node saw them"

    run(redis_url, keys, scenario)


def test_tiers_escalate_when_one_is_banned() -> None:
    pool = _pool(PROXY_POOL=[[None], [P1, P2], [P3]], SESSION_POOL_SIZE=1)
    pool.random.random = lambda: 0.5  # type: ignore[method-assign] (a cool-down of 300 s)
    pool.pick("s")
    pool.apply([], probes=[("s", ""), ("s", P1), ("s", P2), ("s", P3)])  # as a step grants
    direct = pool.pick("s")
    assert direct.session is not None
    assert direct.session.proxy == ""
    assert direct.proxy is not None
    assert direct.proxy.url == ""
    pool.started(direct.session)
    _done(pool, direct.session, True)
    datacenter = pool.pick("s")
    assert datacenter.session is not None
    assert datacenter.session.proxy in (P1, P2)
    assert pool.describe("s")["tier"] == 1


def test_a_pinned_session_is_kept_and_a_retired_one_refused(
    redis_url: str, keys: FrontierKeys
) -> None:
    a, b = _pool(SESSION_MAX_ERROR_SCORE=1), _pool()

    async def scenario(qa: LeasedQueue, qb: LeasedQueue) -> None:
        a.pick("s")
        await _step(qa, a)
        for _ in range(2):  # the site's pool is full: a pinned one is taken all the same
            _done(a, _picked(a), False)
        login = a.pick("s", pinned="login").session
        assert login is not None
        assert login.id == "login"
        a.started(login)
        _done(a, login, False)
        await _step(qa, a)
        b.pick("s")
        await _step(qb, b)
        assert "login" in b._views["s"].sessions
        again = b.pick("s", pinned="login").session
        assert again is not None
        assert again.id == "login"
        b.started(again)
        _done(b, again, True)
        a.started(login)
        _done(a, login, True)  # SESSION_MAX_ERROR_SCORE 1 at a: retired
        await _step(qa, a)
        with pytest.raises(SessionRetired):
            a.pick("s", pinned="login")

    run(redis_url, keys, scenario)


def test_the_spiders_request_cookies_go_into_its_sessions_jar(
    redis_url: str, keys: FrontierKeys
) -> None:
    pool = _pool(PROXY_POOL=[None])
    crawler = get_crawler(Spider, {"PROXY_POOL": [None]})
    crawler.stats = StatsCollector(crawler)
    last_hop = SessionLastHopMiddleware(crawler, pool)

    async def scenario(queue: LeasedQueue, _: LeasedQueue) -> None:
        pool.pick("127.0.0.1:8000")
        await _step(queue, pool)
        pick = pool.pick("127.0.0.1:8000")
        assert pick.session is not None, pick
        with_cookies = Request("http://127.0.0.1:8000/account", cookies={"lang": "de", "cart": "7"})
        session = dress(with_cookies, pool, pick)
        assert last_hop.process_request(with_cookies) is None
        assert with_cookies.headers[b"Cookie"] in (b"cart=7; lang=de", b"lang=de; cart=7")
        # the session keeps them: a later request of the site, without cookies of its own
        later = Request("http://127.0.0.1:8000/basket")
        dress(later, pool, pick)
        assert last_hop.process_request(later) is None
        assert b"lang=de" in later.headers[b"Cookie"]
        assert {c.name for c in session.jar} == {"lang", "cart"}
        # cookies Scrapy cannot read cost only themselves: counted, the request goes with
        # the session's
        for odd_cookies in ([{"value": "no name"}], {"a": {"nested": 1}}, [["x"]]):
            odd = Request("http://127.0.0.1:8000/odd", cookies=odd_cookies)  # type: ignore[arg-type]
            dress(odd, pool, pick)
            assert last_hop.process_request(odd) is None
            assert b"lang=de" in odd.headers[b"Cookie"]
        assert crawler.stats.get_value("sessions/cookies_refused") == 2
        assert {c.name for c in session.jar} == {"lang", "cart"}

    run(redis_url, keys, scenario)


def test_proxy_credentials_come_from_the_environment_and_are_masked() -> None:
    tiers = parse_proxy_pool(
        ["http://crawler:${PROXY_SECRET}@127.0.0.1:9001", "direct"], {"PROXY_SECRET": "s3cr3t"}
    )
    proxy = tiers[0][0]
    assert proxy.url == "http://crawler:s3cr3t@127.0.0.1:9001"
    assert proxy.id == "http://127.0.0.1:9001"  # no user name either: often the account's
    assert tiers[0][1].url == ""
    with pytest.raises(NotConfigured, match=r"\$\{PROXY_SECRET\}") as caught:
        parse_proxy_pool(["http://crawler:${PROXY_SECRET}@127.0.0.1:9001"], {})
    assert "s3cr3t" not in str(caught.value)
    assert parse_proxy_pool('["http://a:1", "http://b:2"]', {})[0][1].id == "http://b:2"
    assert [[p.id for p in t] for t in parse_proxy_pool([[None], ["http://a:1"]], {})] == [
        [""],
        ["http://a:1"],
    ]
    gateway = parse_proxy_pool(["http://u1:p@gw:7000", "http://u2:p@gw:7000"], {})[0]
    assert [p.id for p in gateway] == ["http://gw:7000", "http://gw:7000#2"]
    for bad in (["ftp://a:1"], ["http://a:1", "http://a:1"], [[]], 5, "[nope"):
        with pytest.raises(NotConfigured):
            parse_proxy_pool(bad, {})
    assert SessionConfig.from_settings(Settings({"PROXY_POOL": ["http://a:1"]}), {}).enabled
    assert not SessionConfig.from_settings(Settings(), os.environ.copy()).enabled


_SECRET = "pr0xy-s3cr3t"


def _redis_text(client: sync_redis.Redis, prefix: str) -> bytes:
    """Everything the test's keys hold, as bytes, to look for what must not be there."""
    found = []
    for key in client.scan_iter(match=f"*{prefix}*", count=1000):
        kind = client.type(key)
        if kind == b"string":
            found.append(client.get(key) or b"")
        elif kind == b"hash":
            found += [k + v for k, v in client.hgetall(key).items()]
        elif kind == b"list":
            found += client.lrange(key, 0, -1)
        elif kind in (b"set", b"zset"):
            found += list(client.zrange(key, 0, -1) if kind == b"zset" else client.smembers(key))
        found.append(key)
    return b"\n".join(found)


@pytest.mark.crawl
@pytest.mark.slow("two nodes through proxies that ban, until every product is stored")
def test_two_nodes_through_proxies_store_each_product_once_and_bans_cost_little(
    fleet: Fleet,
    make_shop,
    mongo: pymongo.database.Database[Any],
    redis_client: sync_redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ProxyRig(5, auth=f"crawler:{_SECRET}") as rig:
        banned = {rig.sources[0]: "challenge", rig.sources[1]: "403"}
        shop = make_shop(products=150, ban=[f"{a}={answer}" for a, answer in banned.items()])
        monkeypatch.setenv("RIG_PROXY_PASSWORD", _SECRET)
        pool = [url.replace(_SECRET, "${RIG_PROXY_PASSWORD}") for url in rig.urls]
        settings = {
            "PROXY_POOL": pool,
            "SESSION_MAX_USES": 10,  # sessions retire during the crawl
            "BLOCK_REQUIRED_CSS": {"*": "header .home"},
            "FRONTIER_SITE_CONCURRENCY": 4,
            "FRONTIER_RETRY_BACKOFF_BASE": 0.1,
        }
        fleet.start_node(**settings)
        fleet.start_node(**settings)
        fleet.seed(shop.url("/"))
        assert fleet.wait(240) == [0, 0]
        stats = shop.stats()
        proxied = rig.stats()

    assert mongo.products.count_documents({}) == 150
    assert (
        mongo.products.count_documents({"name": {"$regex": "moment|denied", "$options": "i"}}) == 0
    )
    assert redis_client.llen(fleet.keys.dead) == 0
    visits = stats["visits"]
    served = [v for v in visits if v[3] == "ok" and v[4].startswith("/product/")]
    assert len(served) == 150
    assert len({v[4] for v in served}) == 150, "a product page was served twice"
    # a banned (proxy, site) pair: one request from each node before the fleet knows
    for address in banned:
        assert sum(stats["clients"].get(address, {}).values()) <= 3, stats["clients"]
    assert {v[1] for v in served} <= set(rig.sources[2:])
    assert all(p["refused"] == 0 for p in proxied), "a request without the proxy's credentials"
    # counted at the shop: never more than the site's cap open at once, across all proxies
    assert open_at_once(shop.timeline()) <= 4
    # a retired session's visitor is not seen after the step that retired it (the other node
    # learns at its next step: well within a second here)
    retired = redis_client.zrange(f"{fleet.keys.sessions}:retired", 0, -1, withscores=True)
    assert retired, "SESSION_MAX_USES=10 retires sessions"
    last = redis_client.hgetall(f"{fleet.keys.sessions}:retired:last")
    late = []
    for member, at_ms in retired:
        cookies = json.loads(last[member])["c"]
        visitor = next((c[1] for c in json.loads(cookies or "[]") if c[0] == "visitor"), None)
        if visitor is None:
            continue
        late += [v for v in visits if v[2] == visitor and v[0] > at_ms / 1000 + 1.0]
    assert late == [], "a retired session was used"
    # the proxies' password is in no log line and nowhere in Redis
    for index in (0, 1):
        assert _SECRET not in fleet.log(index)
    assert _SECRET.encode() not in _redis_text(redis_client, fleet.space.prefix)
    node = [fleet.stats(i) for i in (0, 1)]
    assert sum(n.get("blocks/count", 0) for n in node) == sum(
        n for a in banned for n in stats["clients"].get(a, {}).values()
    )
    _the_fleets_view_shows_the_bans(fleet, pool, shop.url("/"), banned=rig.urls[:2])


def _the_fleets_view_shows_the_bans(
    fleet: Fleet, pool: list[str], site_url: str, banned: list[str]
) -> None:
    """fleetcrawl proxies and status --json: each proxy's health and bans (the banned pairs
    cooling down), the site's block rate, tier and sessions; reset ends the bans."""
    env = {"REDIS_URL": fleet.redis_url}  # no password: a reader's proxy ids are masked
    given = [*fleet.space.cli_args(), "-s", f"PROXY_POOL={json.dumps(pool)}"]
    listed = run_cli("proxies", "--json", *given, env=env)
    assert listed.returncode == 0, listed.stderr
    view = json.loads(listed.stdout)
    masked = [url.replace(f"crawler:{_SECRET}@", "") for url in banned]
    by_proxy = {row["proxy"]: row for row in view["proxies"]}
    for proxy in masked:
        assert by_proxy[proxy]["bans"] >= 1, by_proxy
        assert by_proxy[proxy]["health"] == 0.0, by_proxy[proxy]
    healthy = [row for proxy, row in by_proxy.items() if proxy not in masked]
    assert healthy
    assert all(row["health"] == 1.0 and not row["cooling"] for row in healthy)
    [site] = view["sites"]
    assert site["site"] in site_url
    assert site["tier"] == 0
    assert site["sessions"] >= 1
    assert 0 < site["block_rate"] < 0.5
    assert _SECRET not in listed.stdout
    assert "crawler" not in listed.stdout
    status = run_cli("status", "--json", *given, env=env)
    assert status.returncode == 0, status.stderr
    [row] = json.loads(status.stdout)["blocking"]["sites"]
    assert row["blocks"] >= 2
    assert row["responses"] > row["blocks"]
    assert row["sessions"] >= 1
    assert set(row["cooling"]) <= set(masked)  # a cool-down may be over (full jitter)
    assert {p["proxy"] for p in json.loads(status.stdout)["blocking"]["proxies"]} == set(by_proxy)
    _the_dashboard_shows_the_bans(fleet, given, masked)
    reset = run_cli("proxies", "reset", *given, env=env)
    assert reset.returncode == 0, reset.stderr
    assert f"reset {len(by_proxy)} (proxy, site) records" in reset.stdout
    again = json.loads(run_cli("proxies", "--json", *given, env=env).stdout)
    assert again["proxies"] == []
    assert all(not s["cooling"] for s in again["sites"])


def _the_dashboard_shows_the_bans(fleet: Fleet, given: list[str], masked: list[str]) -> None:
    """The dashboard's table of blocks and proxies, drawn by Chromium: the site's row and a
    row per proxy, the banned ones with no page served."""
    from tests.benchmarks.dashboard_screenshot import chromium, dashboard_process

    log = fleet.log_dir / "dashboard.log"
    with dashboard_process(fleet.env(), log, args=given) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function(
            "document.querySelectorAll('#blocking tbody tr').length > 1", timeout=30_000
        )
        rows = [r.split("\t") for r in page.locator("#blocking tbody tr").all_inner_texts()]
    assert rows[0][0].startswith("127.0.0.1"), rows
    shown = {row[0].removeprefix("proxy "): row for row in rows[1:]}
    for proxy in masked:
        assert shown[proxy][3] == "0% ok", shown
