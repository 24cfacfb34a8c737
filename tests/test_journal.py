"""The local journal that keeps items durable while MongoDB is away."""

from __future__ import annotations

import json
import logging
import subprocess
from typing import TYPE_CHECKING

from project.storage.journal import Journal, journal_backlog

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


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


# -- a journal is keyed by database ---------------------------------------------------------------


def _segment(slot: Path, *records: dict[str, object]) -> None:
    slot.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    (slot / "000000000001.jsonl").write_text(lines)


def test_a_journal_adopts_only_segments_of_its_own_database(tmp_path: Path) -> None:
    shared = tmp_path / "journal"  # a MONGO_JOURNAL_DIR without {database}, used by two jobs
    first = Journal(shared, database="a")
    first.open()
    first.append([{"db": "a", "n": 1}])
    first.close()  # the job on database a died
    other = Journal(shared, database="b")
    other.open()
    assert other.backlog() == 0, "a job on database b never replays items of database a"
    assert journal_backlog(shared) == 1
    again = Journal(shared, database="a")
    again.open()
    assert [r["n"] for s in again.segments() for r in again.read(s)] == [1]
    other.close()
    again.close()


def test_segments_of_another_database_in_its_own_slot_are_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _segment(tmp_path / "node-0", {"db": "a", "n": 1})  # node-0 was last used by a job on a
    journal = Journal(tmp_path, database="b")
    with caplog.at_level(logging.WARNING, logger="project.storage.journal"):
        journal.open()
    assert journal.directory == tmp_path / "node-0"
    assert journal.backlog() == 0
    assert "moved 1 journal segments of another database" in caplog.text
    assert journal_backlog(tmp_path) == 1, "set aside in a free slot, not deleted"
    owner = Journal(tmp_path, database="a")
    owner.open()
    assert owner.backlog() == 1
    owner.close()
    journal.close()


def test_the_old_layout_is_adopted_only_for_records_naming_the_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = tmp_path / ".state/journal/products"  # MONGO_JOURNAL_DIR's old default
    _segment(legacy / "node-0", {"db": "fleetcrawl", "n": 1})
    _segment(legacy / "node-1", {"kind": "product", "n": 2}, {"kind": "product", "n": 3})
    _segment(legacy / "node-2", {"db": "other", "n": 4})
    base = tmp_path / ".state/journal/fleetcrawl/products"
    journal = Journal(base, database="fleetcrawl", legacy=[legacy])
    with caplog.at_level(logging.WARNING, logger="project.storage.journal"):
        journal.open()
    assert [r["n"] for s in journal.segments() for r in journal.read(s)] == [1]
    journal.close()
    assert "2 journaled items in" in caplog.text
    assert "name no database" in caplog.text
    # The warning's own command names them, and the next node adopts them.
    command = caplog.text.split("run: ", 1)[1].splitlines()[0]
    subprocess.run(command, shell=True, check=True, cwd=tmp_path)
    again = Journal(base, database="fleetcrawl", legacy=[legacy])
    again.open()
    assert sorted(r["n"] for s in again.segments() for r in again.read(s)) == [1, 2, 3]
    again.close()
    assert journal_backlog(legacy) == 1, "database other's segment stays for its own nodes"


def test_journal_skips_a_line_too_deep_to_parse(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.open()
    journal.append([{"n": 1}])
    with journal.segments()[-1].open("ab") as f:
        f.write(b"[" * 100_000 + b"\n")
    assert [r["n"] for s in journal.segments() for r in journal.read(s)] == [1]
    journal.close()
