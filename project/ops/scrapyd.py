"""Talk to a fleet of scrapyd nodes: ``fleetcrawl nodes|deploy|schedule``.

Nodes are listed in ``FLEETCRAWL_NODES`` (comma-separated URLs) or a file given
with ``--nodes-file`` (one URL per line, ``#`` comments). Credentials come from
``SCRAPYD_USERNAME`` / ``SCRAPYD_PASSWORD``, or per node from ``user:password@``
in its URL; they are never printed. Every node is asked at once, each gets one
line of result, and the exit code is 1 when any node failed.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.error import HTTPError, URLError
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit
from urllib.request import Request, urlopen

from project.ops.common import positive_int, positive_seconds
from project.ops.recurring import every
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "DEFAULT_PROJECT",
    "FleetError",
    "NodeError",
    "ScrapydNode",
    "build_egg",
    "load_nodes",
    "register",
]

logger = logging.getLogger(__name__)

DEFAULT_PROJECT: Final = "fleetcrawl"

_NODES_ENV: Final = "FLEETCRAWL_NODES"
_AUTH_HINT: Final = "check SCRAPYD_USERNAME/SCRAPYD_PASSWORD"
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_BUILD_TIMEOUT: Final = 300.0
_MAX_WORKERS: Final = 16
# Files setuptools reads besides the packages; setup.py is ours, not a leftover.
_BUILD_FILES: Final = ("pyproject.toml", "setup.cfg", "MANIFEST.in", "scrapy.cfg")
# The test suite and its shop, and the operations tooling (this CLI, the services
# launcher), never run on crawler nodes.
_NOT_DEPLOYED: Final = frozenset({"tests", "project/ops"})


class FleetError(Exception):
    """The fleet cannot be addressed: no nodes, a bad node list, an egg that does not build."""


class NodeError(Exception):
    """A scrapyd node did not do what was asked; the message says why, without secrets."""


@dataclass(frozen=True)
class ScrapydNode:
    """One scrapyd server: its base URL (no credentials, no trailing slash) and how to log in."""

    url: str
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    timeout: float = 30.0

    @classmethod
    def parse(
        cls, text: str, username: str = "", password: str = "", timeout: float = 30.0
    ) -> ScrapydNode:
        """Build from ``http[s]://[user:password@]host:port[/prefix]``; URL credentials win."""
        parts = urlsplit(text.strip())
        try:
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError as exc:
            raise FleetError(f"bad port in node URL {mask_url(text.strip())}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FleetError(
                f"not a scrapyd URL (expected http://host:port): {mask_url(text.strip())!r}"
            )
        if parts.query or parts.fragment:
            raise FleetError(f"a node URL has no query or fragment: {mask_url(text.strip())}")
        netloc = parts.netloc
        if parts.username is not None:
            username, password = unquote(parts.username), unquote(parts.password or "")
            netloc = netloc.rpartition("@")[2]
        # Endpoints are joined as "<url>/<endpoint>": a trailing slash would double.
        url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        return cls(url, username, password, timeout)

    def __str__(self) -> str:
        return mask_url(self.url)

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        """GET ``endpoint`` (``daemonstatus.json``) and return scrapyd's JSON answer."""
        query = f"?{urlencode(params)}" if params else ""
        return self._call(f"{endpoint}{query}")

    def post(
        self,
        endpoint: str,
        fields: Sequence[tuple[str, str]],
        files: Sequence[tuple[str, str, bytes]] = (),
    ) -> dict[str, Any]:
        """POST form ``fields`` (and ``files`` as multipart) to ``endpoint``."""
        if files:
            body, content_type = _multipart(fields, files)
        else:
            body, content_type = urlencode(fields).encode(), "application/x-www-form-urlencoded"
        return self._call(endpoint, body, content_type)

    def _call(
        self, endpoint: str, body: bytes | None = None, content_type: str = ""
    ) -> dict[str, Any]:
        # parse() let only http(s) URLs through.
        request = Request(f"{self.url}/{endpoint}", data=body)  # noqa: S310
        endpoint = endpoint.partition("?")[0]
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        logger.debug("%s %s/%s", request.get_method(), self, endpoint)
        try:
            with urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw: bytes = response.read()
        except HTTPError as exc:
            if exc.code == http.HTTPStatus.UNAUTHORIZED:
                raise NodeError(f"authentication failed (HTTP 401): {_AUTH_HINT}") from exc
            raise NodeError(f"{endpoint}: HTTP {exc.code} {exc.reason}") from exc
        except URLError as exc:
            raise NodeError(f"unreachable ({_describe(exc.reason, self.timeout)})") from exc
        except (OSError, http.client.HTTPException) as exc:
            # Read timeouts and dropped connections after the connect.
            raise NodeError(f"{endpoint}: no answer ({_describe(exc, self.timeout)})") from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise NodeError(f"{endpoint}: not a scrapyd answer (not JSON)") from exc
        if not isinstance(answer, dict):
            raise NodeError(f"{endpoint}: not a scrapyd answer (not a JSON object)")
        if answer.get("status") != "ok":
            raise NodeError(f"{endpoint}: scrapyd error: {answer.get('message', answer)}")
        return answer


def _describe(reason: object, timeout: float) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(reason, socket.gaierror):
        return f"unknown host: {reason.strerror}"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__


def _multipart(
    fields: Sequence[tuple[str, str]], files: Sequence[tuple[str, str, bytes]]
) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    chunks: list[bytes] = []
    for name, value in fields:
        chunks.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
            f"{value}\r\n".encode()
        )
    for name, filename, content in files:
        chunks += [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode(),
            content,
            b"\r\n",
        ]
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


# --- the node list ---------------------------------------------------------


def load_nodes(
    nodes_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[ScrapydNode]:
    """Read the nodes from *nodes_file*, else from ``FLEETCRAWL_NODES``; credentials from env."""
    env = os.environ if environ is None else environ
    if nodes_file is not None:
        try:
            text = nodes_file.read_text()
        except OSError as exc:
            raise FleetError(f"cannot read nodes file {nodes_file}: {exc.strerror}") from exc
        urls = [line.partition("#")[0].strip() for line in text.splitlines()]
        origin = str(nodes_file)
    else:
        urls = [part.strip() for part in env.get(_NODES_ENV, "").split(",")]
        origin = _NODES_ENV
    username, password = env.get("SCRAPYD_USERNAME", ""), env.get("SCRAPYD_PASSWORD", "")
    nodes = [ScrapydNode.parse(url, username, password, timeout) for url in urls if url]
    if not nodes:
        raise FleetError(
            f"no scrapyd nodes in {origin}: set {_NODES_ENV}=http://host1:6800,http://host2:6800"
            " or pass --nodes-file"
        )
    seen: set[str] = set()
    for node in nodes:
        if node.url in seen:
            raise FleetError(f"node {node} is listed twice in {origin}")
        seen.add(node.url)
    return nodes


def _for_each(nodes: Sequence[ScrapydNode], action: Callable[[ScrapydNode], str]) -> int:
    """Run *action* on every node at once; print its result per node in list order."""
    failed = 0
    with ThreadPoolExecutor(max_workers=min(len(nodes), _MAX_WORKERS)) as pool:
        futures = [pool.submit(action, node) for node in nodes]
        for node, future in zip(nodes, futures, strict=True):
            try:
                print(f"node {node}: {future.result()}", flush=True)
            except NodeError as exc:
                print(f"node {node}: {exc}", file=sys.stderr, flush=True)
                failed += 1
            except (KeyError, TypeError, IndexError) as exc:
                # JSON with status "ok" but not the fields scrapyd sends.
                print(f"node {node}: unexpected answer ({exc!r})", file=sys.stderr, flush=True)
                failed += 1
    if failed:
        print(f"error: {failed} of {len(nodes)} nodes failed", file=sys.stderr)
        return 1
    return 0


# --- building the egg ------------------------------------------------------


def _copy_sources(project_dir: Path, dest: Path) -> None:
    dest.mkdir()

    def ignore(folder: str, names: list[str]) -> set[str]:
        where = Path(folder).relative_to(project_dir).as_posix()
        dropped = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))}
        return dropped | {n for n in names if f"{where}/{n}" in _NOT_DEPLOYED}

    for entry in sorted(project_dir.iterdir()):
        if entry.is_dir() and (entry / "__init__.py").is_file():
            if entry.name not in _NOT_DEPLOYED:
                shutil.copytree(entry, dest / entry.name, ignore=ignore)
        elif entry.is_file() and (
            entry.name in _BUILD_FILES or entry.name.upper().startswith(("README", "LICENSE"))
        ):
            shutil.copy2(entry, dest / entry.name)
    if not (dest / "pyproject.toml").is_file():
        raise FleetError(f"no pyproject.toml in {project_dir}")


def build_egg(project_dir: Path, dist_dir: Path) -> Path:
    """Build the project's egg into *dist_dir* from a copy, leaving *project_dir* untouched."""
    with tempfile.TemporaryDirectory(prefix="fleetcrawl-egg-") as tmp:
        source = Path(tmp) / "source"
        try:
            _copy_sources(project_dir, source)
        except OSError as exc:
            raise FleetError(f"cannot copy {project_dir} to build the egg: {exc}") from exc
        # pyproject.toml holds the metadata, [project.entry-points.scrapy] included.
        (source / "setup.py").write_text("from setuptools import setup\n\nsetup()\n")
        argv = [sys.executable, "setup.py", "bdist_egg", "--dist-dir", str(dist_dir)]
        try:
            done = subprocess.run(
                argv,
                cwd=source,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise FleetError(f"building the egg took more than {_BUILD_TIMEOUT:g}s") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise FleetError(f"building the egg failed (exit {done.returncode}):\n{tail}")
    eggs = sorted(dist_dir.glob("*.egg"))
    if len(eggs) != 1:
        raise FleetError(f"expected one egg in {dist_dir}, found {len(eggs)}")
    return eggs[0]


def _project_dir(given: Path | None) -> Path:
    if given is not None:
        return given.resolve()
    from scrapy.utils.conf import closest_scrapy_cfg

    found = closest_scrapy_cfg()
    if not found:
        raise FleetError(
            "no scrapy.cfg in this folder or its parents: run from the project or pass --project-dir"
        )
    return Path(found).parent


# --- the commands ----------------------------------------------------------


def _nodes_command(args: argparse.Namespace) -> int:
    nodes = load_nodes(args.nodes_file, timeout=args.timeout)

    def report(node: ScrapydNode) -> str:
        daemon = node.get("daemonstatus.json")
        versions = node.get("listversions.json", project=args.project)["versions"]
        jobs = node.get("listjobs.json")
        deployed = (
            f"{args.project} {versions[-1]} ({_plural(len(versions), 'version')})"
            if versions
            else f"{args.project} not deployed"
        )
        summary = (
            f"up (scrapyd node {daemon.get('node_name', '?')}), {daemon['running']} running,"
            f" {daemon['pending']} pending, {daemon['finished']} finished; {deployed}"
        )
        lines = [summary]
        lines += [
            f"  running  {job['project']}/{job['spider']}  job {job['id']}  pid {job['pid']}"
            f"  since {job['start_time']}"
            for job in jobs["running"]
        ]
        lines += [
            f"  pending  {job['project']}/{job['spider']}  job {job['id']}"
            for job in jobs["pending"]
        ]
        return "\n".join(lines)

    return _for_each(nodes, report)


def _deploy_command(args: argparse.Namespace) -> int:
    nodes = load_nodes(args.nodes_file, timeout=args.timeout)
    project_dir = _project_dir(args.project_dir)
    # Unix time, as scrapyd-deploy does: scrapyd runs the highest version.
    version = args.version or str(int(time.time()))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleetcrawl-dist-") as dist:
        egg = build_egg(project_dir, Path(dist))
        content = egg.read_bytes()
    logger.debug("built %s in %.1fs", egg.name, time.monotonic() - started)
    print(f"built {egg.name} ({len(content) // 1024} KiB) from {project_dir} as version {version}")
    fields = [("project", args.project), ("version", version)]

    def upload(node: ScrapydNode) -> str:
        answer = node.post("addversion.json", fields, [("egg", "project.egg", content)])
        spiders = _plural(answer["spiders"], "spider")
        return f"deployed {answer['project']} {answer['version']} ({spiders})"

    return _for_each(nodes, upload)


def _schedule_command(args: argparse.Namespace) -> int:
    nodes = load_nodes(args.nodes_file, timeout=args.timeout)
    fields = [("project", args.project), ("spider", args.spider)]
    fields += [("setting", setting) for setting in args.settings]
    started: dict[str, list[str]] = {}

    def start_jobs(node: ScrapydNode) -> str:
        jobs: list[str] = []
        for _ in range(args.per_node):
            try:
                jobs.append(node.post("schedule.json", fields)["jobid"])
            except NodeError as exc:
                if not jobs:
                    raise
                raise NodeError(f"started {len(jobs)} of {args.per_node} jobs, then {exc}") from exc
            finally:
                started[str(node)] = list(jobs)
        return f"scheduled {args.spider}: {', '.join(jobs)}"

    if args.every is None:
        return _for_each(nodes, start_jobs)

    def running() -> int:
        """Jobs of the last round not finished yet (a node that cannot answer counts its all)."""
        left = 0
        for node in nodes:
            jobs = set(started.get(str(node), []))
            try:
                listed = node.get("listjobs.json", project=args.project)
                busy = {job["id"] for job in [*listed["pending"], *listed["running"]]}
            except (NodeError, KeyError, TypeError) as exc:
                # a node that cannot answer runs nothing we could wait for
                print(f"node {node}: cannot list its jobs ({exc})", file=sys.stderr, flush=True)
                busy = set()
            left += len(jobs & busy)
        return left

    def one_round() -> int:
        started.clear()
        return _for_each(nodes, start_jobs)

    return every(args, one_round, running)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _run(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except FleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run


# --- argument parsing ------------------------------------------------------


def _name(text: str) -> str:
    if not _NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a project/version/spider name: {text!r}")
    return text


def _setting(text: str) -> str:
    name, equals, _value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return text


def _duration(text: str) -> float:
    from scrapy.exceptions import NotConfigured

    from project.frontier.revisit import parse_duration

    try:
        seconds = parse_duration(text, "--every")
    except NotConfigured as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError("--every must be above 0")
    return seconds


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``nodes``, ``deploy`` and ``schedule`` to the ``fleetcrawl`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nodes-file",
        type=Path,
        metavar="FILE",
        help=f"scrapyd URLs, one per line, # comments (default: env {_NODES_ENV}, comma-separated)",
    )
    common.add_argument(
        "--project",
        type=_name,
        default=DEFAULT_PROJECT,
        help=f"scrapyd project name (default {DEFAULT_PROJECT})",
    )
    common.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="per request (default 30)",
    )
    epilog = (
        "Credentials: env SCRAPYD_USERNAME and SCRAPYD_PASSWORD. "
        "Exit status 1 if any node failed, 2 if the node list or the egg is wrong."
    )

    nodes = subparsers.add_parser(
        "nodes",
        parents=[common],
        help="status, deployed version and jobs of every scrapyd node",
        epilog=epilog,
    )
    nodes.set_defaults(func=_run(_nodes_command))

    deploy = subparsers.add_parser(
        "deploy",
        parents=[common],
        help="build the project's egg once and upload it to every scrapyd node",
        epilog=epilog,
    )
    deploy.add_argument(
        "--version", type=_name, help="version to deploy (default: the current Unix time)"
    )
    deploy.add_argument(
        "--project-dir",
        type=Path,
        metavar="DIR",
        help="folder with scrapy.cfg (default: found from the current folder)",
    )
    deploy.set_defaults(func=_run(_deploy_command))

    schedule = subparsers.add_parser(
        "schedule",
        parents=[common],
        help="start crawl jobs on every scrapyd node",
        epilog=epilog,
    )
    schedule.add_argument("spider", type=_name, help="spider to run (products)")
    schedule.add_argument(
        "--per-node",
        type=positive_int,
        default=1,
        metavar="N",
        help="jobs to start on each node (default 1)",
    )
    schedule.add_argument(
        "-s",
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Scrapy setting for the jobs (repeatable); keep secrets in the scrapyd environment",
    )
    schedule.add_argument(
        "--every",
        type=_duration,
        metavar="DURATION",
        help="start a crawl every DURATION (90, 30m, 6h, 1d) until stopped; a round whose"
        " crawl still runs at the next start is skipped",
    )
    schedule.add_argument(
        "--rounds",
        type=positive_int,
        metavar="N",
        help="with --every: stop after N rounds (the last crawl awaited)",
    )
    schedule.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="URL_OR_JSON",
        help="with --every: pushed to the spider's start_urls before each crawl (repeatable)",
    )
    schedule.set_defaults(func=_run(_schedule_command))
