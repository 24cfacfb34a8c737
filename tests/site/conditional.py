"""Validators of the shop's pages and the conditional requests they answer with a 304.

A page with validators carries a strong ``ETag`` (a hash of its body), a ``Last-Modified`` of
:data:`BASE_TIME` plus one day per epoch up to the one since which the page has shown the same
(:meth:`tests.site.epochs.CatalogueHistory.changed_at`), and ``Cache-Control: no-cache``: a
cache may keep the page but must ask the shop before each reuse (without it, the freshness a
cache guesses from an old Last-Modified would let a second crawl skip the shop altogether).

A GET or HEAD of such a page is answered ``304 Not Modified`` when ``If-None-Match`` names its
ETag (weakly or not) or is ``*``; or, only when the request has no If-None-Match, when
``If-Modified-Since`` is an HTTP date at or after its Last-Modified (RFC 9110, 13.1.2 and
13.2.2). A header that is not what it should be (garbage, a bad date) matches nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from email.utils import format_datetime, parsedate_to_datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["BASE_TIME", "entity_tag", "http_date", "last_modified", "not_modified"]

#: Last-Modified of a page unchanged since epoch 0; after the newest date of the articles and
#: the books, so the sitemaps that list them are not older than their entries.
BASE_TIME = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
#: An HTTP date is 29 characters (the obsolete formats a few more): longer is not one.
_MAX_DATE_LENGTH = 64


def entity_tag(body: bytes) -> bytes:
    """Strong entity tag of *body*, quoted."""
    return b'"%s"' % hashlib.sha256(body).hexdigest()[:32].encode("ascii")


def last_modified(epoch: int) -> dt.datetime:
    """Last-Modified of a page that has shown the same since *epoch*."""
    return BASE_TIME + dt.timedelta(days=epoch)


def http_date(when: dt.datetime) -> bytes:
    """*when* as an HTTP date (``Wed, 01 Jan 2025 00:00:00 GMT``)."""
    return format_datetime(when, usegmt=True).encode("ascii")


def not_modified(
    etag: bytes,
    modified: dt.datetime,
    if_none_match: Sequence[bytes],
    if_modified_since: Sequence[bytes],
) -> bool:
    """Whether a GET with these header values (each header's lines, as received) gets a 304."""
    if if_none_match:
        return _names(b",".join(if_none_match), etag)
    if len(if_modified_since) != 1:  # absent, or sent twice: which one would count?
        return False
    since = _http_date(if_modified_since[0])
    return since is not None and since >= modified


def _names(value: bytes, etag: bytes) -> bool:
    """Whether an If-None-Match value is ``*`` or lists *etag* (weak comparison)."""
    tags = [tag.strip() for tag in value.split(b",")]
    if tags == [b"*"]:
        return True
    return any(tag.removeprefix(b"W/") == etag for tag in tags)


def _http_date(value: bytes) -> dt.datetime | None:
    try:
        text = value.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if len(text) > _MAX_DATE_LENGTH:
        return None
    try:
        when = parsedate_to_datetime(text)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    # asctime dates and "-0000" carry no zone: HTTP dates are always GMT.
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
