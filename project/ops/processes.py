"""Servers the project starts itself: find them again by pid, stop them, read their logs.

Linux only: a pid is checked against ``/proc/<pid>/cmdline``, so a pidfile left by
a crash never names somebody else's process.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Final

__all__ = [
    "ServiceError",
    "check_port_free",
    "free_port",
    "is_service_process",
    "log_tail",
    "netloc",
    "pid_alive",
    "terminate",
    "write_private",
]

logger = logging.getLogger(__name__)

_LOG_TAIL_LINES: Final = 20


class ServiceError(RuntimeError):
    """A local service cannot be installed, started, reached or stopped."""


def netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: ask /proc
    else:
        return reaped == 0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def is_service_process(pid: int, executable: str) -> bool:
    if not pid_alive(pid):
        return False
    try:
        argv0 = (
            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        )
    except OSError:
        return False
    # redis-server rewrites its title to "<argv0> 127.0.0.1:6379".
    return executable in (Path(argv0).name, Path(argv0.split(" ", 1)[0]).name)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def terminate(name: str, pid: int, timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError as exc:
            raise ServiceError(f"cannot stop {name}: not allowed to signal pid {pid}") from exc
        if _wait_gone(pid, wait):
            return
        logger.warning("%s (pid %d) still runs %gs after %s", name, pid, wait, sig.name)
    raise ServiceError(f"cannot stop {name}: pid {pid} survived SIGKILL")


def log_tail(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    lines = text.rstrip().splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join(f"    {line}" for line in lines) if lines else "    (log is empty)"


def check_port_free(name: str, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                problem = f"port {port} on {host} is already in use by another process"
                raise ServiceError(f"cannot start {name}: {problem}") from exc
            raise ServiceError(
                f"cannot start {name}: cannot bind {host}:{port}: {exc.strerror}"
            ) from exc


def write_private(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
    partial.replace(path)
