"""The worker's HTTP server: stdlib ``ThreadingHTTPServer``, one thread per connection.

No web framework: the API is a routing table (:data:`eosink.worker.control.rest.routes.ROUTES`) over ZooKeeper
calls, and the stdlib server keeps the worker image and its dependency set small. The handler
reads the body (Content-Length or chunked, at most :data:`MAX_BODY`), routes, authenticates,
maps every failure to Kafka Connect's ``{"error_code", "message"}`` - ZooKeeper being away is a
503, anything unexpected a logged 500 - and redacts registered secrets from every response
(``/metrics`` text included).

With a TLS context (:func:`eosink.worker.control.rest.tls.server_context`) the listening socket is
wrapped, and each connection's handshake runs in that connection's own thread: done in the accept
loop, one client that connects and says nothing would stall every other request.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from eosink.connectors.api.errors import EosinkError, RetryableError
from eosink.worker.control.rest.api import ConnectApi, WorkerView
from eosink.worker.control.rest.auth import OPEN_PATHS, RestAuth
from eosink.worker.control.rest.messages import ApiError, Request, Response
from eosink.worker.control.rest.routes import ROUTES
from eosink.worker.logging import get_logger, redact

log = get_logger("eosink.worker.control.rest")
MAX_BODY = 1024 * 1024

_PATTERNS = [(m, tuple(p.strip("/").split("/")) if p != "/" else (), h) for m, p, h in ROUTES]


def route(method: str, segments: tuple[str, ...]) -> tuple[Any, dict[str, str], list[str]]:
    """(handler or None, path params, methods allowed on this path: every one, when there is no handler)."""
    allowed: list[str] = []
    for m, pattern, handler in _PATTERNS:
        if len(pattern) != len(segments):
            continue
        params: dict[str, str] = {}
        for p, s in zip(pattern, segments):
            if p.startswith("{"):
                params[p[1:-1]] = s
            elif p != s:
                break
        else:
            allowed.append(m)
            if m == method or (method == "HEAD" and m == "GET"):
                return handler, params, allowed
    if "GET" in allowed:
        allowed.append("HEAD")
    return None, {}, allowed


def _require_zookeeper(api: Any, path: str) -> None:
    """A 503 at once for a connector route while the worker's ZooKeeper connection is suspended: every
    such route reads ZooKeeper, and kazoo would hold the request until the connection is back."""
    session = getattr(getattr(api, "worker", None), "session", None)
    if path.startswith("/connectors") and session is not None and not session.can_decide():
        raise ApiError(503, f"ZooKeeper is not available: this worker is not connected to {session.hosts} "
                            "(connectors and their status live there); try again once it reconnects, or ask another worker")


def _zk_unavailable(exc: BaseException) -> bool:
    from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError
    from kazoo.handlers.threading import KazooTimeoutError

    return isinstance(exc, (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError, RetryableError))


class _Handler(BaseHTTPRequestHandler):
    server_version = "eosink"
    protocol_version = "HTTP/1.1"
    timeout = 60
    api: ConnectApi
    auth: RestAuth | None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # every method is routed: unknown ones get a 405, not http.server's 501
            return self._handle
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # our own structured access log below

    def setup(self) -> None:
        super().setup()  # applies ``timeout`` to the socket: a stalled handshake gives up too
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    raise ApiError(400, "malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                if len(out) + size > MAX_BODY:
                    self.close_connection = True
                    raise ApiError(413, f"request body over {MAX_BODY} bytes")
                out += self.rfile.read(size)
                self.rfile.readline(1024)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length") from None
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length")
        if length > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"request body over {MAX_BODY} bytes")
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        started = time.monotonic()
        method = self.command.upper()
        split = urlsplit(self.path)
        path = split.path or "/"
        segments = tuple(unquote(s) for s in path.strip("/").split("/")) if path.strip("/") else ()
        try:
            body = self._body()
            handler, params, allowed = route(method, segments)
            if handler is None:
                if allowed:  # RFC 9110: a 405 lists the path's methods in Allow (Connect's Jersey sends none)
                    raise ApiError(405, f"HTTP method {method} is not supported for {path}; allowed: {', '.join(allowed)}",
                                   {"Allow": ", ".join(allowed)})
                raise ApiError(404, f"no such resource: {path}")
            norm = "/" + "/".join(segments)
            if self.auth is not None and norm not in OPEN_PATHS and not self.auth.allows(self.headers.get("Authorization")):
                self._send(Response(401, {"error_code": 401, "message": "authentication required"},
                                    {"WWW-Authenticate": self.auth.challenge()}))
                return
            req = Request(method, norm, params, parse_qs(split.query, keep_blank_values=True), body)
            _require_zookeeper(self.api, norm)
            response = handler(self.api, req)
        except ApiError as exc:
            response = Response(exc.status, {"error_code": exc.status, "message": exc.message}, exc.headers)
        except Exception as exc:  # noqa: BLE001 - every failure is an error response, never a dropped connection
            if _zk_unavailable(exc):
                response = Response(503, {"error_code": 503, "message": f"ZooKeeper is not available: {exc}"})
            elif isinstance(exc, EosinkError):
                response = Response(500, {"error_code": 500, "message": str(exc)})
                log.error("rest_failed", method=method, path=path, error=str(exc), error_class=type(exc).__name__)
            else:
                response = Response(500, {"error_code": 500, "message": f"internal error: {type(exc).__name__}: {exc}"})
                log.exception("rest_failed", method=method, path=path)
        self._send(response, head=method == "HEAD")
        level = log.debug if method in ("GET", "HEAD") and response.status < 500 else log.info
        level("rest_request", method=method, path=path, status=response.status, ms=round((time.monotonic() - started) * 1000, 1))

    def _send(self, r: Response, head: bool = False) -> None:
        if r.raw is not None:
            data = r.raw
            if r.content_type.startswith("text/"):
                data = redact(data.decode(errors="replace")).encode()
        elif r.body is None:
            data = b""
        else:
            data = json.dumps(redact(r.body), separators=(",", ":")).encode()
        self.send_response(r.status)
        if data or r.status not in (202, 204):
            self.send_header("Content-Type", r.content_type)
        for k, v in r.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0" if r.status == 204 else str(len(data)))
        self.end_headers()
        if data and not head and r.status != 204:
            self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    """A failed connection (a TLS handshake refused, a client gone) is a debug line, not socketserver's traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ssl.SSLError, ConnectionError, socket.timeout, TimeoutError)):
            log.debug("rest_connection_failed", client=client_address[0], error=str(exc), error_class=type(exc).__name__)
        else:
            log.warning("rest_connection_failed", client=client_address[0], error=str(exc), error_class=type(exc).__name__)


class RestServer:
    """Started by the worker once its ZooKeeper session is up; stopped at shutdown."""

    def __init__(self, worker: WorkerView, host: str, port: int, auth: RestAuth | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        handler = type("Handler", (_Handler,), {"api": ConnectApi(worker), "auth": auth})
        try:
            self.httpd = _Server((host, port), handler)
        except OSError as exc:
            raise EosinkError(f"cannot serve the REST API on {host}:{port}: {exc.strerror}", component="rest") from None
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.scheme = "https" if tls is not None else "http"
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> RestServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="rest",
                                        daemon=True)
        self._thread.start()
        log.info("rest_listening", host=self.httpd.server_address[0], port=self.port, scheme=self.scheme)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
