"""Local forward HTTP proxies, each sending from its own loopback address.

``python -m tests.site.proxy_server --source 127.0.0.2 --source 127.0.0.3 [--auth user:secret]``
starts one proxy per source, each listening on 127.0.0.1 at a free port and connecting to the
site from its source address, so a site behind them (the test shop, tests.site.defense) sees
one client address per proxy. It prints ``LISTENING <source> http://127.0.0.1:<port>`` per
proxy, then serves until SIGTERM. With ``--auth``, a request without that Proxy-Authorization
(Basic) is answered 407. ``GET /_stats`` to a proxy itself (not a proxied URL) answers
``{"source": ..., "requests": n, "refused": n}``. Plain HTTP only (no CONNECT): the shop is
HTTP.

:class:`ProxyRig` runs them for a ``with`` block.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from tests.site.server import end_child

if TYPE_CHECKING:
    from types import TracebackType


__all__ = ["ProxyRig"]

_REPO_ROOT = Path(__file__).resolve().parents[2]


class ProxyRig:
    """Proxies from 127.0.0.2 on (*count* of them) in a subprocess, for a ``with`` block.

    ``urls`` are the proxies' URLs (with ``user:password@`` when *auth*), ``sources`` the
    address each sends from, in the same order.
    """

    def __init__(self, count: int, *, auth: str | None = None, first: int = 2) -> None:
        self.sources = [f"127.0.0.{first + n}" for n in range(count)]
        self._auth = auth
        self.urls: list[str] = []
        self._plain: list[str] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def start(self) -> Self:
        args = [sys.executable, "-m", "tests.site.proxy_server"]
        for source in self.sources:
            args += ["--source", source]
        if self._auth:
            args += ["--auth", self._auth]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._process = subprocess.Popen(
            args, cwd=_REPO_ROOT, env=os.environ, stdout=subprocess.PIPE, stderr=self._stderr
        )
        try:
            self._plain = self._read_urls(self._process)
        except BaseException:
            self.stop()
            raise
        credentials = f"{self._auth}@" if self._auth else ""
        self.urls = [url.replace("http://", f"http://{credentials}") for url in self._plain]
        return self

    def _read_urls(self, process: subprocess.Popen[bytes]) -> list[str]:
        assert process.stdout is not None
        urls: list[str] = []
        deadline = time.monotonic() + 20
        # the pipe's bytes as they come (os.read): a buffered readline would take every line
        # that arrived at once and leave select() waiting for the rest until the deadline
        fd, pending = process.stdout.fileno(), b""
        while len(urls) < len(self.sources) and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").split()
                if len(line) != 3 or line[0] != "LISTENING":
                    break
                urls.append(line[2])
        if len(urls) < len(self.sources):
            errors = b""
            if self._stderr is not None:
                self._stderr.seek(0)
                errors = self._stderr.read()[-2000:]
            raise RuntimeError(f"the proxies did not start: {errors.decode('utf-8', 'replace')}")
        return urls

    def stats(self) -> list[dict[str, Any]]:
        """Each proxy's ``/_stats``, in order."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        answers = []
        for url in self._plain:
            with opener.open(url + "/_stats", timeout=10) as response:
                answers.append(json.load(response))
        return answers

    def stop(self) -> None:
        process, self._process = self._process, None
        stderr, self._stderr = self._stderr, None
        end_child(process, stderr)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
