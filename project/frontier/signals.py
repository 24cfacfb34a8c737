"""Signals the frontier sends: to its own middlewares, and to whoever keeps a page's items.

They let a component hear from another without importing it: the revisit middleware learns
the scheduler's seen-set, and the item store (``project/storage/store.py`` connects in
``from_crawler``) hears which items to keep, so nothing in the frontier imports the store.
"""

from __future__ import annotations

__all__ = [
    "frontier_started",
    "item_stored_ref",
    "items_gone",
    "items_still_there",
    "seen_set_opened",
    "store_backpressure",
]

#: The fleet scheduler's frontier loop started: ``loop``, the FrontierLoop (the permit gate
#: asks it before a leased request goes on the wire), and ``keys``, the spider's FrontierKeys
#: (the item store keeps what MongoDB cannot take yet in the fleet's outbox).
frontier_started = object()

#: The fleet scheduler opened its seen-set: ``dupefilter``, the FleetDupeFilter whose
#: ``fingerprint(request)`` names a request there (revisit records are keyed by it).
seen_set_opened = object()

#: Items still on their page though it was not parsed again (a 304, or a page still linked
#: but not due): ``refs``, their (collection, _id) pairs. A receiver moves their
#: ``last_seen`` in the background; it does not block the sender.
items_still_there = object()

#: Items a page no longer has, on evidence about them (project/frontier/revisit.py's
#: ``gone_refs``: the page answered 404 or 410, or was parsed whole without them): ``refs``,
#: their (collection, _id) pairs. A receiver marks them gone in the background.
items_gone = object()

#: Sent once an item was scraped, with ``item``: a receiver that stored it returns the
#: (collection, _id) it is stored under, or None when it cannot name it.
item_stored_ref = object()

#: The item store fell behind (``behind=True``: more items wait to be stored than
#: MONGO_MAX_WAITING allows) or caught up (``behind=False``): the frontier starts no downloads
#: and leases nothing more while it is behind (project/storage/backlog.py).
store_backpressure = object()
