"""The terminal status shows text from Redis as text, never as Rich markup or terminal control
codes, whatever a seed, a page or a Redis writer put there."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console

from project.monitoring.console import printable, render, watch
from project.monitoring.status import StatusReader
from tests.test_monitor import _status

if TYPE_CHECKING:
    from project.frontier.keys import FrontierKeys

HOSTILE = [
    "[/x]",
    "[bold red]loud[/]",
    "\x1b[31mred\x1b[0m",
    "over\rwrite",
    "bell\x07 back\x08 nul\x00 del\x7f c1\x9b",
    "bidi \u202eevil\u202c zero\u200bwidth",
    "A" * 10_000,
]


def _controls(text: str) -> list[str]:
    """Characters a terminal would act on rather than show (newlines end lines)."""
    return [c for c in text if c != "\n" and not c.isprintable()]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain text, ünïcode 中文", "plain text, ünïcode 中文"),
        ("[/x]", "[/x]"),
        ("\x1b[31m", "\\x1b[31m"),
        ("a\rb\nc\td", "a\\x0db\\x0ac\\x09d"),
        ("\x7f\x9b", "\\x7f\\x9b"),
        ("\u202e", "\\u202e"),
        ("\U000e0001", "\\U000e0001"),
        (b"bytes", "b'bytes'"),
    ],
)
def test_printable_keeps_text_and_escapes_the_rest(value: Any, shown: str) -> None:
    assert printable(value) == shown


def test_printable_bounds_what_it_shows() -> None:
    assert printable("A" * 10_000, 90) == "A" * 87 + "..."
    assert len(printable("\x1b" * 10_000, 120)) == 120
    assert printable("short", 90) == "short"


def _hostile_status(value: str) -> dict[str, Any]:
    base = _status()
    node = {**base["nodes"][0], "id": value, "host": value, "finish_reason": value}
    node["state"] = "finished"
    return _status(
        spider=value,
        nodes=[node],
        in_flight_by_node={value: 5},
        sites=[{**base["sites"][0], "site": value, "state": value}],
        failures=[{"count": 4, "error": value, "kind": value, "last_url": value}],
        fleet={**base["fleet"], "retry_reasons": {value: 6}},
        mongo={"error": value},
    )


@pytest.mark.parametrize("value", HOSTILE)
def test_status_renders_hostile_text_as_text(value: str) -> None:
    """A seed `[/x]` (it once crashed `status --watch`) and `\\x1b[` are shown as text."""
    out = Console(record=True, width=200, color_system=None, force_terminal=False)
    out.print(render(_hostile_status(value)))
    text = out.export_text()
    assert _controls(text) == []
    if value.startswith("["):
        assert value in text, "shown as written, not taken as markup"
    if "\x1b" in value:
        assert "\\x1b[31mred" in text
    assert len(text) < 100_000, "a 10 kB value is shown cut"


def _dead(redis_client, keys: FrontierKeys, value: str) -> None:
    record = {"url": value, "error": value, "kind": "seed", "node": value, "time": 1.0}
    redis_client.lpush(keys.dead, json.dumps(record), b"\xff not json", b"[1, 2]")
    redis_client.hset(keys.nodes, value, json.dumps({"id": value, "pages": "many", "x": value}))
    redis_client.hset(keys.nodes, "garbage", b"{")
    redis_client.zadd(keys.older_site_queue(value), {json.dumps({"url": value}): 0})
    redis_client.zadd(keys.queue, {value: 0})


@pytest.mark.parametrize("value", HOSTILE)
def test_watch_shows_hostile_dead_letters_and_nodes(
    redis_url, redis_client, keyspace, value: str
) -> None:
    """`status --watch` over a real Redis holding hostile dead letters, nodes and sites."""
    keys = keyspace.keys("products")
    _dead(redis_client, keys, value)

    class TwoReads(StatusReader):
        reads = 0

        def read(self) -> dict[str, Any]:
            TwoReads.reads += 1
            if TwoReads.reads > 2:
                raise KeyboardInterrupt  # what Ctrl-C does
            return super().read()

    out = Console(record=True, width=200, color_system=None, force_terminal=True)
    assert watch(TwoReads(redis_url, keys), interval=0.01, console=out) == 0
    text = out.export_text()
    assert "not a dead-letter record" in text
    assert _controls(text) == []
    if value.startswith("["):
        assert value in text
