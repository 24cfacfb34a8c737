"""What a page of the test shop answers, before the shop's latency is applied."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GZIP", "HTML", "JSON", "TEXT", "XML", "Reply"]

HTML = b"text/html; charset=utf-8"
JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
XML = b"application/xml; charset=utf-8"
#: A ``.xml.gz`` sitemap is a gzip file, not a gzip-encoded response: no Content-Encoding.
GZIP = b"application/gzip"


@dataclass
class Reply:
    """Status, body and headers of one answer; ``extra_delay`` adds to the shop's latency."""

    status: int
    body: bytes
    content_type: bytes = HTML
    headers: dict[bytes, bytes] = field(default_factory=dict)
    extra_delay: float = 0.0
    #: The epoch since which the page has shown the same: set, the page carries validators
    #: and may be answered 304 (:mod:`tests.site.conditional`).
    changed: int | None = None
