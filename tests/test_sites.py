"""Sites: the politeness unit of a URL, and which URLs the frontier refuses."""

from __future__ import annotations

import pytest

from project.frontier.sites import (
    MAX_URL_LENGTH,
    is_private_host,
    related_hosts,
    site_of,
    url_refusal,
)


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("http://Shop.Test/a", "shop.test"),
        ("http://shop.test:8080/a", "shop.test:8080"),
        ("http://user:secret@shop.test/a", "shop.test"),  # credentials are not a site
        ("http://[::1]:6379/", "[::1]:6379"),
        ("http://[::1/x", "_"),
        ("not a url", "_"),
    ],
)
def test_site_of(url: str, site: str) -> None:
    assert site_of(url) == site


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("http://shop.test/p", None),
        ("https://shop.test/p?q=1", None),
        ("file:///dev/zero", "scheme"),
        ("ftp://shop.test/x", "scheme"),
        ("data:,hello", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("http://[::1/product/1", "invalid"),
        ("http://shop.test:99999/", "invalid"),
        ("http:///nohost", "invalid"),
        ("http://shop.test/" + "a" * MAX_URL_LENGTH, "too_long"),
    ],
)
def test_url_refusal(url: str, refusal: str | None) -> None:
    assert url_refusal(url) == refusal


@pytest.mark.parametrize(
    ("host", "private"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("api.localhost", True),
        ("10.1.2.3", True),
        ("192.168.0.1", True),
        ("169.254.169.254", True),  # cloud metadata: link-local
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("93.184.216.34", False),
        ("shop.example", False),
    ],
)
def test_is_private_host(host: str, private: bool) -> None:
    assert is_private_host(host) is private


@pytest.mark.parametrize(
    ("a", "b", "related"),
    [
        ("shop.example", "shop.example", True),
        ("www.shop.example", "shop.example", True),
        ("shop.example", "cdn.shop.example", True),
        ("shop.example", "evilshop.example", False),
        ("shop.example", "example", True),
        ("a.example", "b.example", False),
    ],
)
def test_related_hosts(a: str, b: str, related: bool) -> None:
    assert related_hosts(a, b) is related
