"""Acks, retries, dead letters, pauses and revisits, each sent after its children.

A lease is settled only in the round trip that enqueues the last request its callback
produced, or a later one (the step script enqueues before it settles), so the fleet
never sees a page done whose links are not in Redis yet: each settlement waits behind
the requests buffered before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from project.frontier.queue import StepBatch

__all__ = ["Settlement", "SettlementQueue"]


@dataclass(slots=True)
class Settlement:
    """An ack, retry, dead letter or pause, sent once the requests buffered before it are."""

    after: int  # requests buffered up to then: all must be in Redis first
    acks: list[bytes] = field(default_factory=list)
    retries: list[tuple[bytes, int, str, bytes]] = field(default_factory=list)
    dead: list[tuple[bytes, bytes]] = field(default_factory=list)
    pauses: list[tuple[str, int]] = field(default_factory=list)
    revisits: list[tuple[bytes, int, bytes]] = field(default_factory=list)

    def members(self) -> list[bytes]:
        """The leases it settles: held until it is sent."""
        return [*self.acks, *(m for m, *_ in self.retries), *(m for m, _ in self.dead)]


class SettlementQueue:
    """Settlements in the order they were made, each behind the requests buffered before it."""

    def __init__(self) -> None:
        self._queue: list[Settlement] = []
        self.buffered = 0  # requests ever buffered
        self.sent = 0  # requests ever sent

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def add(
        self,
        *,
        ack: bytes | None = None,
        retry: tuple[bytes, int, str, bytes] | None = None,
        dead: tuple[bytes, bytes] | None = None,
        pause: tuple[str, int] | None = None,
        revisit: tuple[bytes, int, bytes] | None = None,
    ) -> None:
        """Queue one settlement behind every request buffered so far (its children)."""
        last = self._queue[-1] if self._queue else None
        if last is None or last.after != self.buffered:
            last = Settlement(self.buffered)
            self._queue.append(last)
        if ack is not None:
            last.acks.append(ack)
        if retry is not None:
            last.retries.append(retry)
        if dead is not None:
            last.dead.append(dead)
        if pause is not None:
            last.pauses.append(pause)
        if revisit is not None:
            last.revisits.append(revisit)

    def collect(self, batch: StepBatch, sent_after: int) -> int:
        """Put into *batch* the settlements whose children are all sent once *sent_after*
        requests are; returns how many, for :meth:`drop` once the step ran."""
        settled = 0
        for settlement in self._queue:
            if settlement.after > sent_after:
                break
            batch.acks += settlement.acks
            batch.retries += settlement.retries
            batch.dead += settlement.dead
            batch.pauses += settlement.pauses
            batch.revisits += settlement.revisits
            settled += 1
        return settled

    def waiting(self, skip: int) -> list[bytes]:
        """Leases of the settlements after the first *skip*: still held, to heartbeat."""
        return [member for settlement in self._queue[skip:] for member in settlement.members()]

    def sent_with(self, settled: int, requests: int) -> None:
        """A step carried the first *settled* settlements and *requests* more requests."""
        del self._queue[:settled]
        self.sent += requests
