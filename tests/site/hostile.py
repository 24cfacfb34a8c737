"""The test shop's hostile pages (``--hostile``), and a canary listener for the tests.

The huge page is streamed a chunk at a time and the never-ending page waits on the reactor's
clock, so neither holds its size in memory nor keeps anything busy once its client is gone.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Self

from twisted.internet.interfaces import IPullProducer
from zope.interface import implementer

if TYPE_CHECKING:
    from types import TracebackType

    from twisted.internet.base import DelayedCall
    from twisted.internet.posixbase import PosixReactorBase
    from twisted.python.failure import Failure
    from twisted.web.server import Request

    from tests.site.stats import ShopStats

__all__ = ["Canary", "HugeBody", "stall"]

_CHUNK = 64 * 1024
_FILLER = b"<p class='filler'>" + b"0123456789" * 6 + b"</p>\n"


@implementer(IPullProducer)
class HugeBody:
    """Writes *head*, filler, then *tail*, *size* bytes in all, as fast as the client reads."""

    def __init__(
        self, request: Request, head: bytes, tail: bytes, size: int, stats: ShopStats
    ) -> None:
        self._request = request
        self._head = head
        self._tail = tail
        self._filler = max(0, size - len(head) - len(tail))
        self._stats = stats
        self._done = False

    def start(self) -> None:
        """Stream the page; the request finishes when it is all sent or the client went."""
        self._write(self._head)
        self._request.registerProducer(self, False)  # streaming=False: a pull producer
        self._request.notifyFinish().addErrback(lambda _: self.stopProducing())

    def resumeProducing(self) -> None:
        """The client took the last chunk: send the next one."""
        if self._done:
            return
        if self._filler > 0:
            size = min(_CHUNK, self._filler)
            self._filler -= size
            self._write((_FILLER * (size // len(_FILLER) + 1))[:size])
            return
        self._done = True
        self._write(self._tail)
        self._stats.hostile_completed["huge"] += 1
        self._request.unregisterProducer()
        self._request.finish()

    def stopProducing(self) -> None:
        """The client went away (it gave up on the size, or timed out)."""
        self._done = True

    def _write(self, data: bytes) -> None:
        self._request.write(data)
        self._stats.hostile_sent["huge"] += len(data)
        self._stats.body_bytes += len(data)


def stall(
    request: Request,
    head: bytes,
    tail: bytes,
    seconds: float,
    clock: PosixReactorBase,
    stats: ShopStats,
) -> None:
    """Send the headers and *head*, then nothing for *seconds*, then *tail*: at most that long,
    and nothing at all once the client is gone."""
    request.write(head)
    stats.hostile_sent["stall"] += len(head)
    stats.body_bytes += len(head)

    def complete() -> None:
        request.write(tail)
        stats.hostile_sent["stall"] += len(tail)
        stats.body_bytes += len(tail)
        stats.hostile_completed["stall"] += 1
        request.finish()

    call = clock.callLater(seconds, complete)
    request.notifyFinish().addErrback(_cancel, call)


def _cancel(failure: Failure, call: DelayedCall) -> None:
    # The client gave up on the page: nothing left to send.
    if call.active():
        call.cancel()


class Canary:
    """A TCP listener on a free loopback port that records every connection made to it.

    A crawl that links it must leave it untouched: ``connections == 0``. What a client sent
    (its first 4 KiB) is kept in ``received`` to tell what went wrong.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int = 0
        self.connections: int = 0
        self.received: list[bytes] = []
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> Self:
        """Listen on a free port and record connections in a background thread."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.host, 0))
        listener.listen(16)
        listener.settimeout(0.1)
        self._socket = listener
        self.port = listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="canary", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._socket is not None
        while not self._stopping.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with connection:
                connection.settimeout(1.0)
                with contextlib.suppress(OSError):
                    self.received.append(connection.recv(4096))

    def stop(self) -> None:
        """Stop listening."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
