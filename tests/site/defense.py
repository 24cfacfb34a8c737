"""The shop defending itself, as real targets do: bans by client address.

An address is banned at once (``--ban ADDRESS[=ANSWER]``, or ``/_ban?address=...`` while the
shop runs) or once it sent more than ``--ban-after`` counted requests within a minute. A
banned address gets its ban's answer to every counted page but robots.txt:

- ``challenge``: status 200, a "Just a moment..." page with a challenge form (the kind a
  crawler must not parse as a product);
- ``403``: status 403, "Access Denied";
- ``soft``: status 200, the shop's layout with a notice and no content at all;
- ``redirect``: a 302 to ``/challenge?next=<path>``, which answers the challenge page.

With ``--block-first N``, every page (robots.txt and the challenge page aside) is blocked
the first N times anyone asks for it, whatever the address, with ``--block-first-answer``
(``mixed``: one of ANSWERS chosen by the path, the same each time): a site a crawler gets
past by trying again.

Every counted page answered without a ``visitor`` cookie sets one (``v1``, ``v2``, ...):
a client that keeps its cookies is one visitor. ``/_stats`` lists every visit as
``[arrival, address, visitor, answer, path]`` under ``visits``, and counts, per client address, each answer (``ok`` for a page served as usual): the
test rig's forward proxies (tests/site/proxies.py) each send from their own loopback address,
so the shop sees one address per proxy.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter, deque
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tests.site.pages import render_error
from tests.site.reply import Reply

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["ANSWERS", "CHALLENGE_PATH", "MIXED", "Defense", "parse_ban"]

ANSWERS = ("challenge", "403", "soft", "redirect")
#: ``--block-first-answer`` for an answer of ANSWERS chosen by the page.
MIXED = "mixed"
#: Where a ``redirect`` ban sends its addresses (served as the challenge page to anyone).
CHALLENGE_PATH = "/challenge"

_CHALLENGE = (
    b'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    b"<title>Just a moment...</title>\n</head>\n<body>\n"
    b'<div id="challenge-running">Checking your browser before accessing the shop.</div>\n'
    b'<form id="challenge-form" action="/challenge" method="POST">'
    b'<input type="hidden" name="jschl_vc" value="0"></form>\n'
    b"<noscript>Please enable JavaScript and cookies to continue.</noscript>\n"
    b"</body>\n</html>\n"
)
_SOFT = (
    b'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    b"<title>Fleet Shop</title>\n</head>\n<body>\n"
    b'<p class="notice">Something went wrong. Please try again later.</p>\n</body>\n</html>\n'
)
_WINDOW = 60.0  # seconds of the rate ban's count


def parse_ban(text: str) -> tuple[str, str]:
    """``ADDRESS`` or ``ADDRESS=ANSWER`` (answer ``challenge`` when left out)."""
    address, _, answer = text.partition("=")
    answer = answer or "challenge"
    if not address or answer not in ANSWERS:
        raise ValueError(f"{text!r}: an address, optionally =" + "|".join(ANSWERS))
    return address, answer


class Defense:
    """Which addresses are banned and what they are answered; counts every answer."""

    def __init__(
        self,
        bans: Iterable[tuple[str, str]] = (),
        ban_after: int = 0,
        rate_answer: str = "challenge",
        block_first: int = 0,
        block_first_answer: str = MIXED,
    ) -> None:
        self._initial = dict(bans)
        self._ban_after = ban_after
        self._rate_answer = rate_answer
        self._block_first = block_first
        self._block_first_answer = block_first_answer
        self.reset()

    def reset(self) -> None:
        """Back to the bans given at start; counts forgotten."""
        self.banned: dict[str, str] = dict(self._initial)
        self._recent: dict[str, deque[float]] = {}
        self._asked: Counter[str] = Counter()
        #: [arrival (time.time()), address, visitor cookie, answer or "ok", path]
        self.visits: list[list[Any]] = []
        self.visitors = 0
        #: address -> answer -> requests
        self.clients: dict[str, Counter[str]] = {}

    def ban(self, address: str, answer: str = "challenge") -> None:
        """Ban *address* from now on with *answer* (``ValueError`` for an unknown one)."""
        if answer not in ANSWERS:
            raise ValueError(f"unknown answer {answer!r}: one of {', '.join(ANSWERS)}")
        self.banned[address] = answer

    def unban(self, address: str) -> None:
        self.banned.pop(address, None)

    def new_visitor(self) -> str:
        """A visitor cookie's value for a client that sent none."""
        self.visitors += 1
        return f"v{self.visitors}"

    def answer(
        self, address: str, path: str, now: float | None = None, visitor: str = ""
    ) -> str | None:
        """What *address* (with the *visitor* cookie) asking for *path* gets: one of ANSWERS,
        or None (served as usual). Counted either way."""
        if path == "/robots.txt":
            return None
        if self._ban_after and address not in self.banned:
            now = time.monotonic() if now is None else now
            recent = self._recent.setdefault(address, deque())
            recent.append(now)
            while recent and recent[0] < now - _WINDOW:
                recent.popleft()
            if len(recent) > self._ban_after:
                self.banned[address] = self._rate_answer
        answer = self.banned.get(address)
        if path == CHALLENGE_PATH:
            answer = "challenge"
        elif answer is None and self._block_first:
            self._asked[path] += 1
            if self._asked[path] <= self._block_first:
                answer = self._block_first_answer
                if answer == MIXED:
                    answer = ANSWERS[zlib.crc32(path.encode()) % len(ANSWERS)]
        self.clients.setdefault(address, Counter())[answer or "ok"] += 1
        self.visits.append([time.time(), address, visitor, answer or "ok", path])
        return answer

    @staticmethod
    def reply(answer: str, path_with_query: str) -> Reply:
        """The page of *answer* to a request for *path_with_query*."""
        if answer == "challenge":
            return Reply(200, _CHALLENGE, headers={b"cache-control": b"no-store"})
        if answer == "403":
            return Reply(403, render_error(403, "Access Denied").encode())
        if answer == "soft":
            return Reply(200, _SOFT)
        location = f"{CHALLENGE_PATH}?next={quote(path_with_query, safe='')}"
        return Reply(302, b"", headers={b"location": location.encode()})

    def as_dict(self) -> dict[str, object]:
        """``{"banned": {address: answer}, "clients": {address: {answer: n}}}``."""
        return {
            "banned": dict(self.banned),
            "clients": {address: dict(counts) for address, counts in self.clients.items()},
            "visits": self.visits,
        }
