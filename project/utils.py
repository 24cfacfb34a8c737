"""Small helpers shared by every capability: nothing here talks to the network."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Final

__all__ = ["child_processes", "mask_url"]

_QUERY_SECRET_RE: Final = re.compile(r"(?i)([?&](?:password|passwd|pwd|pass)=)[^&#]*")


def mask_url(url: str) -> str:
    """Return *url* with any password replaced by ``***`` (for logs and output)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = len(rest)
    for stop in "?#":
        if stop in rest:
            end = min(end, rest.index(stop))
    # The last '@' before the query ends the userinfo, so unescaped '@' or '/'
    # inside a password are still masked.
    at = rest.rfind("@", 0, end)
    if at != -1:
        user, colon, password = rest[:at].partition(":")
        if colon and password:
            rest = f"{user}:***{rest[at:]}"
    return _QUERY_SECRET_RE.sub(r"\1***", f"{scheme}://{rest}")


def child_processes(pid: str) -> list[str]:
    """The ids of *pid*'s child processes, from /proc (none when it is gone)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += (task / "children").read_text().split()
    return found
