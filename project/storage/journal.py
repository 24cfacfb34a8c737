"""Append-only, segmented JSON-lines journal that keeps items durable while MongoDB is away."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["Journal", "JournalLockedError", "journal_backlog"]

logger = logging.getLogger(__name__)

_SUFFIX = ".jsonl"
_LOCK_NAME = ".lock"
_SLOT_PREFIX = "node-"
_MAX_SLOTS = 1024
#: Bytes of a segment's first line read to learn its database.
_PEEK_BYTES = 1 << 20


class JournalLockedError(RuntimeError):
    """Another process owns the journal directory."""


class Journal:
    """Records appended in batches (one fsync per batch) to numbered segment files of one directory.

    Segments are replayed in name order and removed one by one once MongoDB acknowledged them;
    a new process never appends to an older process's segment, so a torn write can only be the
    last line of a segment, and :meth:`read` skips it. Blocking file I/O: call it off the event
    loop (``asyncio.to_thread``).

    Several processes on one host share the configured directory: each locks the first free slot
    ``node-N`` below it, and adopts the segments of slots whose owner died (a free lock), so a
    node's journal is replayed by whichever node starts next on that host.

    With a *database*, every record names its database (``"db"``) and a slot only ever holds
    segments of that database: orphans of another database are left for a node of theirs,
    segments that name none (written before records named their database) are never replayed
    unasked, and such segments found in this process's own slot are moved to a free slot.
    *legacy* folders (an older layout) are searched for orphans as well.
    """

    def __init__(
        self,
        directory: Path,
        *,
        database: str | None = None,
        legacy: Sequence[Path] = (),
        segment_records: int = 5000,
    ) -> None:
        self.base: Path = directory
        self.directory: Path = directory
        self.database: str | None = database
        self._legacy = tuple(legacy)
        self._segment_records = segment_records
        self._lock: IO[bytes] | None = None
        self._active: IO[bytes] | None = None
        self._active_path: Path | None = None
        self._active_records = 0
        self._next_seq = 1

    def open(self) -> None:
        """Lock the first free slot below the base directory and adopt orphaned slots.

        Raises ``JournalLockedError`` when every slot is taken, ``OSError`` when the
        directory cannot be written.
        """
        self.base.mkdir(parents=True, exist_ok=True)
        for number in range(_MAX_SLOTS):
            slot = self.base / f"{_SLOT_PREFIX}{number}"
            lock = _try_lock(slot)
            if lock is not None:
                self.directory, self._lock = slot, lock
                break
        else:
            raise JournalLockedError(f"all {_MAX_SLOTS} journal slots of {self.base} are in use")
        existing = self.segments()
        self._next_seq = int(existing[-1].stem) + 1 if existing else 1
        self._park_foreign(existing)
        self._adopt_orphans()

    def _belongs(self, segment: Path) -> str | None:
        """Whose a segment is: None if it is this journal's, else the database it names (or "")."""
        if self.database is None:
            return None
        with segment.open("rb") as f:
            first = f.readline(_PEEK_BYTES)
        try:
            owner = json.loads(first).get("db", "") if first.strip() else self.database
        except (ValueError, AttributeError):
            owner = self.database  # a torn single line: nothing to replay
        return None if owner == self.database else str(owner)

    def _park_foreign(self, segments: Sequence[Path]) -> None:
        """Move segments of another (or no) database out of this slot, into a free one."""
        foreign = [s for s in segments if self._belongs(s) is not None]
        if not foreign:
            return
        for number in range(_MAX_SLOTS):
            slot = self.base / f"{_SLOT_PREFIX}{number}"
            if not slot.exists():
                break
        else:
            raise JournalLockedError(f"no free journal slot in {self.base} to set segments aside")
        slot.mkdir(parents=True)
        for segment in foreign:
            segment.rename(slot / segment.name)
        _fsync_dir(slot)
        _fsync_dir(self.directory)
        logger.warning(
            "moved %d journal segments of another database from %s to %s", len(foreign),
            self.directory, slot,
        )  # fmt: skip

    def _adopt_orphans(self) -> None:
        """Move the segments of slots nobody holds (their node died) into this slot."""
        sources: list[tuple[Path, bool]] = []  # (folder, is a lockable slot)
        for base in (self.base, *self._legacy):
            if not base.is_dir():
                continue
            sources += [(slot, True) for slot in sorted(base.glob(_SLOT_PREFIX + "*"))]
            if any(base.glob("*" + _SUFFIX)):
                sources.append((base, False))  # the layout before slots
        for slot, lockable in sources:
            if slot == self.directory or not slot.is_dir():
                continue
            lock = _try_lock(slot) if lockable else None
            if lock is None and lockable:
                continue  # a live node owns it
            try:
                orphans = sorted(p for p in slot.glob("*" + _SUFFIX) if p.stem.isdigit())
                adopted = [p for p in orphans if self._belongs(p) is None]
                for segment in adopted:
                    segment.rename(self.directory / f"{self._next_seq:012d}{_SUFFIX}")
                    self._next_seq += 1
                if adopted:
                    _fsync_dir(self.directory)
                    _fsync_dir(slot)
                    logger.info(
                        "adopted %d journal segments of %s (its node is gone)", len(adopted), slot
                    )
                if len(adopted) < len(orphans):
                    self._warn_unnamed(slot)
            finally:
                if lock is not None:
                    lock.close()

    def _warn_unnamed(self, slot: Path) -> None:
        unnamed = [
            p for p in slot.glob("*" + _SUFFIX) if p.stem.isdigit() and self._belongs(p) == ""
        ]
        if unnamed:
            count = sum(_count_lines(p) for p in unnamed)
            db = json.dumps(self.database)
            logger.warning(
                "%d journaled items in %s name no database (written before journal records"
                " named theirs), so they are not replayed; if they belong to database %s,"
                " run: sed -i 's/^{/{\"db\":%s,/' %s/*%s",
                count, slot, self.database, db, slot, _SUFFIX,
            )  # fmt: skip

    def close(self) -> None:
        """Close the active segment and release the lock."""
        self.seal()
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append one batch and fsync it: once this returns, the records survive a crash."""
        if not records:
            return
        data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        new_segment = self._active is None or self._active_records >= self._segment_records
        if new_segment:
            self.seal()
            self._active_path = self.directory / (f"{self._next_seq:012d}{_SUFFIX}")
            self._next_seq += 1
            # Unbuffered: what a failed write left is on disk, and closing writes nothing more.
            self._active = self._active_path.open("ab", buffering=0)
            self._active_records = 0
        assert self._active is not None
        try:
            view = memoryview(data)
            while view:  # a full disk can take part of a write before it refuses the rest
                view = view[self._active.write(view) :]
            os.fsync(self._active.fileno())
            if new_segment:
                _fsync_dir(self.directory)
        except OSError:
            # A half-written line must stay the last line of its segment.
            path, empty = self._active_path, self._active.tell() == 0
            self.seal()
            if empty and path is not None:
                path.unlink(missing_ok=True)
            raise
        self._active_records += len(records)

    def seal(self) -> None:
        """Close the active segment: the next append starts a new one."""
        active, self._active, self._active_path = self._active, None, None
        if active is not None:
            active.close()

    def segments(self) -> list[Path]:
        """Segment files, oldest first (the active one included)."""
        return sorted(p for p in self.directory.glob("*" + _SUFFIX) if p.stem.isdigit())

    def sealed_segments(self) -> list[Path]:
        """Segment files that are no longer appended to, oldest first."""
        return [p for p in self.segments() if p != self._active_path]

    def read(self, segment: Path) -> list[dict[str, Any]]:
        """Records of one segment, in order, without a torn last line."""
        records: list[dict[str, Any]] = []
        lines = segment.read_bytes().split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except (ValueError, RecursionError):
                # Only the tail can be torn (a crash during append): it was never acknowledged.
                logger.warning("skipping unreadable line %d of journal segment %s", number, segment)
        return records

    def remove(self, segment: Path) -> None:
        """Delete a replayed segment."""
        segment.unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def backlog(self) -> int:
        """Records waiting in the journal."""
        return journal_backlog(self.directory)


def _try_lock(slot: Path) -> IO[bytes] | None:
    """The slot's lock file, locked by this process, or None when another process holds it."""
    slot.mkdir(parents=True, exist_ok=True)
    lock = (slot / _LOCK_NAME).open("ab")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def journal_backlog(journal_dir: str | os.PathLike[str]) -> int:
    """Journaled items waiting to be replayed into MongoDB, over every node slot (0 if none)."""
    directory = Path(journal_dir)
    if not directory.is_dir():
        return 0
    segments = [*directory.glob("*" + _SUFFIX), *directory.glob(f"{_SLOT_PREFIX}*/*{_SUFFIX}")]
    return sum(_count_lines(segment) for segment in segments if segment.stem.isdigit())


def _count_lines(segment: Path) -> int:
    with segment.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
