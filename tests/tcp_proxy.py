"""A TCP proxy in front of a test server (Redis, MongoDB) that loses or slows replies.

A node pointed at it (``REDIS_URL`` or ``MONGO_URI`` of the proxy) talks to the real server
through it. After :meth:`TcpProxy.drop_next`, the next chunk the server sends that matches the
pattern never reaches the node: the proxy closes that client's connection instead, after the
server ran the command. The node sees a connection error for a command that did run, the case
a re-sent Lua step must survive (project/frontier/lua/step.lua, ``seq``). With ``delay``, each
chunk the server sends waits that long first: a server slower than the crawl.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from typing import Self

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to *target*; drops matching replies when armed, and holds
    each reply *delay* seconds."""

    def __init__(self, target: tuple[str, int], delay: float = 0.0) -> None:
        self._target = target
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pattern: re.Pattern[bytes] | None = None
        self._sockets: list[socket.socket] = []
        self._closing = False
        #: Replies dropped so far.
        self.dropped = 0

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def drop_next(self, pattern: bytes) -> None:
        """Lose the next server chunk matching the regex *pattern* (and that connection)."""
        with self._lock:
            self._pattern = re.compile(pattern, re.DOTALL)

    def start(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if replies and self._take(chunk):
                    break  # the reply is lost with its connection
                if replies and self.delay:
                    time.sleep(self.delay)
                dst.sendall(chunk)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _take(self, chunk: bytes) -> bool:
        with self._lock:
            if self._pattern is None or not self._pattern.search(chunk):
                return False
            self._pattern = None
            self.dropped += 1
            return True
