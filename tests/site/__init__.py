"""Deterministic synthetic web shop that every test, benchmark and demo crawl targets.

Run it with ``python -m tests.site --help``; tests use :class:`tests.site.server.ShopServer`.
"""

from __future__ import annotations

__all__: list[str] = []
