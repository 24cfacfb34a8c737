"""Codes that travel between the node and the Lua scripts, named once.

The Lua loader (project/frontier/lua/__init__.py) gives every script a ``CODE`` table
of these (``CODE.mode_filter`` rather than ``'f'``), so the two sides cannot drift.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "LUA_CODES",
    "MEMBER_REQUEST",
    "MODE_ALWAYS",
    "MODE_FILTER",
    "MODE_REVISIT",
    "MODE_SEED",
    "SCOPE_ALLOWED",
    "SCOPE_ANY",
    "SCOPE_REDIRECT",
    "SCOPE_SEED",
    "SEEDS_LIST",
    "SEEDS_SET",
    "START_END",
    "START_EXTEND",
]

# An enqueued request's mode, the first byte of its fingerprint (lua/step/enqueue.lua).
#: Dropped if seen.
MODE_FILTER: Final = b"f"
#: dont_filter: queued anyway, and marked as seen.
MODE_ALWAYS: Final = b"m"
#: Under a revisit policy: dropped if seen, unless its revisit is due.
MODE_REVISIT: Final = b"r"
#: A seed or a request of start() (the fleet's own dont_filter): queued once per crawl run.
MODE_SEED: Final = b"s"

# Where an enqueued request may go: the scope's first character, a site may follow.
#: Anywhere (the spider's allowed_domains decide).
SCOPE_ANY: Final = ""
#: A seed: its site joins the allowed sites.
SCOPE_SEED: Final = "+"
#: Only if its site is allowed.
SCOPE_ALLOWED: Final = "="
#: A redirect within one domain, followed by the site it came from.
SCOPE_REDIRECT: Final = "~"

# The kind of an in-flight member, after "<node>\n" (lua/lib/leases.lua).
#: A leased request: "R<site>\n<payload>".
MEMBER_REQUEST: Final = "R"
#: A seed leased from the start_urls list.
SEEDS_LIST: Final = "S"
#: A seed leased from the start_urls set (REDIS_START_URLS_AS_SET).
SEEDS_SET: Final = "T"

# What a step asks of the start() claim (options.start, lua/step/start.lua).
#: Extend the claim: start() still runs here.
START_EXTEND: Final = "run"
#: End it: start() is over and its last requests go with this step.
START_END: Final = "done"

#: The CODE table of every Lua script: name -> code.
LUA_CODES: Final[dict[str, str]] = {
    "mode_filter": MODE_FILTER.decode(),
    "mode_always": MODE_ALWAYS.decode(),
    "mode_revisit": MODE_REVISIT.decode(),
    "mode_seed": MODE_SEED.decode(),
    "scope_seed": SCOPE_SEED,
    "scope_allowed": SCOPE_ALLOWED,
    "scope_redirect": SCOPE_REDIRECT,
    "member_request": MEMBER_REQUEST,
    "seeds_list": SEEDS_LIST,
    "seeds_set": SEEDS_SET,
    "start_extend": START_EXTEND,
    "start_end": START_END,
}
