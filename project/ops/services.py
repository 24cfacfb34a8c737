"""Local Redis and MongoDB-compatible (FerretDB) servers that the project starts itself.

Backs ``fleetcrawl services start|stop|status`` (``project.ops.services_cli``) and the
test fixtures. Every file lives under one state folder: ``<state>/redis/`` (config, AOF,
log, pidfile) and ``<state>/ferretdb/`` (SQLite data in ``data/``, FerretDB state, log,
pidfile). Servers listen on loopback only and run in their own session,
so they outlive the command that started them; they are found again through
their pidfiles, which are checked against ``/proc/<pid>/cmdline`` (Linux).
The servers' executables come from ``project.ops.install``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from project.ops.install import ensure_ferretdb, ensure_redis_server
from project.ops.processes import (
    ServiceError,
    check_port_free,
    free_port,
    is_service_process,
    log_tail,
    netloc,
    pid_alive,
    terminate,
    write_private,
)
from project.utils import mask_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "SERVICE_NAMES",
    "ServiceError",
    "ServiceInfo",
    "ServiceStatus",
    "ServicesConfig",
    "free_port",
    "running_pid",
    "start_mongo",
    "start_redis",
    "status",
    "stop_service",
]

logger = logging.getLogger(__name__)

SERVICE_NAMES: Final = ("redis", "mongo")

_EXECUTABLES: Final = {"redis": "redis-server", "mongo": "ferretdb"}
_DIRECTORIES: Final = {"redis": "redis", "mongo": "ferretdb"}
_MAX_PORT: Final = 65535


class _NotReadyError(Exception):
    """The service does not answer yet; the message says why."""


@dataclass(frozen=True)
class ServicesConfig:
    """Where and how the local services run; ``state_dir`` is made absolute."""

    state_dir: Path
    host: str = "127.0.0.1"
    redis_port: int = 6379
    mongo_port: int = 27017
    redis_password: str | None = dataclasses.field(default=None, repr=False)
    start_timeout: float = 30.0
    stop_timeout: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().resolve())
        host = "127.0.0.1" if self.host == "localhost" else self.host
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"host must be a loopback address (127.0.0.1, ::1), got {self.host!r}")
        object.__setattr__(self, "host", host)
        for port in (self.redis_port, self.mongo_port):
            if not 0 < port <= _MAX_PORT:
                raise ValueError(f"port must be in 1..65535, got {port}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServicesConfig:
        """Build from FLEETCRAWL_STATE_DIR, FLEETCRAWL_*_PORT and REDIS_PASSWORD."""
        env = os.environ if environ is None else environ
        return cls(
            state_dir=Path(env.get("FLEETCRAWL_STATE_DIR", ".state")),
            redis_port=int(env.get("FLEETCRAWL_REDIS_PORT", "6379")),
            mongo_port=int(env.get("FLEETCRAWL_MONGO_PORT", "27017")),
            redis_password=env.get("REDIS_PASSWORD") or None,
        )

    @property
    def redis_url(self) -> str:
        """Client URL of the local Redis, with the password when one is set."""
        auth = f":{quote(self.redis_password, safe='')}@" if self.redis_password else ""
        return f"redis://{auth}{netloc(self.host, self.redis_port)}/0"

    @property
    def mongo_url(self) -> str:
        """Client URL of the local FerretDB."""
        return f"mongodb://{netloc(self.host, self.mongo_port)}/"


@dataclass(frozen=True)
class ServiceInfo:
    """A running local service."""

    name: str
    pid: int
    url: str = dataclasses.field(repr=False)
    log_file: Path
    data_dir: Path

    def __str__(self) -> str:
        return f"{self.name}: running pid {self.pid} at {mask_url(self.url)}"


@dataclass(frozen=True)
class ServiceStatus:
    """What ``status`` found; ``state`` is running, stopped, stale pidfile or not answering."""

    name: str
    state: str
    pid: int | None
    url: str = dataclasses.field(repr=False)
    log_file: Path
    data_dir: Path
    detail: str = ""

    @property
    def running(self) -> bool:
        """True when the process is alive and answers."""
        return self.state == "running"

    def __str__(self) -> str:
        if self.state == "running":
            return f"{self.name}: running pid {self.pid} at {mask_url(self.url)}"
        if self.state == "stopped":
            return f"{self.name}: stopped"
        return f"{self.name}: {self.state} (pid {self.pid}): {self.detail}"


@dataclass(frozen=True)
class _Layout:
    name: str
    executable: str
    directory: Path
    data_dir: Path
    pid_file: Path
    log_file: Path
    port: int
    url: str

    def info(self, pid: int) -> ServiceInfo:
        return ServiceInfo(self.name, pid, self.url, self.log_file, self.data_dir)


def _layout(cfg: ServicesConfig, name: str, directory_name: str | None = None) -> _Layout:
    """*name*'s files; a Redis of a cluster or a sentinel group lives in *directory_name*."""
    if name not in SERVICE_NAMES:
        raise ValueError(f"unknown service {name!r}, expected one of {', '.join(SERVICE_NAMES)}")
    directory = cfg.state_dir / (directory_name or _DIRECTORIES[name])
    redis = name == "redis"
    return _Layout(
        name=name,
        executable=_EXECUTABLES[name],
        directory=directory,
        data_dir=directory if redis else directory / "data",
        pid_file=directory / f"{_DIRECTORIES[name]}.pid",
        log_file=directory / f"{_DIRECTORIES[name]}.log",
        port=cfg.redis_port if redis else cfg.mongo_port,
        url=cfg.redis_url if redis else cfg.mongo_url,
    )


# --- processes -------------------------------------------------------------


def _read_pid(layout: _Layout) -> int | None:
    try:
        text = layout.pid_file.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ServiceError(f"cannot read {layout.pid_file}: {exc}") from exc
    try:
        pid = int(text)
    except ValueError:
        pid = 0
    if pid > 0:
        return pid
    logger.warning("removing unreadable pidfile %s (%r)", layout.pid_file, text[:40])
    layout.pid_file.unlink(missing_ok=True)
    return None


def _live_pid(layout: _Layout) -> int | None:
    """The pid in the pidfile if it is our server; a stale pidfile is removed."""
    pid = _read_pid(layout)
    if pid is not None and not is_service_process(pid, layout.executable):
        logger.warning(
            "removing stale pidfile %s: pid %d is not a running %s",
            layout.pid_file,
            pid,
            layout.executable,
        )
        layout.pid_file.unlink(missing_ok=True)
        return None
    return pid


# --- probes ----------------------------------------------------------------


def _reply(exc: redis.RedisError) -> str:
    # The error line as the server sent it; redis-py splits off its code (status_code, 8.x).
    code = getattr(exc, "status_code", None)
    return f"-{code} {exc}" if code else str(exc)


def _probe_redis(cfg: ServicesConfig) -> None:
    where = netloc(cfg.host, cfg.redis_port)
    client = redis.Redis(
        cfg.host,
        cfg.redis_port,
        password=cfg.redis_password,
        socket_timeout=2,
        socket_connect_timeout=2,
        # RESP2 sends a bare AUTH, which a server without a password refuses; RESP3's
        # HELLO AUTH default <password> would pass there and hide the missing password.
        protocol=2,
        retry=Retry(NoBackoff(), 0),  # the caller polls; the default retries with backoff
    )
    # BusyLoadingError and AuthenticationError subclass ConnectionError: they come first.
    try:
        with client:
            answered = client.ping()
    except redis.BusyLoadingError as exc:
        raise _NotReadyError(_reply(exc)) from exc
    except redis.AuthenticationError as exc:
        if not cfg.redis_password:  # no AUTH was sent, so this is NOAUTH
            raise ServiceError(f"redis at {where} needs a password: set REDIS_PASSWORD") from exc
        raise ServiceError(f"redis at {where} refused REDIS_PASSWORD: {_reply(exc)}") from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, OSError):
            raise _NotReadyError(f"{where}: {cause.strerror or cause}") from exc
        raise _NotReadyError(str(exc)) from exc
    except redis.RedisError as exc:
        raise ServiceError(f"redis at {where} answered PING with {_reply(exc)}") from exc
    if not answered:
        raise ServiceError(f"redis at {where} answered PING with something other than PONG")


def _probe_mongo(cfg: ServicesConfig) -> None:
    where = netloc(cfg.host, cfg.mongo_port)
    try:
        socket.create_connection((cfg.host, cfg.mongo_port), timeout=2.0).close()
    except OSError as exc:
        raise _NotReadyError(f"{where}: {exc.strerror or exc}") from exc
    try:
        # Optional: without pymongo a TCP connect has to do.
        import pymongo
        import pymongo.errors
    except ImportError:
        return
    client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
        cfg.mongo_url, serverSelectionTimeoutMS=2000, connectTimeoutMS=2000, directConnection=True
    )
    try:
        client.admin.command("ping")
    except pymongo.errors.PyMongoError as exc:
        raise _NotReadyError(f"ping: {exc}") from exc
    finally:
        client.close()


_PROBES: Final[dict[str, Callable[[ServicesConfig], None]]] = {
    "redis": _probe_redis,
    "mongo": _probe_mongo,
}


def _wait_until_answering(
    cfg: ServicesConfig, layout: _Layout, pid: int, log_offset: int = 0
) -> None:
    where = netloc(cfg.host, layout.port)
    deadline = time.monotonic() + cfg.start_timeout
    while True:
        if not pid_alive(pid):
            problem = f"exited before answering on {where}"
            break
        try:
            _PROBES[layout.name](cfg)
        except _NotReadyError as exc:
            if time.monotonic() >= deadline:
                problem = f"did not answer on {where} within {cfg.start_timeout:g}s ({exc})"
                break
        else:
            return
        time.sleep(0.1)
    raise ServiceError(
        f"{layout.name} ({layout.executable}, pid {pid}) {problem}; "
        f"last lines of {layout.log_file}:\n{log_tail(layout.log_file, log_offset)}"
    )


# --- start / stop / status -------------------------------------------------


def _redis_quote(value: str) -> str:
    escaped = "".join(
        char
        if char.isascii() and char.isprintable() and char not in '"\\'
        else "".join(f"\\x{byte:02x}" for byte in char.encode())
        for char in value
    )
    return f'"{escaped}"'


def _redis_config(cfg: ServicesConfig, layout: _Layout, extra: Sequence[str] = ()) -> str:
    lines = [
        f"bind {cfg.host}",
        "protected-mode yes",
        f"port {cfg.redis_port}",
        "daemonize no",
        f"dir {_redis_quote(str(layout.data_dir))}",
        'logfile ""',
        "appendonly yes",
        "appendfsync everysec",
    ]
    if cfg.redis_password:
        lines.append(f"requirepass {_redis_quote(cfg.redis_password)}")
        lines.append(f"masterauth {_redis_quote(cfg.redis_password)}")  # replicas of a group
    lines.extend(extra)
    return (
        "# generated by fleetcrawl services; rewritten on every start\n" + "\n".join(lines) + "\n"
    )


def _launch(cfg: ServicesConfig, layout: _Layout, argv: Sequence[str]) -> ServiceInfo:
    check_port_free(layout.name, cfg.host, layout.port)
    started = time.monotonic()
    with layout.log_file.open("ab") as log:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        log.write(f"--- {stamp} fleetcrawl services: starting {layout.executable}\n".encode())
        log.flush()
        offset = log.tell()
        # posix_spawn rather than Popen: the server outlives this process, and
        # a Popen object would warn "still running" when collected.
        try:
            pid = os.posix_spawn(
                argv[0],
                list(argv),
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, log.fileno(), 2),
                ],
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {layout.name}: {argv[0]}: {exc.strerror}") from exc
    layout.pid_file.write_text(f"{pid}\n")
    try:
        _wait_until_answering(cfg, layout, pid, offset)
    except ServiceError:
        terminate(layout.name, pid, cfg.stop_timeout)
        layout.pid_file.unlink(missing_ok=True)
        raise
    elapsed = time.monotonic() - started
    logger.info(
        "%s started: pid %d at %s in %.2fs", layout.name, pid, mask_url(layout.url), elapsed
    )
    return layout.info(pid)


def _running(cfg: ServicesConfig, layout: _Layout) -> ServiceInfo | None:
    pid = _live_pid(layout)
    if pid is None:
        return None
    try:
        _wait_until_answering(cfg, layout, pid, log_offset=0)
    except ServiceError as exc:
        raise ServiceError(
            f"{exc}\n(it was started earlier; stop it with `fleetcrawl services stop`)"
        ) from exc
    logger.info("%s already running: pid %d", layout.name, pid)
    return layout.info(pid)


def _make_dirs(layout: _Layout) -> None:
    try:
        layout.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        layout.data_dir.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ServiceError(
            f"cannot start {layout.name}: cannot create {layout.data_dir}: {exc}"
        ) from exc


def start_redis(
    cfg: ServicesConfig,
    *,
    directory: str | None = None,
    extra: Sequence[str] = (),
    sentinel: bool = False,
) -> ServiceInfo:
    """Start Redis (AOF on, loopback only) unless it already runs; wait until it answers PING.

    A member of a cluster or of a Sentinel group (``project.ops.topology``) has a
    *directory* of its own under the state folder and *extra* config lines; *sentinel*
    starts it as a sentinel (``redis-server --sentinel``, the binary of Debian's
    redis-sentinel package), which then owns and rewrites its config file.
    """

    layout = _layout(cfg, "redis", directory)
    running = _running(cfg, layout)
    if running is not None:
        return running
    executable = ensure_redis_server()
    _make_dirs(layout)
    config = layout.directory / ("sentinel.conf" if sentinel else "redis.conf")
    if sentinel and config.exists():
        # a sentinel's own rewrites (the master it found, its peers) are its state
        return _launch(cfg, layout, [str(executable), str(config), "--sentinel"])
    # The password goes into a 0600 file, never onto a command line.
    text = _redis_config(cfg, layout, extra)
    if sentinel:
        text = (
            "\n".join(
                line
                for line in text.splitlines()
                if not line.startswith(("appendonly", "appendfsync"))
            )
            + "\n"
        )
    write_private(config, text)
    argv = [str(executable), str(config)] + (["--sentinel"] if sentinel else [])
    return _launch(cfg, layout, argv)


def start_mongo(cfg: ServicesConfig) -> ServiceInfo:
    """Start FerretDB on SQLite (loopback only) unless it already runs; wait for a ping."""

    layout = _layout(cfg, "mongo")
    running = _running(cfg, layout)
    if running is not None:
        return running
    executable = ensure_ferretdb()
    _make_dirs(layout)
    argv = [
        str(executable),
        f"--listen-addr={netloc(cfg.host, cfg.mongo_port)}",
        "--handler=sqlite",
        # journal_size_limit: a WAL that SQLite restarted is truncated to 64 MiB (it kept
        # its largest size before: gigabytes after a big crawl); fleetcrawl_wal.go forces a
        # restart once one passes 1 GiB
        (
            f"--sqlite-url=file:{quote(str(layout.data_dir))}/?_pragma=synchronous(normal)"
            "&_pragma=journal_size_limit(67108864)"
        ),
        f"--state-dir={layout.directory}",
        "--telemetry=disable",
        "--log-level=error",  # at warn, every pymongo close() logs a 20-line endSessions dump
        "--debug-addr=-",  # no metrics HTTP listener: two instances would clash on 8088
    ]
    return _launch(cfg, layout, argv)


def running_pid(
    cfg: ServicesConfig, directory: str | None = None, *, name: str = "redis"
) -> int | None:
    """The pid of service *name* (a cluster's or Sentinel group's Redis in *directory*), if
    its pidfile names one."""
    return _read_pid(_layout(cfg, name, directory))


def stop_service(cfg: ServicesConfig, name: str, directory: str | None = None) -> bool:
    """Stop service *name* (SIGTERM, then SIGKILL); False if it was not running."""
    layout = _layout(cfg, name, directory)
    pid = _live_pid(layout)
    if pid is None:
        return False
    terminate(name, pid, cfg.stop_timeout)
    layout.pid_file.unlink(missing_ok=True)
    logger.info("%s stopped: pid %d", name, pid)
    return True


def status(cfg: ServicesConfig) -> dict[str, ServiceStatus]:
    """Report each local service without changing anything."""
    report: dict[str, ServiceStatus] = {}
    for name in SERVICE_NAMES:
        layout = _layout(cfg, name)
        pid = _read_pid(layout)
        state, detail = "running", ""
        if pid is None:
            state = "stopped"
        elif not is_service_process(pid, layout.executable):
            state, detail = (
                "stale pidfile",
                f"{layout.pid_file}: pid {pid} is not a running {layout.executable}",
            )
        else:
            try:
                _PROBES[name](cfg)
            except (_NotReadyError, ServiceError) as exc:
                state, detail = "not answering", str(exc)
        report[name] = ServiceStatus(
            name, state, pid, layout.url, layout.log_file, layout.data_dir, detail
        )
    return report
