"""The run webhook: a finished run's alerts POSTed as JSON, bounded and never fatal.

A receiver is somebody else's server. Whatever it does costs the node at most
``RUNS_WEBHOOK_TIMEOUT`` per try, three tries: one deadline for the whole exchange of a try
(connecting, sending, the answer's headers and body; a watchdog shuts the socket when it passes,
so a receiver that trickles a byte every few seconds cannot hold the node), an answer read up
to ``_READ_CAP`` bytes, no redirects (the credentials of the URL must not follow a 3xx), no
proxy but ``RUNS_WEBHOOK_PROXY`` (the environment's ``http_proxy`` is not the operator's choice
for a URL that carries a token). Every error becomes the try's outcome; only a 2xx delivers.
Logs show the webhook as ``scheme://host[:port]/***``: its path and query often are the token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["WebhookOutcome", "deliver", "mask_webhook"]

logger = logging.getLogger(__name__)

#: Tries of one delivery, and the pause before each try after the first.
TRIES = 3
_BACKOFF = (1.0, 3.0)
#: Bytes of a receiver's answer read; the rest is never read.
_READ_CAP = 64 * 1024


@dataclass
class WebhookOutcome:
    """What became of a delivery: stored in the run's report as ``webhook``."""

    url: str  # masked
    delivered: bool = False
    tries: int = 0
    status: int | None = None  # the last answer's HTTP status
    error: str | None = None  # the last try's failure
    seconds: float = 0.0

    def as_document(self) -> dict[str, Any]:
        return asdict(self)


def mask_webhook(url: str) -> str:
    """``scheme://host[:port]/***``: no credentials, path or query (they are often the token)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparsable webhook URL>"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    hidden = "/***" if (parts.path not in ("", "/") or parts.query or parts.fragment) else "/"
    return f"{parts.scheme}://{netloc}{hidden}"


class _Failed(Exception):
    """A try that got an answer, not a 2xx."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status


def _connection(
    url: str, proxy: str, timeout: float
) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The connection a try uses, the request target and the headers the URL implies."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {parts.scheme!r}")
    host, port = parts.hostname or "", parts.port
    if not host:
        raise ValueError("no host in the webhook URL")
    headers = {"Content-Type": "application/json"}
    if parts.username is not None or parts.password is not None:
        pair = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    https = parts.scheme == "https"
    if not proxy:
        if https:
            context = ssl.create_default_context()
            return (
                http.client.HTTPSConnection(host, port, timeout=timeout, context=context),
                path,
                headers,
            )
        return http.client.HTTPConnection(host, port, timeout=timeout), path, headers
    through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not through.hostname:
        raise ValueError("no host in RUNS_WEBHOOK_PROXY")
    if https:  # a tunnel: the proxy sees neither the path nor the credentials
        connection = http.client.HTTPSConnection(
            through.hostname, through.port or 8080, timeout=timeout,
            context=ssl.create_default_context(),
        )  # fmt: skip
        connection.set_tunnel(host, port)
        return connection, path, headers
    target = urllib.parse.urlunsplit(
        ("http", f"{host}:{port}" if port else host, parts.path or "/", parts.query, "")
    )
    return (
        http.client.HTTPConnection(through.hostname, through.port or 8080, timeout=timeout),
        target,
        headers,
    )


def _shut(connection: http.client.HTTPConnection) -> None:
    """The watchdog's: end a try past its deadline, whatever it is blocked on."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _try(url: str, body: bytes, proxy: str, timeout: float) -> int:
    """One POST within *timeout* seconds overall; its 2xx status, or raise."""
    connection, target, headers = _connection(url, proxy, timeout)
    watchdog = threading.Timer(timeout, _shut, (connection,))
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        connection.request("POST", target, body=body, headers=headers)
        answer = connection.getresponse()
        answer.read(_READ_CAP)
        if time.monotonic() - started >= timeout:
            raise TimeoutError(f"no whole answer within {timeout:g}s")
        if not 200 <= answer.status < 300:
            raise _Failed(answer.status, answer.reason)
        return answer.status
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() - started >= timeout:
            raise TimeoutError(f"no whole answer within {timeout:g}s") from exc
        raise
    finally:
        watchdog.cancel()
        connection.close()


async def deliver(
    url: str,
    body: bytes,
    *,
    proxy: str = "",
    timeout: float = 10.0,
    backoff: tuple[float, ...] = _BACKOFF,
) -> WebhookOutcome:
    """POST *body* to *url*: up to TRIES tries, each within *timeout*; never raises."""
    outcome = WebhookOutcome(url=mask_webhook(url))
    began = time.monotonic()
    for attempt in range(TRIES):
        if attempt:
            await asyncio.sleep(backoff[min(attempt - 1, len(backoff) - 1)])
        outcome.tries = attempt + 1
        try:
            outcome.status = await asyncio.to_thread(_try, url, body, proxy, timeout)
        except _Failed as exc:
            outcome.status, outcome.error = exc.status, str(exc)
        except ValueError as exc:  # the URL itself: no try can do better
            outcome.error = f"{type(exc).__name__}: {exc}"
            break
        except Exception as exc:  # noqa: BLE001 (a stranger's server: any failure is an outcome)
            outcome.status, outcome.error = (
                None,
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            )
        else:
            outcome.delivered, outcome.error = True, None
            break
        logger.warning(
            "Webhook %s, try %d of %d: %s", outcome.url, outcome.tries, TRIES, outcome.error
        )
    outcome.seconds = round(time.monotonic() - began, 2)
    return outcome
