"""The two things the frontier needs from Scrapy's engine that it has no public API for.

Both go through :func:`_slot`, the engine's private ``_slot`` (a
``scrapy.core.engine._Slot``). ``tests/test_engine_contract.py`` fails with a
clear message when a Scrapy release changes what is used here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["requests_in_progress", "wake_engine"]


def _slot(crawler: Crawler) -> Any:
    # Scrapy has no public hook for "a request and everything its callback
    # produced are done", nor for "look at the scheduler now". The engine's slot
    # has both: `inprogress`, the requests the engine has not finished with
    # (they leave it after their items went through the pipelines and their
    # follow-ups were scheduled), and `nextcall`, the engine's next loop turn.
    return getattr(crawler.engine, "_slot", None)


def requests_in_progress(crawler: Crawler) -> set[Request]:
    """Requests the engine is still working on (downloading, parsing, storing items)."""
    slot = _slot(crawler)
    return slot.inprogress if slot is not None else set()


def wake_engine(crawler: Crawler) -> None:
    """Make the engine ask the scheduler for requests now, not at its next 5 s idle poll."""
    slot = _slot(crawler)
    if slot is not None:
        slot.nextcall.schedule()
