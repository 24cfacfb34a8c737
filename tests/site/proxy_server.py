"""The forward proxies of tests/site/proxies.py, served: ``python -m tests.site.proxy_server
--source 127.0.0.2 [--source ...] [--auth user:password]`` (Twisted's proxy, each connecting
out from its source address). Run through :class:`tests.site.proxies.ProxyRig`."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import TYPE_CHECKING, cast

from twisted.web.http import HTTPFactory
from twisted.web.proxy import Proxy, ProxyRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from twisted.internet.posixbase import PosixReactorBase


class _Counts:
    def __init__(self, source: str) -> None:
        self.source = source
        self.requests = 0
        self.refused = 0


def _request_class(
    source: str, counts: _Counts, auth: bytes | None, reactor: PosixReactorBase
) -> type[ProxyRequest]:
    class SourcedRequest(ProxyRequest):
        def process(self) -> None:
            if not self.uri.startswith(b"http://"):
                self._own()
                return
            given = self.getHeader(b"proxy-authorization")
            if auth is not None and given != auth:
                counts.refused += 1
                self.setResponseCode(407)
                self.setHeader(b"proxy-authenticate", b'Basic realm="rig"')
                self.finish()
                return
            counts.requests += 1
            self.requestHeaders.removeHeader(b"proxy-authorization")
            host_port = self.uri[len(b"http://") :].split(b"/", 1)[0].decode("ascii")
            host, _, port = host_port.partition(":")
            rest = self.uri[len(b"http://") + len(host_port) :] or b"/"
            headers = self.getAllHeaders().copy()
            headers.setdefault(b"host", host_port.encode("ascii"))
            self.content.seek(0, 0)
            body = self.content.read()
            factory = self.protocols[b"http"](
                self.method, rest, self.clientproto, headers, body, self
            )
            reactor.connectTCP(host, int(port or 80), factory, bindAddress=(source, 0))

        def _own(self) -> None:
            if self.uri.split(b"?")[0] == b"/_stats":
                self.setHeader(b"content-type", b"application/json")
                self.write(
                    json.dumps(
                        {"source": source, "requests": counts.requests, "refused": counts.refused}
                    ).encode()
                )
            else:
                self.setResponseCode(400)
            self.finish()

    return SourcedRequest


class _QuietFactory(HTTPFactory):
    """No access log."""

    def log(self, request: object) -> None:
        pass


def _serve(sources: Sequence[str], auth: str | None) -> None:
    from twisted.internet import reactor as installed

    reactor = cast("PosixReactorBase", installed)
    header = b"Basic " + base64.b64encode(auth.encode()) if auth else None
    for source in sources:
        request_class = _request_class(source, _Counts(source), header, reactor)

        class SourcedProxy(Proxy):
            requestFactory = request_class

        factory = _QuietFactory()
        factory.protocol = SourcedProxy
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        sys.stdout.write(f"LISTENING {source} http://127.0.0.1:{port.getHost().port}\n")
    sys.stdout.flush()
    reactor.run()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve the proxies."""
    parser = argparse.ArgumentParser(prog="python -m tests.site.proxies", description=__doc__)
    parser.add_argument("--source", action="append", required=True, help="a loopback address")
    parser.add_argument("--auth", help="user:password every request must send (Basic)")
    args = parser.parse_args(argv)
    _serve(args.source, args.auth)


if __name__ == "__main__":
    main()
