"""BLOCK_*: which answers are blocks, and how often a blocked request is tried."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["DEFAULT_CHALLENGE_URLS", "DEFAULT_MARKERS", "BlockConfig"]

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
        if not 0.0 <= values["soft_ratio"] < 1.0:
            raise NotConfigured(f"BLOCK_SOFT_RATIO must be within [0, 1): {values['soft_ratio']}")
        if values["max_tries"] < 1:
            raise NotConfigured(f"BLOCK_MAX_TRIES must be at least 1: {values['max_tries']}")
        return cls(**values)
