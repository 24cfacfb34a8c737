"""The fleet's status in the terminal: ``fleetcrawl status`` prints it once, ``--watch`` live."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from project.monitoring.status import StatusReader

__all__ = [
    "NODE_COLUMNS",
    "SITE_COLUMNS",
    "human_bytes",
    "human_duration",
    "node_rows",
    "printable",
    "render",
    "watch",
]

NODE_COLUMNS = (
    "node",
    "state",
    "pages/min",
    "items/min",
    "pages",
    "in flight",
    "memory",
    "errors",
    "retries",
    "last seen",
)


SITE_COLUMNS = ("site", "state", "allowed", "achieved", "queued", "in flight")


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object, limit: int | None = None) -> str:
    """*value* as text a terminal shows as it is: every character that is not
    printable (control codes, escapes, bidi overrides, ...) as ``\\xNN``; at most
    *limit* characters, the cut marked with ``...``.

    For every string that came from outside (Redis, a page, a seed).
    """
    text = str(value)
    if limit is not None and len(text) > 4 * limit:
        text = text[: 4 * limit]  # a 10 MB value costs no more than its shown part
    shown = "".join(c if c.isprintable() else _escaped(c) for c in text)
    if limit is not None and len(shown) > limit:
        return shown[: max(0, limit - 3)] + "..."
    return shown


def _cell(value: object, limit: int | None = 300) -> Text:
    """A table cell of outside text: printable, never read as Rich markup."""
    return Text(printable(value, limit))


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float | None) -> str:
    """95 -> '1m 35s'; None -> 'unknown'."""
    if seconds is None:
        return "unknown"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def node_rows(status: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row of :data:`NODE_COLUMNS` per node, as printable text."""
    rows: list[tuple[str, ...]] = []
    for node in status["nodes"]:
        state = node["state"]
        if state == "finished" and node["finish_reason"]:
            state = f"finished ({printable(node['finish_reason'], 60)})"
        memory = node["rss_bytes"] + node["children_rss_bytes"]
        rows.append(
            (
                printable(node["id"], 80),
                str(state),
                f"{node['pages_per_min']:.0f}",
                f"{node['items_per_min']:.0f}",
                str(node["pages"]),
                str(node["in_flight"]),
                human_bytes(memory),
                str(node["errors"] + node["download_errors"]),
                str(node["retries"]),
                f"{human_duration(node['age_seconds'])} ago",
            )
        )
    return rows


def _pairs(title: str, pairs: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", expand=True)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in pairs:
        table.add_row(Text(name), Text(value))
    return table


def _sites(sites: list[dict[str, Any]], counts: dict[str, Any]) -> Table:
    title = "Sites"
    if counts and counts.get("with_work", 0) > len(sites):
        title += f" (the {len(sites)} busiest of {counts['with_work']} with work)"
    table = Table(title=title, title_justify="left", expand=True)
    for name in SITE_COLUMNS:
        table.add_column(name, justify="left" if name in ("site", "state") else "right")
    for site in sites:
        allowed = f"{site['allowed_rate']:g}/s" if site["allowed_rate"] > 0 else "unlimited"
        achieved = site.get("achieved_rate")
        table.add_row(
            _cell(site["site"], 80),
            _cell(site["state"]),
            allowed,
            "-" if achieved is None else f"{achieved:.1f}/s",
            str(site["queued"]),
            str(site["in_flight"]),
        )
    return table


def _waiting(status: dict[str, Any]) -> str:
    """Records not in MongoDB yet, and where: the fleet's outbox, the nodes' journals."""
    outbox = status.get("outbox")
    parts = []
    if outbox is not None:
        text = f"{outbox['records']} in the outbox ({outbox['bytes'] / 1048576:.1f} MiB)"
        if outbox["malformed"]:
            text += f", {outbox['malformed']} malformed set aside"
        parts.append(text)
    journals = [
        f"{printable(n['id'], 60)}: {n['journal_backlog']}"
        for n in status.get("nodes", [])
        if n.get("journal_backlog")
    ]
    if journals:
        parts.append("journals of " + ", ".join(journals[:10]))
    behind = [
        f"{printable(n['id'], 60)}: {n['store_waiting']}"
        for n in status.get("nodes", [])
        if n.get("store_behind")
    ]
    if behind:
        parts.append("stores behind, downloads held (items waiting) on " + ", ".join(behind[:10]))
    return "; ".join(parts) or "n/a"


def _useful(status: dict[str, Any]) -> list[tuple[str, str]]:
    scale = status.get("scale")
    if not isinstance(scale, dict):
        return []
    text = (
        f"{scale['useful_nodes']} ({scale['usable_slots']} downloads at once /"
        f" {scale['node_slots']} a node; {scale['nodes_alive']} alive)"
    )
    return [("useful nodes", text)]


def render(status: dict[str, Any]) -> RenderableType:
    """Everything ``status`` and ``status --watch`` show for one ``fleet_status()`` result.

    Text from Redis (node ids, sites, errors, URLs) is shown as it is, made printable:
    never read as Rich markup, never sent to the terminal as control codes.
    """
    progress, fleet, mongo = status["progress"], status["fleet"], status.get("mongo", {})
    bands = ", ".join(f"p{p}: {n}" for p, n in status["queued_by_priority"].items())
    by_node = ", ".join(
        f"{printable(n, 80)}: {c}" for n, c in list(status["in_flight_by_node"].items())[:20]
    )
    backlog = status["journal_backlog"]
    drain = progress["drain_per_s"]
    trend = ""
    if drain is not None:
        trend = f"  draining {drain:.1f}/s" if drain > 0 else f"  growing {-drain:.1f}/s"
    header = Text.assemble(
        ("fleetcrawl ", "bold"),
        f"{printable(status['spider'], 80)}"
        f"  {time.strftime('%H:%M:%S', time.localtime(status['time']))}  ",
        f"{fleet['nodes_alive']} alive, {fleet['nodes_dead']} dead,"
        f" {fleet['nodes_finished']} finished nodes",
    )
    bar = ProgressBar(total=max(progress["total"], 1), completed=progress["done"], width=50)
    eta = Text(
        f" {progress['done']}/{progress['total']} pages ({progress['fraction']:.0%})"
        f"  ETA {human_duration(progress['eta_seconds'])}" + trend
    )
    frontier = _pairs(
        "Frontier",
        [
            ("queued", f"{status['queued']}" + (f" ({bands})" if bands else "")),
            ("delayed retries", str(status["delayed_retries"])),
            ("in flight", f"{status['in_flight']}" + (f" ({by_node})" if by_node else "")),
            ("seeds waiting", str(status["seeds_waiting"])),
            (
                "seen",
                f"{status['seen']} URLs ({human_bytes(status['seen_bytes'])})"
                + (
                    f", Bloom filter {status['seen_fill']:.0%} full"
                    if status.get("seen_fill") is not None
                    else ""
                ),
            ),
            ("dead letters", str(status["dead_letters"])),
            *(
                [
                    (
                        "revisits",
                        "{records} records of {sites} sites, {due} due".format(
                            **status["revisits"]
                        ),
                    )
                ]
                if status.get("revisits", {}).get("records")
                else []
            ),
        ],
    )
    if "error" in mongo:
        stored = [("mongodb", printable(mongo["error"], 200))]
    else:
        stored = [(f"mongodb {name}", str(mongo.get(name, "n/a"))) for name in mongo]
    results = _pairs(
        "Results and rates",
        [
            *stored,
            ("seeds rejected", str(fleet["seeds_rejected"])),
            ("journal backlog", "n/a" if backlog is None else str(backlog)),
            ("waiting for mongodb", _waiting(status)),
            ("pages/min", f"{fleet['pages_per_min']:.0f}"),
            ("items/min", f"{fleet['items_per_min']:.0f}"),
            *_useful(status),
            (
                "errors / retries",
                f"{fleet['errors'] + fleet['download_errors']} / {fleet['retries']}",
            ),
        ],
    )
    columns = Table.grid(expand=True, padding=(0, 2))
    columns.add_column(ratio=1)
    columns.add_column(ratio=1)
    columns.add_row(frontier, results)
    nodes = Table(title="Nodes", title_justify="left", expand=True)
    for name in NODE_COLUMNS:
        nodes.add_column(name, justify="left" if name in ("node", "state") else "right")
    for row in node_rows(status):
        nodes.add_row(*(Text(cell) for cell in row), style="bold" if row[1] == "dead" else None)
    parts: list[RenderableType] = [header, Group(bar, eta), columns]
    for fault in status.get("storage_errors") or []:
        what = printable(fault["last_error"] or "journal writes failing", 200)
        parts.append(
            Text(
                f"storage error on {printable(fault['node'], 80)}: {what}"
                f" ({fault['mongo_errors']} MongoDB, {fault['journal_errors']} journal)",
                style="bold",
            )
        )
    if status["sites"]:
        parts.append(_sites(status["sites"], status.get("site_count") or {}))
    parts.append(nodes)
    blocking = status.get("blocking") or {}
    if blocking.get("sites") or blocking.get("proxies"):
        parts.append(_blocking(blocking))
    rendering = status.get("rendering") or {}
    if rendering.get("patterns"):
        parts.append(_rendering(rendering))
    if status["failures"] or fleet["retry_reasons"]:
        failures = Table(title="Failures", title_justify="left", expand=True)
        failures.add_column("count", justify="right")
        failures.add_column("what")
        failures.add_column("last URL", overflow="fold")
        for group in status["failures"][:5]:
            failures.add_row(
                str(group["count"]),
                _cell(f"dead: {printable(group['error'], 200)}"),
                _cell(group["last_url"]),
            )
        for reason, count in sorted(fleet["retry_reasons"].items(), key=lambda kv: -kv[1])[:5]:
            failures.add_row(str(count), _cell(f"retried: {printable(reason, 200)}"), "")
        parts.append(failures)
    return Group(*parts)


def _blocking(blocking: dict[str, Any]) -> RenderableType:
    """Blocks per site (with its sessions and tier) and the proxies' health."""
    table = Table(title="Blocks and proxies", title_justify="left", expand=True)
    for name in ("site or proxy", "answers", "blocked", "rate", "sessions", "tier", "cooling"):
        table.add_column(name, justify="left" if name in ("site or proxy", "cooling") else "right")
    for row in blocking.get("sites", [])[:10]:
        table.add_row(
            _cell(row["site"]), str(row["responses"]), str(row["blocks"]),
            f"{row['block_rate']:.0%}", str(row["sessions"]),
            "-" if row["tier"] is None else str(row["tier"]),
            _cell(", ".join(row["cooling"])[:200]),
        )  # fmt: skip
    for row in blocking.get("proxies", [])[:20]:
        health = "-" if row["health"] is None else f"{row['health']:.0%} ok"
        cooling = ", ".join(f"{site} {s}s" for site, s in sorted(row["cooling"].items()))
        table.add_row(
            _cell(f"proxy {row['proxy']}"), str(row["requests"]), str(row["blocked"]), health,
            "", "", _cell(cooling[:200]),
        )  # fmt: skip
    return table


def _rendering(rendering: dict[str, Any]) -> RenderableType:
    """Adaptive rendering's patterns: each one's mode and outcomes."""
    modes = rendering.get("modes") or {}
    title = (
        f"Rendering: {rendering['count']} patterns ({modes.get('http', 0)} plain HTTP,"
        f" {modes.get('browser', 0)} browser, {modes.get('learn', 0)} learning)"
    )
    table = Table(title=title, title_justify="left", expand=True)
    for name in ("site", "path template", "callback", "mode", "agreed", "missed"):
        table.add_column(name, justify="right" if name in ("agreed", "missed") else "left")
    for row in rendering["patterns"][:20]:
        table.add_row(
            _cell(row["site"]), _cell(row["template"]), _cell(row["callback"]),
            _cell(row["mode"]), str(row["agreed"]), str(row["missed"]),
        )  # fmt: skip
    return table


def watch(reader: StatusReader, interval: float = 2.0, console: Console | None = None) -> int:
    """Redraw the status every *interval* seconds until Ctrl-C.

    Returns 1 when Redis cannot be read at the start, or was unreachable at the
    last attempt before Ctrl-C; 0 otherwise.
    """
    console = console or Console()
    try:
        view = render(reader.read())
    except RedisError:
        reader.close()
        raise  # the caller says what failed, in one line, and exits non-zero
    failed = False
    with Live(view, console=console, auto_refresh=False, transient=False) as live:
        try:
            while True:
                live.refresh()
                time.sleep(interval)
                try:
                    view = render(reader.read())
                    failed = False
                except RedisError as exc:
                    failed = True
                    view = Text(
                        f"Redis unreachable: {printable(exc, 300)}; retrying every {interval:g}s"
                    )
                live.update(view)
        except KeyboardInterrupt:
            return 1 if failed else 0
        finally:
            reader.close()
