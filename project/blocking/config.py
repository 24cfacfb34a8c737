"""BLOCK_*: which answers are blocks, and how often a blocked request is tried; SESSION_* and
PROXY_*: the fleet's sessions and proxies."""

from __future__ import annotations

import collections
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cssselect import ExpressionError, SelectorError
from parsel.csstranslator import HTMLTranslator
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.utils import mask_url

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_CHALLENGE_URLS",
    "DEFAULT_MARKERS",
    "BlockConfig",
    "Proxy",
    "SessionConfig",
    "css_selector_ok",
    "parse_proxy_pool",
    "proxy_tiers",
]

#: Regexes (case-insensitive) over the start of an HTML body that only challenge and denial
#: pages carry: Cloudflare's interstitial and block pages, Imperva (Incapsula, Distil),
#: HUMAN (PerimeterX), DataDome and Akamai's "Access Denied" with its reference number.
DEFAULT_MARKERS = [
    r"<title>\s*Just a moment\.\.\.\s*</title>",
    r"<title>\s*Attention Required! \| Cloudflare\s*</title>",
    r'id="challenge-(?:form|running|platform)"|/cdn-cgi/challenge-platform/|cf_chl_opt',
    r"_Incapsula_Resource|Incapsula incident ID|<title>\s*Pardon Our Interruption",
    r'id="px-captcha"|_pxCaptcha',
    r"captcha-delivery\.com",
    r"<title>\s*Access Denied\s*</title>[\s\S]{0,4000}Reference #[0-9a-f.]+",
]
#: Regexes over the URL a response came from (after its redirects), or over the Location of
#: a redirect not followed, that only challenge pages live at.
DEFAULT_CHALLENGE_URLS = [r"/cdn-cgi/challenge-platform/", r"/challenge(?:[/?#]|$)", r"captcha"]


@dataclass(frozen=True)
class BlockConfig:
    """What the block policy looks at (project/blocking/policy.py)."""

    enabled: bool = setting("BLOCK_ENABLED", True)
    #: The policy class (a dotted path): BlockPolicy or a project's subclass of it.
    policy: str = setting("BLOCK_POLICY", "project.blocking.policy.BlockPolicy")
    #: Statuses that are blocks; 429 and 503 only without a usable Retry-After.
    statuses: list[int] = setting("BLOCK_STATUSES", [403, 429, 503])
    markers: list[str] = setting("BLOCK_MARKERS", DEFAULT_MARKERS, shown="challenge pages' markers")
    #: CSS selectors whose presence marks a challenge page (none by default).
    marker_css: list[str] = setting("BLOCK_MARKER_CSS", [])
    challenge_urls: list[str] = setting(
        "BLOCK_CHALLENGE_URLS", DEFAULT_CHALLENGE_URLS, shown="challenge URLs"
    )
    #: site -> CSS selector every good HTML page of it has ("*": any site); a spider's
    #: ``block_required_css`` attribute is the selector of all its sites.
    required_css: dict[str, str] = setting("BLOCK_REQUIRED_CSS", {})
    #: An HTML 2xx shorter than this share of its site's running median is a soft block
    #: (0: never), once the median has BLOCK_SOFT_MIN_SAMPLES good pages behind it.
    soft_ratio: float = setting("BLOCK_SOFT_RATIO", 0.2)
    soft_min_samples: int = setting("BLOCK_SOFT_MIN_SAMPLES", 20)
    #: Tries of a request that is blocked each time before it is a dead letter.
    max_tries: int = setting("BLOCK_MAX_TRIES", 3)
    #: Bytes of a body the markers are looked for in.
    scan_bytes: int = setting("BLOCK_SCAN_BYTES", 65536)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        values = read_settings(cls, settings)
        try:
            values["statuses"] = [int(code) for code in values["statuses"]]
        except ValueError as exc:
            raise NotConfigured(f"BLOCK_STATUSES must be status codes: {exc}") from exc
        for name, key in (("BLOCK_MARKERS", "markers"), ("BLOCK_CHALLENGE_URLS", "challenge_urls")):
            for pattern in values[key]:
                try:
                    re.compile(pattern)
                except (re.error, TypeError) as exc:
                    raise NotConfigured(f"{name}: {pattern!r} is not a regex: {exc}") from exc
        for name, selectors in (
            ("BLOCK_MARKER_CSS", values["marker_css"]),
            ("BLOCK_REQUIRED_CSS", list(values["required_css"].values())),
        ):
            for selector in selectors:
                if not css_selector_ok(selector):
                    raise NotConfigured(f"{name}: {selector!r} is not a CSS selector")
        if not 0.0 <= values["soft_ratio"] < 1.0:
            raise NotConfigured(f"BLOCK_SOFT_RATIO must be within [0, 1): {values['soft_ratio']}")
        if values["max_tries"] < 1:
            raise NotConfigured(f"BLOCK_MAX_TRIES must be at least 1: {values['max_tries']}")
        return cls(**values)


def css_selector_ok(selector: object) -> bool:
    """Whether *selector* is a CSS selector parsel can use."""
    if not isinstance(selector, str) or not selector.strip():
        return False
    try:
        HTMLTranslator().css_to_xpath(selector)
    except (SelectorError, ExpressionError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Proxy:
    """One proxy of PROXY_POOL: its URL with credentials (never logged, never sent to
    Redis) and its id, ``scheme://host:port`` without any credentials (a provider's user
    name is often the account's), ``#2``, ``#3``... after it for more proxies of the same
    address (a gateway with one user name per session); ``""``: no proxy."""

    url: str
    id: str
    tier: int


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DIRECT = ("", "direct", "none")


def _expand(url: str, environ: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in environ:
            raise NotConfigured(f"PROXY_POOL names ${{{name}}}, which the environment lacks")
        return environ[name]

    return _ENV.sub(value, url)


def parse_proxy_pool(value: object, environ: dict[str, str]) -> list[list[Proxy]]:
    """PROXY_POOL as tiers, lowest first: a list of URLs is one tier, a list of lists is
    tiers; ``None``, ``""`` or ``"direct"`` is no proxy (the node's own address). JSON text
    (``-s PROXY_POOL='[...]'``) or comma-separated URLs are read too. ``${NAME}`` in a URL is
    the environment variable NAME (credentials)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [u for u in text.split(",") if u]
        except ValueError as exc:
            raise NotConfigured(f"PROXY_POOL is not a JSON list: {exc}") from None
    if not value:
        return []
    if not isinstance(value, list | tuple):
        raise NotConfigured("PROXY_POOL must be a list of proxy URLs, or of lists of them (tiers)")
    nested = all(isinstance(tier, list | tuple) for tier in value)
    tiers = list(value) if nested else [list(value)]
    parsed: list[list[Proxy]] = []
    seen: set[str] = set()
    addresses: collections.Counter[str] = collections.Counter()
    for n, tier in enumerate(tiers):
        proxies = []
        for entry in tier:
            if entry is None or (isinstance(entry, str) and entry.strip().lower() in _DIRECT):
                proxies.append(Proxy("", "", n))
                continue
            if not isinstance(entry, str):
                raise NotConfigured(f"PROXY_POOL: {entry!r} is not a proxy URL")
            url = _expand(entry.strip(), environ)
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise NotConfigured(f"PROXY_POOL: {mask_url(url)!r} is not an http(s) proxy URL")
            if entry.strip() in seen:  # as written: readers see ${NAME}s, not their values
                raise NotConfigured(f"PROXY_POOL names {mask_url(url)} twice")
            seen.add(entry.strip())
            address = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
            addresses[address] += 1
            count = addresses[address]
            proxies.append(Proxy(url, address if count == 1 else f"{address}#{count}", n))
        if not proxies:
            raise NotConfigured(f"PROXY_POOL: tier {n} is empty")
        parsed.append(proxies)
    return parsed


class _Masked(collections.UserDict[str, str]):
    """An environment where every variable is set: a proxy's id has no credentials anyway."""

    def __missing__(self, key: str) -> str:
        return "***"

    def __contains__(self, key: object) -> bool:
        return True


def proxy_tiers(settings: BaseSettings) -> dict[str, int]:
    """Proxy id (``direct`` for none) -> its tier in PROXY_POOL, read without credentials
    (for readers: status, the dashboard, ``fleetcrawl proxies``); {} if it cannot be read."""
    try:
        tiers = parse_proxy_pool(settings.get("PROXY_POOL"), _Masked())  # type: ignore[arg-type]
    except NotConfigured:
        return {}
    return {proxy.id or "direct": proxy.tier for tier in tiers for proxy in tier}


@dataclass(frozen=True)
class SessionConfig:
    """SESSION_* and PROXY_*: the fleet's sessions, and the proxies they go through."""

    #: On by itself with PROXY_POOL.
    enabled: bool = setting("SESSION_ENABLED", False)
    pool_size: int = setting("SESSION_POOL_SIZE", 10)
    max_errors: float = setting("SESSION_MAX_ERROR_SCORE", 3.0)
    max_uses: int = setting("SESSION_MAX_USES", 50)
    max_age: float = setting("SESSION_MAX_AGE", 3000.0)
    #: One per session, drawn when it is made; none: the project's USER_AGENT.
    user_agents: list[str] = setting("SESSION_USER_AGENTS", [])
    #: A cookie jar over this many bytes (as JSON) stays with its node.
    max_cookie_bytes: int = setting("SESSION_MAX_COOKIE_BYTES", 4096)
    proxy_pool: list[Any] = setting("PROXY_POOL", [])
    ban_score: float = setting("PROXY_BAN_SCORE", 2.0)
    half_life: float = setting("PROXY_SCORE_HALF_LIFE", 600.0)
    cooldown_base: float = setting("PROXY_COOLDOWN_BASE", 300.0)
    cooldown_max: float = setting("PROXY_COOLDOWN_MAX", 3600.0)
    #: PROXY_POOL parsed: tiers of proxies, lowest first.
    tiers: tuple[tuple[Proxy, ...], ...] = ()

    @classmethod
    def from_settings(cls, settings: BaseSettings, environ: dict[str, str] | None = None) -> Self:
        raw = settings.get("PROXY_POOL")
        tiers = parse_proxy_pool(raw, dict(os.environ) if environ is None else environ)
        values = read_settings(
            cls, settings, proxy_pool=[], tiers=tuple(tuple(tier) for tier in tiers)
        )
        if tiers:
            values["enabled"] = True
        for name, key, least in (
            ("SESSION_POOL_SIZE", "pool_size", 1),
            ("SESSION_MAX_ERROR_SCORE", "max_errors", 0.5),
            ("SESSION_MAX_USES", "max_uses", 1),
            ("SESSION_MAX_AGE", "max_age", 1),
            ("PROXY_BAN_SCORE", "ban_score", 1),
            ("PROXY_COOLDOWN_BASE", "cooldown_base", 0),
            ("PROXY_COOLDOWN_MAX", "cooldown_max", 0),
        ):
            if not values[key] >= least:
                raise NotConfigured(f"{name} must be at least {least}: {values[key]!r}")
        return cls(**values)
