"""The run webhook against receivers that misbehave: real sockets on 127.0.0.1, no mock."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from project.runs.webhook import TRIES, deliver, mask_webhook

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_FAST = (0.05, 0.05)  # backoff between tries: the tests need not wait it out


class _Receiver:
    """A TCP server on 127.0.0.1 whose every connection *handle* answers as it likes."""

    def __init__(self, handle: Callable[[socket.socket, bytes], None]) -> None:
        self.handle = handle
        self.requests: list[bytes] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                self.requests.append(head)
                self.handle(conn, head)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@contextmanager
def receiver(handle: Callable[[socket.socket, bytes], None]) -> Iterator[_Receiver]:
    server = _Receiver(handle)
    try:
        yield server
    finally:
        server.close()


def _answer(status: str) -> Callable[[socket.socket, bytes], None]:
    def handle(conn: socket.socket, head: bytes) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )

    return handle


def _post(url: str, **options: Any) -> Any:
    return asyncio.run(deliver(url, b'{"alerts": ["x"]}', backoff=_FAST, **options))


def test_a_2xx_is_delivered_with_the_urls_credentials_as_basic_auth() -> None:
    with receiver(_answer("204 No Content")) as hook:
        outcome = _post(f"http://user:secret@127.0.0.1:{hook.port}/hook?token=abc")
    assert outcome.delivered
    assert outcome.tries == 1
    assert outcome.status == 204
    (head,) = hook.requests
    assert head.startswith(b"POST /hook?token=abc HTTP/1.1\r\n")
    assert b"Authorization: Basic dXNlcjpzZWNyZXQ=" in head  # user:secret
    assert outcome.url == f"http://127.0.0.1:{hook.port}/***"


def test_a_receiver_that_trickles_its_answer_costs_the_deadline_per_try() -> None:
    def trickle(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(60):  # a header byte every half second: each read succeeds, for ever
            time.sleep(0.5)
            conn.sendall(b"X")

    with receiver(trickle) as hook:
        began = time.monotonic()
        outcome = _post(f"http://127.0.0.1:{hook.port}/hook", timeout=1.0)
        took = time.monotonic() - began
    assert not outcome.delivered
    assert outcome.tries == TRIES == 3
    assert "no whole answer within 1s" in outcome.error
    # three tries of 1 s and two short pauses, where the per-read timeout alone waits 30 s a try
    assert took < 3 * 1.0 + 3.0, took


def test_an_endless_answer_is_read_up_to_the_cap() -> None:
    sent = []

    def endless(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        total = 0
        try:
            while total < 1_000_000_000:
                conn.sendall(b"x" * 65536)
                total += 65536
        except OSError:
            sent.append(total)

    with receiver(endless) as hook:
        outcome = _post(f"http://127.0.0.1:{hook.port}/hook", timeout=5.0)
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.05)
    assert outcome.delivered
    assert outcome.status == 200
    assert sent, "the receiver never saw the node hang up"
    assert sent[0] < 50_000_000, sent  # the node hung up; socket buffers took the rest


@pytest.mark.parametrize(
    "reply",
    [b"HELLO\r\n\r\n", b"HTTP/1.1 2x0 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000, b""],
    ids=["no-status-line", "bad-status", "header-too-long", "hang-up"],
)
def test_garbage_answers_are_outcomes_not_exceptions(reply: bytes) -> None:
    def garbage(conn: socket.socket, head: bytes) -> None:
        conn.sendall(reply)

    with receiver(garbage) as hook:
        outcome = _post(f"http://127.0.0.1:{hook.port}/hook", timeout=2.0)
    assert not outcome.delivered
    assert outcome.tries == 3
    assert len(hook.requests) == 3
    assert outcome.error


def test_failed_tries_are_retried_and_the_third_can_deliver() -> None:
    answers = iter(["500 Internal Server Error", "302 Found", "200 OK"])

    def flaky(conn: socket.socket, head: bytes) -> None:
        _answer(next(answers))(conn, head)

    with receiver(flaky) as hook:
        outcome = _post(f"http://127.0.0.1:{hook.port}/hook")
    assert outcome.delivered
    assert outcome.tries == 3
    assert outcome.status == 200
    assert len(hook.requests) == 3  # the 302 was not followed


def test_a_refused_connection_is_tried_three_times_and_logged_masked(caplog) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with caplog.at_level(logging.WARNING, logger="project.runs.webhook"):
        outcome = _post(f"http://u:pw@127.0.0.1:{port}/services/T0/B0/SECRETTOKEN")
    assert not outcome.delivered
    assert outcome.tries == 3
    assert "ConnectionRefusedError" in outcome.error
    assert len(caplog.records) == 3
    assert "SECRETTOKEN" not in caplog.text
    assert "pw" not in caplog.text
    assert f"http://127.0.0.1:{port}/***" in caplog.text


def test_the_environments_proxy_is_not_used_but_a_configured_one_is(monkeypatch) -> None:
    with receiver(_answer("204 No Content")) as hook, receiver(_answer("204 No Content")) as proxy:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        direct = _post(f"http://127.0.0.1:{hook.port}/hook")
        assert direct.delivered
        assert len(hook.requests) == 1
        assert proxy.requests == []
        through = _post(f"http://127.0.0.1:{hook.port}/hook", proxy=f"127.0.0.1:{proxy.port}")
    assert through.delivered
    assert len(hook.requests) == 1
    (head,) = proxy.requests
    assert head.startswith(f"POST http://127.0.0.1:{hook.port}/hook HTTP/1.1\r\n".encode())


def test_a_url_that_cannot_be_posted_to_is_one_try() -> None:
    outcome = _post("ftp://example.invalid/hook")
    assert not outcome.delivered
    assert outcome.tries == 1
    assert "not an http(s) URL" in outcome.error


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.example/services/T0/B0/XXX", "https://hooks.example/***"),
        ("https://u:p@hooks.example:8443/?token=1", "https://hooks.example:8443/***"),
        ("http://127.0.0.1:9/", "http://127.0.0.1:9/"),
        ("http://[::1]:9/a#b", "http://[::1]:9/***"),
        ("http://host:notaport/x", "<unparsable webhook URL>"),
    ],
)
def test_the_webhook_is_logged_without_credentials_path_or_query(url: str, shown: str) -> None:
    assert mask_webhook(url) == shown
