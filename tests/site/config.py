"""Options of the test shop and their command line."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tests.site.defense import ANSWERS, MIXED, parse_ban
from tests.site.epochs import MAX_EPOCH

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ShopConfig", "parse_args"]


@dataclass(frozen=True)
class ShopConfig:
    """Everything that shapes the shop; behaviours are off by default."""

    host: str = "127.0.0.1"
    port: int = 0
    seed: int = 0
    products: int = 200
    page_size: int = 20
    latency_ms: float = 0.0
    js_share: float = 0.0
    malformed_share: float = 0.0
    flaky_share: float = 0.0
    flaky_failures: int = 2
    broken_share: float = 0.0
    slow_share: float = 0.0
    slow_ms: float = 1000.0
    #: Requests the shop serves at once (0: any number): past it they queue, so latency grows
    #: with concurrency past this knee and throughput stays at knee / latency.
    knee: int = 0
    retry_after_burst: int = 0
    retry_after: int = 1
    robots_crawl_delay: float | None = None
    robots_disallow: tuple[str, ...] = field(default=())
    #: Pages (path and query, as linked) answered after ``slow_ms`` more, whatever they are.
    slow_paths: tuple[str, ...] = field(default=())
    #: Listing pages also link other schemes, local ports, invalid URLs and the hostile pages.
    hostile: bool = False
    #: Local ports the hostile links point at (the crawl's Redis, a canary, a closed port).
    hostile_ports: tuple[int, ...] = field(default=())
    #: Size of the hostile huge product page, streamed in chunks.
    huge_bytes: int = 30_000_000
    #: How long the hostile never-ending page stalls before the shop closes it.
    stall_seconds: float = 60.0
    #: Books of the book site (``/books/``) and articles of the article site (``/articles/``).
    books: int = 300
    articles: int = 60
    #: Epoch of the catalogue served at start (0: the generated one; see tests.site.epochs) and
    #: what each epoch changes: shares of the plain products repriced, flipping availability
    #: and removed, and the share of the product count added.
    epoch: int = 0
    epoch_price_share: float = 0.10
    epoch_stock_share: float = 0.05
    epoch_added: float = 0.02
    epoch_removed: float = 0.02

    #: Defence (tests.site.defense): (address, answer) banned from the start, the requests a
    #: minute past which an address is banned (0: never), and what such a ban answers.
    bans: tuple[tuple[str, str], ...] = field(default=())
    ban_after: int = 0
    ban_answer: str = "challenge"
    #: Every page blocked the first this many times it is asked for, with this answer.
    block_first: int = 0
    block_first_answer: str = "mixed"

    #: The mixed site (``/mixed/``, tests.site.mixed; 0: off, its paths 404): its products, the
    #: shares of them under the JavaScript-only and the switching pattern, and the deal pages
    #: served before the switching pattern turns JavaScript-only (0: only ``/_mixed?switch=1``).
    mixed: int = 0
    mixed_js_share: float = 0.3
    mixed_deal_share: float = 0.0
    mixed_switch_after: int = 0

    def as_dict(self) -> dict[str, object]:
        """JSON-ready copy, as shown in ``/_stats``."""
        data = asdict(self)
        data["bans"] = [list(ban) for ban in self.bans]
        data["robots_disallow"] = list(self.robots_disallow)
        data["slow_paths"] = list(self.slow_paths)
        data["hostile_ports"] = list(self.hostile_ports)
        return data


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not within [0, 1]")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _duration(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return value


def _epoch(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_EPOCH:
        raise argparse.ArgumentTypeError(f"{text!r} is not within [0, {MAX_EPOCH}]")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.site", description="Deterministic synthetic web shop."
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    add("--port", type=_count, default=0, help="port; 0 picks a free one (default: %(default)s)")
    add("--seed", type=int, default=0, help="catalogue seed (default: %(default)s)")
    add("--products", type=_count, default=200, help="number of products (default: %(default)s)")
    add(
        "--page-size",
        type=_count,
        default=20,
        help="products per listing page (default: %(default)s)",
    )
    add("--latency-ms", type=_duration, default=0.0, help="delay before every page is answered")
    add(
        "--js-share", type=_share, default=0.0, help="share of products rendered by JavaScript only"
    )
    add(
        "--malformed-share",
        type=_share,
        default=0.0,
        help="share of products with a missing or garbage price",
    )
    add("--flaky-share", type=_share, default=0.0, help="share of products answering 503 at first")
    add("--flaky-failures", type=_count, default=2, help="503s before a flaky page answers 200")
    add("--broken-share", type=_share, default=0.0, help="share of products always answering 503")
    add(
        "--slow-share", type=_share, default=0.0, help="share of products answered with extra delay"
    )
    add("--slow-ms", type=_duration, default=1000.0, help="extra delay of slow pages")
    add(
        "--knee",
        type=_count,
        default=0,
        help="requests served at once (0: any); more wait their turn (a latency knee)",
    )
    add(
        "--slow-paths",
        action="append",
        default=[],
        metavar="PATH",
        help="a page (path?query) answered after --slow-ms more (repeatable)",
    )
    add("--retry-after-burst", type=_count, default=0, help="first N product requests answer 429")
    add("--retry-after", type=_count, default=1, help="Retry-After seconds of those 429s")
    add("--robots-crawl-delay", type=_duration, default=None, help="Crawl-delay in robots.txt")
    add(
        "--robots-disallow",
        action="append",
        default=[],
        metavar="PATH",
        help="Disallow line (repeatable)",
    )
    add(
        "--hostile",
        action="store_true",
        help="listings also link file:, ftp:, data:, javascript:, local ports, invalid URLs"
        " and the /hostile/ pages (huge, Retry-After abuse, 429 for ever, never-ending)",
    )
    add(
        "--hostile-ports",
        type=_port,
        nargs="+",
        action="extend",
        default=[],
        metavar="PORT",
        help="local ports the hostile listings link to (the crawl's Redis, a closed port)",
    )
    add("--huge-bytes", type=_count, default=30_000_000, help="size of /hostile/huge")
    add(
        "--stall-seconds",
        type=_duration,
        default=60.0,
        help="how long /hostile/stall sends nothing before the shop closes it",
    )
    add("--books", type=_count, default=300, help="books under /books/ (default: %(default)s)")
    add(
        "--articles",
        type=_count,
        default=60,
        help="articles under /articles/ (default: %(default)s)",
    )
    add(
        "--epoch",
        type=_epoch,
        default=0,
        help="epoch of the catalogue served at start; 0 is the generated one, each later one"
        " changes the one before (default: %(default)s)",
    )
    add(
        "--epoch-price-share",
        type=_share,
        default=0.10,
        help="share of the plain products each epoch reprices (default: %(default)s)",
    )
    add(
        "--epoch-stock-share",
        type=_share,
        default=0.05,
        help="share of the plain products whose availability each epoch flips"
        " (default: %(default)s)",
    )
    add(
        "--epoch-added",
        type=_share,
        default=0.02,
        help="products each epoch adds, as a share of its product count (default: %(default)s)",
    )
    add(
        "--epoch-removed",
        type=_share,
        default=0.02,
        help="share of the plain products each epoch removes (default: %(default)s)",
    )
    add(
        "--ban",
        action="append",
        type=_ban,
        default=[],
        metavar="ADDRESS[=ANSWER]",
        help="a client address banned from the start, answered "
        + "|".join(ANSWERS)
        + " (default challenge; repeatable)",
    )
    add(
        "--ban-after",
        type=_count,
        default=0,
        help="ban an address that sends more requests than this within a minute (0: never)",
    )
    add(
        "--ban-answer",
        choices=ANSWERS,
        default="challenge",
        help="what an address banned by --ban-after gets (default: %(default)s)",
    )
    add(
        "--block-first",
        type=_count,
        default=0,
        help="block every page the first N times it is asked for (default: %(default)s)",
    )
    add(
        "--block-first-answer",
        choices=(*ANSWERS, MIXED),
        default=MIXED,
        help="what those blocks answer; mixed: one by the page (default: %(default)s)",
    )
    add(
        "--mixed",
        type=_count,
        default=0,
        help="products of the mixed site under /mixed/; 0: no mixed site (default: %(default)s)",
    )
    add(
        "--mixed-js-share",
        type=_share,
        default=0.3,
        help="share of the mixed products served JavaScript-only, under /mixed/app/"
        " (default: %(default)s)",
    )
    add(
        "--mixed-deal-share",
        type=_share,
        default=0.0,
        help="share of the mixed products under /mixed/deal/, static until the switch"
        " (default: %(default)s)",
    )
    add(
        "--mixed-switch-after",
        type=_count,
        default=0,
        help="deal pages served static before they turn JavaScript-only; 0: only when"
        " /_mixed?switch=1 says so (default: %(default)s)",
    )
    return parser


def _ban(text: str) -> tuple[str, str]:
    try:
        return parse_ban(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_args(argv: Sequence[str] | None = None) -> ShopConfig:
    """Parse the command line of ``python -m tests.site``."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.products < 1 or args.page_size < 1:
        parser.error("--products and --page-size must be at least 1")
    if args.js_share + args.malformed_share + args.flaky_share + args.broken_share > 1.0 + 1e-9:
        parser.error(
            "--js-share, --malformed-share, --flaky-share and --broken-share add up to more than 1"
        )
    if args.mixed_js_share + args.mixed_deal_share > 1.0 + 1e-9:
        parser.error("--mixed-js-share and --mixed-deal-share add up to more than 1")
    options = vars(args)
    options["robots_disallow"] = tuple(options["robots_disallow"])
    options["slow_paths"] = tuple(options["slow_paths"])
    options["hostile_ports"] = tuple(options["hostile_ports"])
    options["bans"] = tuple(options.pop("ban"))
    return ShopConfig(**options)
