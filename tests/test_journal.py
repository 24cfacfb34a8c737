"""The local journal that keeps items durable while MongoDB is away."""

from __future__ import annotations

from typing import TYPE_CHECKING

from project.storage.journal import Journal, journal_backlog

if TYPE_CHECKING:
    from pathlib import Path


def test_journal_appends_and_replays_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_records=3)
    journal.open()
    for start in (0, 2, 4):
        journal.append([{"n": start}, {"n": start + 1}])
    assert journal.backlog() == journal_backlog(tmp_path / "j") == 6
    segments = journal.segments()
    assert len(segments) == 2, "a segment is rotated once it holds segment_records"
    assert [r["n"] for s in segments for r in journal.read(s)] == list(range(6))
    assert journal.sealed_segments() == segments[:1]
    journal.remove(segments[0])
    assert journal.backlog() == 2
    journal.close()


def test_nodes_on_one_host_get_slots_and_adopt_dead_ones(tmp_path: Path) -> None:
    first, second = Journal(tmp_path), Journal(tmp_path)
    first.open()
    second.open()
    assert first.directory != second.directory, "two live nodes never share a slot"
    second.append([{"n": 1}, {"n": 2}])
    second.close()  # as if the node died: its lock is gone, its segments stay
    assert journal_backlog(tmp_path) == 2
    third = Journal(tmp_path)
    third.open()
    assert third.backlog() == 2, "the next node on the host adopts the orphaned journal"
    assert [r["n"] for s in third.segments() for r in third.read(s)] == [1, 2]
    assert first.backlog() == 0
    first.close()
    third.close()


def test_journal_survives_a_torn_write_and_a_restart(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.open()
    journal.append([{"n": 1}, {"n": 2}])
    journal.close()
    # A crash in the middle of the next append leaves half a line behind.
    with journal.segments()[-1].open("ab") as f:
        f.write(b'{"n": 3, "tr')
    reopened = Journal(tmp_path)
    reopened.open()
    reopened.append([{"n": 4}])
    assert reopened.backlog() == 3
    segments = reopened.segments()
    assert len(segments) == 2, "a new process never appends to an older segment"
    assert [r["n"] for s in segments for r in reopened.read(s)] == [1, 2, 4]
    reopened.close()
    assert journal_backlog(tmp_path / "missing") == 0
