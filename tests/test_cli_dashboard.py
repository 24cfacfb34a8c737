"""``fleetcrawl dashboard`` answers only for its own names (DNS rebinding) and shows dead
letters without the credentials they carried."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from project.monitoring.dashboard import DashboardConfig, host_allowed
from tests.benchmarks.dashboard_screenshot import dashboard_process
from tests.test_failures_cli import SECRETS, _dead, _leaked


@pytest.mark.parametrize(
    ("header", "bound", "allowed", "answered"),
    [
        ("127.0.0.1:8050", "127.0.0.1", (), True),
        ("localhost:8050", "127.0.0.1", (), True),
        ("LOCALHOST.:9000", "127.0.0.1", (), True),  # an SSH tunnel on another port
        ("[::1]:8050", "::1", (), True),
        ("10.0.0.5:8050", "0.0.0.0", (), True),  # an address is not a name DNS can point
        ("crawler1.internal:8050", "crawler1.internal", (), True),
        ("evil.example:8050", "127.0.0.1", (), False),  # the DNS rebinding attack
        ("evil.example", "0.0.0.0", (), False),
        ("dash.example.org", "127.0.0.1", ("dash.example.org",), True),
        ("a.b.example.org:443", "127.0.0.1", (".example.org",), True),
        ("example.org.evil", "127.0.0.1", (".example.org",), False),
        ("notexample.org", "127.0.0.1", (".example.org",), False),
        ("anything", "127.0.0.1", ("*",), True),
        (None, "127.0.0.1", (), False),
        ("", "127.0.0.1", (), False),
        ("::1", "127.0.0.1", (), False),  # IPv6 without brackets is not a Host
        ("[::1", "127.0.0.1", (), False),
        ("localhost:80x", "127.0.0.1", (), False),
        ("evil.example\r\nX: y", "127.0.0.1", (), False),
    ],
)
def test_only_the_dashboards_own_names_pass_the_host_check(
    header: str | None, bound: str, allowed: tuple[str, ...], answered: bool
) -> None:
    assert host_allowed(header, bound, allowed) is answered


def test_allowed_hosts_from_the_setting_or_the_environment() -> None:
    environ = {"DASHBOARD_ALLOWED_HOSTS": "Dash.Example.org:8050, .corp.test,"}
    assert DashboardConfig.from_settings(Settings(), {}).allowed_hosts == ()
    from_env = DashboardConfig.from_settings(Settings(), environ)
    assert from_env.allowed_hosts == ("dash.example.org", ".corp.test")
    setting = Settings({"DASHBOARD_ALLOWED_HOSTS": ["mine.test"]})
    assert DashboardConfig.from_settings(setting, environ).allowed_hosts == ("mine.test",)
    with pytest.raises(NotConfigured, match="DASHBOARD_ALLOWED_HOSTS"):
        DashboardConfig.from_settings(Settings({"DASHBOARD_ALLOWED_HOSTS": "a:b:c"}), {})


def _get(url: str, path: str, host: str | None) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.mark.crawl
def test_dashboard_refuses_other_hosts_and_redacts_dead_letters(fleet, redis_client, keys) -> None:
    request = {"url": "http://shop.test/account", "headers": SECRETS}
    redis_client.lpush(keys.dead, _dead(request["url"], request))
    env = {**fleet.env(), "DASHBOARD_ALLOWED_HOSTS": "dash.example.org"}
    with dashboard_process(
        env, fleet.log_dir / "dashboard.log", args=fleet.space.cli_args()
    ) as url:
        port = urlsplit(url).port
        for path in ("/", "/static/charts.js", "/api/status", "/api/dead-letters", "/metrics"):
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "dash.example.org"):
                assert _get(url, path, host)[0] == 200, (path, host)
            for host in (f"evil.example:{port}", "", None):
                status, body = _get(url, path, host)
                assert status == 400, (path, host)
                if host:  # aiohttp itself refuses a request without a Host
                    assert "DASHBOARD_ALLOWED_HOSTS" in body
        status, body = _get(url, "/api/dead-letters", f"127.0.0.1:{port}")
    assert status == 200
    (record,) = json.loads(body)
    assert _leaked(body) == []
    assert json.loads(record["request"])["headers"]["Cookie"] == ["[redacted]"]
    log = (fleet.log_dir / "dashboard.log").read_text()
    assert log.count("Refused a request for Host 'evil.example") == 1, "once per name"
