"""The ``request.meta`` keys through which the frontier's components talk about a request.

One home for them: the scheduler, its loop, the retry, revisit and robots middlewares and the
wire read them from here, and none of those has to import another to learn a key's name.
"""

from __future__ import annotations

__all__ = [
    "BLOCK_TRIES_META_KEY",
    "LEASE_META_KEY",
    "NODE_LOCAL_META_KEYS",
    "OUTCOME_META_KEY",
    "RETRY_COPY_META_KEY",
    "REVISIT_META_KEY",
    "REVISIT_OUT_META_KEY",
    "REVISIT_UNSURE_META_KEY",
    "ROBOTS_LOCK_META_KEY",
    "ROBOTS_SITE_META_KEY",
    "SEED_META_KEY",
    "SESSION_COOKIE_META_KEY",
    "SESSION_LEFT_META_KEY",
    "SESSION_META_KEY",
    "SESSION_OWNED_HEADERS",
    "SESSION_OWNED_META",
]

#: Through which middlewares ask for a retry or a dead letter.
OUTCOME_META_KEY = "_frontier_outcome"
#: Of a request this node holds a lease on.
LEASE_META_KEY = "_frontier_lease"
#: Of a request made from a seed: its site is one the crawl may visit.
SEED_META_KEY = "_frontier_seed"
#: Of Scrapy's retry copy of a leased request: the copy travels with the lease's
#: settlement, not as a request of its own.
RETRY_COPY_META_KEY = "_frontier_retry_copy"
#: The record of a URL's last fetch, as the frontier handed it out with the revisit
#: (it travels with a retry: the retry asks conditionally too).
REVISIT_META_KEY = "_fleet_revisit"
#: What this fetch leaves for the next one: sent with the request's acknowledgement.
REVISIT_OUT_META_KEY = "_fleet_revisit_out"
#: Set by a callback that could not read its page (``response.meta["revisit_unsure"] =
#: True``: a render that failed, an error answered with 200): what it yielded is not all the
#: page has, so its fetch marks nothing gone (project/frontier/revisit.py).
REVISIT_UNSURE_META_KEY = "revisit_unsure"
#: Tries of a request that were blocked (project/blocking/middleware.py): it travels with
#: the retry copy, through Redis.
BLOCK_TRIES_META_KEY = "_fleet_block_tries"
#: The session (project/blocking/pool.py) a download of this node goes through.
SESSION_META_KEY = "_fleet_session"
#: What a session put on its request: none of it travels with a retry through Redis (the
#: retry gets a session of its own; a proxy's credentials never reach Redis).
#: Set once a request's session download is counted as over (project/blocking/pool.py).
SESSION_LEFT_META_KEY = "_fleet_session_left"
#: The request's Cookie header is its session's (project/blocking/last_hop.py), not the
#: spider's own.
SESSION_COOKIE_META_KEY = "_fleet_session_cookie"
SESSION_OWNED_META = frozenset({"proxy", "_auth_proxy", "dont_merge_cookies"})
SESSION_OWNED_HEADERS = frozenset({b"cookie", b"user-agent"})
#: The fleet's fetch lock of a robots.txt request.
ROBOTS_LOCK_META_KEY = "_fleet_robots_lock"
#: The site whose robots.txt a request fetches: meta survives redirects, so a copy that came
#: from https://www.shop/robots.txt is still the one of http://shop.
ROBOTS_SITE_META_KEY = "_fleet_robots_site"

#: The keys above that only make sense inside one process: never sent through Redis.
NODE_LOCAL_META_KEYS = frozenset(
    {
        OUTCOME_META_KEY,
        LEASE_META_KEY,
        SEED_META_KEY,
        RETRY_COPY_META_KEY,
        REVISIT_OUT_META_KEY,
        ROBOTS_LOCK_META_KEY,
        ROBOTS_SITE_META_KEY,
        SESSION_META_KEY,
        SESSION_LEFT_META_KEY,
        SESSION_COOKIE_META_KEY,
    }
)
