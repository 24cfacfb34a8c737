"""The step script's wire, held against the Python that builds and decodes it: the ARGV
sections each phase reads, the options, the reply's names, and the codes both sides use."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from project.frontier import lua, queue
from project.frontier.codes import LUA_CODES
from project.frontier.queue import REPLY, SECTIONS, LeasedQueue, StepBatch

LUA = Path(str(lua.FOLDER))
_SECTION_LINE = re.compile(r"^\s*ARGV section (\w+)(?: \([^)]*\))?: ([\w ]+)$", re.MULTILINE)


def _header(path: Path) -> str:
    match = re.match(r"--\[\[(.*?)\]\]", path.read_text(encoding="utf-8"), re.DOTALL)
    assert match, f"{path.name}: no header"
    return match[1]


def _declared_sections() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted((LUA / "step").glob("*.lua")):
        for name, fields in _SECTION_LINE.findall(_header(path)):
            assert name not in found, f"section {name} described twice"
            found[name] = tuple(fields.split())
    return found


def test_every_section_the_node_sends_is_described_by_the_phase_that_reads_it() -> None:
    sent = {name: fields for name, _, fields in SECTIONS}
    assert _declared_sections() == sent


def test_a_phase_reads_only_fields_its_section_has() -> None:
    # sec.<field> in a phase names an offset the layout gives; a typo would read nil
    sections = {name: set(fields) for name, _, fields in SECTIONS}
    meta = {"at", "n", "width"}
    for path in sorted((LUA / "step").glob("*.lua")):
        text = path.read_text(encoding="utf-8")
        names = [name for name, _ in _SECTION_LINE.findall(_header(path))]
        used = set(re.findall(r"\bsec\.(\w+)", text)) - meta
        allowed = set().union(*(sections[n] for n in names)) if names else set()
        assert used <= allowed, f"{path.name} reads {sorted(used - allowed)}"


def test_the_sections_are_those_of_the_step_batch() -> None:
    fields = set(inspect.signature(StepBatch).parameters)
    assert {attr for _, attr, _ in SECTIONS} <= fields


def _reply_names_in_header() -> list[str]:
    text = _header(LUA / "step.lua").split("Reply:", 1)[1]
    return re.findall(r"^    (\w+)\s{2,}", text, re.MULTILINE)


def _reply_names_returned() -> list[str]:
    source = (LUA / "step.lua").read_text(encoding="utf-8")
    returned = source[source.rindex("return {") :]
    return re.findall(r"'(\w+)', ", returned)


def _reply_names_decoded() -> list[str]:
    tree = ast.parse(inspect.getsource(queue._decode_reply))
    return [
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "reply"
        and isinstance(node.slice, ast.Constant)
    ]


def test_the_reply_is_named_alike_in_the_header_the_script_and_the_decoder() -> None:
    assert _reply_names_in_header() == list(REPLY)
    assert _reply_names_returned() == list(REPLY)
    assert set(_reply_names_decoded()) == set(REPLY)


def test_every_option_the_node_sends_is_in_the_header() -> None:
    text = _header(LUA / "step.lua").split("ARGV[1]", 1)[1].split("\n    ARGV[2..]", 1)[0]
    described = set(re.findall(r"^ {15}(\w+) ", text, re.MULTILINE))

    class _Queue(LeasedQueue):  # only _options: no Redis
        def __init__(self) -> None:
            self.node_id, self.lease_ms, self.max_deliveries = "n", 1000, 3
            self.limits = type(
                "L",
                (),
                dict.fromkeys(
                    (
                        "rate",
                        "concurrency",
                        "burst_seconds",
                        "adaptive",
                        "target_concurrency",
                        "min_rate",
                        "start_rate",
                    ),
                    0,
                ),
            )()
            self.seen_form = {"mode": "bloom"}
            self.runs = True

    batch = StepBatch(
        count=True,
        start="run",
        list_dupes=True,
        revisit_due=5,
        sweep=5,
        revisit_limits=(1, 1, 1, 1),
        permit_check=True,
        seq=7,
        join_first=True,
        seed_want=1,
        session_options={"size": 1},
        render_options={"known": -1},
        releasing=True,
    )
    sent = set(json.loads(_Queue()._options(batch)))
    assert sent == described


@pytest.mark.parametrize(
    "name", ["step", "release", "requeue_dead", "start", "run_join", "run_leave", "flush"]
)
def test_every_code_a_script_uses_is_named_in_python(name: str) -> None:
    used = set(re.findall(r"\bCODE\.(\w+)", lua.load(name).source))
    assert used <= set(LUA_CODES), sorted(used - set(LUA_CODES))


def test_the_reply_decodes_by_name_whatever_the_order(redis_client, keys) -> None:
    """The decoder reads names, not positions: a reply in another order means the same."""
    pairs = [
        ("added", 2), ("duplicates", 1), ("offsite", 0), ("duplicate_at", [b"0"]),
        ("rediscovered", 0), ("still_linked", []), ("stale", 0), ("reaped", 0),
        ("promoted", 0), ("poisoned", []), ("handed_out", 0), ("revisits_capped", 0),
        ("revisits_forgotten", 0), ("permits_fixed", 0), ("permits_held", [b"s", 1]),
        ("leased", [b"s", b"{}", b"-5"]), ("permits", [b"s", 1]),
        ("shares", [b"s", 2, 1]), ("rejoined", 1), ("seeds", []), ("seeds_kind", b"S"),
        ("start_held", 0), ("counts", [b"queued", 1, b"delayed", 0, b"inflight", 1,
                                       b"seeds", 0, b"starting", 0]),
        ("wait_ms", None), ("now", 1_700_000_000_000), ("replayed", 0),
        ("sessions", [b"s", 3, b"[]", b"{}"]), ("retired", 1), ("probes", [b"s\nhttp://p:1"]),
        ("sites_forgotten", 2), ("render", [5, b'{"s\t/p/{n}\tparse":["http",3,0,1,[]]}', 0]),
        ("patterns_forgotten", 1), ("released", 3),
    ]  # fmt: skip
    flat = [v for name, value in pairs for v in (name.encode(), value)]
    backwards = [v for name, value in reversed(pairs) for v in (name.encode(), value)]
    first, second = queue._decode_reply(flat), queue._decode_reply(backwards)
    assert first == second
    assert first.counts is not None
    assert first.counts.queued == 1
    assert first.spare_back == [("s", 1)]
    assert first.shares == {"s": 2}
    assert first.sessions == [("s", 3, b"[]", b"{}")]
    assert first.retired == 1
    assert first.probes == [("s", "http://p:1")]
    assert first.sites_forgotten == 2
    assert first.render == (5, b'{"s\t/p/{n}\tparse":["http",3,0,1,[]]}', False)
    assert first.patterns_forgotten == 1
    assert first.released == 3
