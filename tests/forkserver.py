"""A warm interpreter that forks the suite's processes: ``scrapy crawl`` nodes, test shops and
the ``fleetcrawl`` command start without paying for their imports again.

A process of the suite costs about a second of CPU before it does anything, most of it
importing Scrapy, Twisted, redis-py, pymongo and the rest; the suite starts hundreds of them on
a 2-core machine. The server (``python -m tests.forkserver SOCKET``) imports those libraries
once, starts no thread, and forks a child for each request, which then becomes what
``python -m MODULE ARGS`` would have been: the given working directory, environment,
``sys.path`` (the directory, ``PYTHONPATH``, then the interpreter's own), ``sys.argv``, and
standard streams (file descriptors passed over the socket). The project's own modules are
never imported by the server (they read the environment when imported): each child imports
them itself, as a real process does. The child is a real process of its own, with its own
pid, signals and exit status; only its hash seed is the server's.

:func:`spawn` is the client side: a :class:`Forked` has the part of ``subprocess.Popen``
the suite uses (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``terminate``,
``returncode``, ``stdout`` for a pipe). It goes through the server that :func:`serve`
started, or runs ``subprocess.Popen`` when there is none (benchmarks, the demo, wrappers
such as ``faketime``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["Forked", "active", "serve", "spawn"]

ROOT = Path(__file__).resolve().parent.parent

#: What the server imports before it forks: what every node, shop or command would import.
_WARM = (
    "asyncio",
    "twisted.internet.asyncioreactor",
    "twisted.internet.defer",
    "twisted.web.server",
    "twisted.web.resource",
    "scrapy",
    "scrapy.cmdline",
    "scrapy.crawler",
    "scrapy.commands.crawl",
    "scrapy.core.engine",
    "scrapy.core.scheduler",
    "scrapy.core.downloader.handlers.http11",
    "scrapy.core.downloader.contextfactory",
    "scrapy.downloadermiddlewares.retry",
    "scrapy.downloadermiddlewares.robotstxt",
    "scrapy.extensions.telnet",
    "scrapy.linkextractors",
    "scrapy.spiders",
    "scrapy.utils.test",
    "scrapy_redis.scheduler",
    "scrapy_redis.spiders",
    "scrapy_redis.dupefilter",
    "redis",
    "redis.asyncio",
    "pymongo",
    "pymongo.asynchronous.mongo_client",
    "itemadapter",
    "pydantic",
    "price_parser",
    "extruct",
    "tldextract",
    "protego",
    "w3lib.url",
    "parsel",
    "rich.console",
    "requests",
    "unittest",
)


class Forked:
    """A process the fork server started: the part of ``subprocess.Popen`` the suite uses."""

    def __init__(self, pid: int, status: socket.socket, args: list[str], early: bytes) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._status = status
        self._early = early  # the exit status, if it came with the pid (a child that ended)

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._early:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return None
        reply = self._early
        while chunk := self._status.recv(64):
            reply += chunk
        self._status.close()
        # no reply: the server went away, and its children with it (_die_with_server)
        self.returncode = int(reply) if reply else -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # the server reaps at once: a pid whose exit is known may be another process's now
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._status.close()


class _Server:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = path.with_suffix(".log")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", str(path)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start ({self.process.poll()})")
            time.sleep(0.02)

    def spawn(
        self, module: str, args: Sequence[str], cwd: Path, env: Mapping[str, str], fds: list[int]
    ) -> tuple[int, socket.socket, bytes]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.path))
        request = {"module": module, "args": list(args), "cwd": str(cwd), "env": dict(env)}
        data = json.dumps(request).encode() + b"\n"
        socket.send_fds(conn, [data], fds)
        reply = b""
        while b"\n" not in reply:
            chunk = conn.recv(32)
            if not chunk:
                conn.close()
                raise RuntimeError(f"the fork server did not start {module} (see {self.log})")
            reply += chunk
        pid, _, early = reply.partition(b"\n")
        return int(pid), conn, early

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_active: _Server | None = None


def active() -> bool:
    """Whether processes are forked (a server runs in this process's session)."""
    return _active is not None


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[None]:
    """Fork this session's processes from a warm server while the block runs."""
    global _active  # one server per test session
    server = _Server(directory / "forkserver.sock")
    _active = server
    try:
        yield
    finally:
        _active = None
        server.stop()


def _fd(stream: Any, default: int) -> tuple[int, IO[bytes] | None]:
    """The descriptor a child gets for *stream* (a file, a descriptor, PIPE, DEVNULL, None),
    and the parent's end of a pipe."""
    if stream is None:
        return default, None
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    if stream == subprocess.PIPE:
        read, write = os.pipe()
        return write, os.fdopen(read, "rb")
    if isinstance(stream, int):
        return stream, None
    return stream.fileno(), None


def spawn(
    module: str,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: Any = subprocess.DEVNULL,
    stdout: Any = None,
    stderr: Any = None,
    wrapper: Sequence[str] = (),
) -> Forked | subprocess.Popen[bytes]:
    """``python -m MODULE ARGS``: forked by the session's server, else ``subprocess.Popen``
    (always so under a *wrapper* command such as ``faketime`` or ``prlimit``)."""
    server = _active
    if server is None or wrapper:
        return subprocess.Popen(
            [*wrapper, sys.executable, "-m", module, *args],
            cwd=cwd,
            env=dict(env),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
    opened = [_fd(stdin, 0), _fd(stdout, 1)]
    opened.append(opened[1] if stderr == subprocess.STDOUT else _fd(stderr, 2))
    fds = [fd for fd, _ in opened]
    try:
        pid, status, early = server.spawn(module, args, cwd, env, fds)
    except BaseException:
        for _, pipe in opened:
            if pipe is not None:
                pipe.close()
        raise
    finally:
        for (fd, _), stream in zip(opened, (stdin, stdout, stderr), strict=True):
            if stream in (subprocess.DEVNULL, subprocess.PIPE):
                os.close(fd)  # the child's end, or /dev/null: the child has its own copy
    proc = Forked(pid, status, [sys.executable, "-m", module, *args], early)
    proc.stdout = opened[1][1]
    proc.stderr = None if stderr == subprocess.STDOUT else opened[2][1]
    return proc


# -- the server --------------------------------------------------------------------------


_SIGNALS = {signal.SIGCHLD, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def _die_with_server() -> None:
    """A child the server leaves behind (it was killed) is killed with it (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(request: dict[str, Any], fds: list[int], closing: list[int], server: int) -> None:
    """In the forked child: become ``python -m module args``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        _die_with_server()
        if os.getppid() != server:
            os._exit(1)  # the server died before prctl: nobody would reap this child
        for fd in closing:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        env = request["env"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *_BASE_PATH]
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        sys.argv = [request["module"], *request["args"]]
        importlib.invalidate_caches()
        for name in ("stdout", "stderr"):
            # line-buffered text on the descriptor it was given (a fresh interpreter buffers
            # a file by blocks unless PYTHONUNBUFFERED: a killed child's log is more complete)
            stream = open(  # noqa: SIM115 (the child's own standard stream)
                1 if name == "stdout" else 2,
                "w",
                buffering=1,
                closefd=False,
                errors="backslashreplace",
            )
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        code = _run(request["module"])
    except BaseException:  # noqa: BLE001 (the set-up failed: say why, exit 1)
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        os._exit(code)


def _run(module: str) -> int:
    """Run *module* as ``__main__`` and end as the interpreter would; the exit status."""
    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:  # noqa: BLE001 (as the interpreter does: print, exit 1)
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


_BASE_PATH: list[str] = []
_CPU_LOG = os.environ.get("FORKSERVER_CPU_LOG")


def _serve(path: Path) -> None:
    for name in _WARM:
        with contextlib.suppress(ImportError):
            __import__(name)
    # the interpreter's own entries: those a child keeps after its directory and PYTHONPATH
    ours = {str(ROOT), str(Path.cwd()), ""}
    _BASE_PATH[:] = [p for p in sys.path if p not in ours]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path) + ".tmp")
    listener.listen(64)
    Path(str(path) + ".tmp").replace(path)  # clients wait for the socket to appear
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    children: dict[int, tuple[socket.socket, str]] = {}
    owner = os.getppid()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        while not stopping and os.getppid() == owner:  # its test process died: so does it
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([listener, wake_read], [], [], 1.0)
            if wake_read in ready:
                with contextlib.suppress(BlockingIOError):
                    wake_read.recv(4096)
            _reap(children)
            if listener in ready:
                conn, _ = listener.accept()
                closing = [listener.fileno(), wake_read.fileno(), wake_write.fileno()]
                try:
                    _start(conn, children, closing)
                except Exception:  # noqa: BLE001 (one request that fails costs only itself)
                    traceback.print_exc()
                    conn.close()
    finally:
        for pid in children:  # the session ends: nothing it started outlives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while children and time.monotonic() < deadline:
            _reap(children)
            time.sleep(0.01)
        path.unlink(missing_ok=True)


def _start(
    conn: socket.socket, children: dict[int, tuple[socket.socket, str]], closing: list[int]
) -> None:
    """Read one request from *conn*, fork its child, reply with its pid."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    try:
        while not message.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                raise ValueError("the request was cut short")
            message += more
        request = json.loads(message)
        closing = [*closing, conn.fileno(), *(c.fileno() for c, _ in children.values())]
        server = os.getpid()
        # a signal between fork and the child's own handlers would run the server's
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                _child(request, fds, closing, server)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    finally:
        for fd in fds:
            os.close(fd)
    children[pid] = (conn, f"{request['env'].get('PYTEST_CURRENT_TEST', '')} {request['module']}")
    conn.sendall(b"%d\n" % pid)


def _reap(children: dict[int, tuple[socket.socket, str]]) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn, what = children.pop(pid, (None, ""))
        if _CPU_LOG:
            # FORKSERVER_CPU_LOG: the CPU each process used, for finding where the suite's goes
            with open(_CPU_LOG, "a") as log:
                log.write(f"{usage.ru_utime + usage.ru_stime:.3f} {what}\n")
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(b"%d" % os.waitstatus_to_exitcode(status))
            conn.close()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
