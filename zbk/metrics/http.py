"""The small HTTP server every zbk process runs: /metrics, /heartbeat and /api/v1/...

Handlers are plain functions registered by method and path: ``route`` for those that take
no query parameters, ``route_query`` for those that name theirs (a parameter a route does
not name, a repeated one, or a malformed query string is a 400). A path no route has is a
404; a method a path does not have (DELETE, PATCH, HEAD, OPTIONS included) a 405 with an
``Allow`` header. Reads (GET) are open: metrics and state. Mutating endpoints (PUT/POST:
read-only mode, GC, recovery delay...) are guarded:

* The server binds loopback unless told otherwise (``http_bind_address``).
* With ``admin_token`` set, a mutating request needs ``Authorization: Bearer <token>``
  (compared in constant time), wherever the server is bound.
* Bound beyond loopback without a token, mutating requests are refused (403): an admin API
  reachable from the network is never open to it.
* On loopback without a token, a mutating request that carries an ``Origin`` header (only
  browsers send one) is refused, so a web page cannot drive the API by cross-site request.

Every request must arrive within ``request_timeout_s`` (a slow client cannot hold a
thread), bodies are JSON of at most ``limits.http_body_bytes_max``, and a handler that fails answers
with the error rather than dropping the connection: a typed error (zbk/errors.py) with its
``http_status`` and ``code``, anything else with 500. At most ``threads_max`` connections
are served at once, each on a thread of its own; one more is answered 503 at once by the
accepting thread, so a flood of connections costs neither unbounded threads nor a queue.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from zbk import limits
from zbk.errors import ConfigError, ZbkError

log = logging.getLogger(__name__)
Handler = Callable[[dict[str, Any] | None], Any]
Query = dict[str, str]
QueryHandler = Callable[[dict[str, Any] | None, Query], Any]
_Route = Callable[[dict[str, Any] | None, str], Any]  # (body, raw query string)
METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS")


def is_loopback_host(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name, "", "0.0.0.0" (every interface) and "::" are not loopback


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_query(raw: str, allowed: tuple[str, ...]) -> Query:
    """The parameters of a query string, each at most once and each among ``allowed``."""
    if not raw:
        return {}
    try:
        parsed = parse_qs(raw, keep_blank_values=True, strict_parsing=True, errors="strict",
                          max_num_fields=len(allowed) + 16)  # the request line is bounded anyway
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"malformed query string: {e}") from None
    unknown = sorted(set(parsed) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
        raise HttpError(400, f"unknown query parameter(s) {', '.join(unknown)}; {takes}")
    repeated = sorted(k for k, v in parsed.items() if len(v) > 1)
    if repeated:
        raise HttpError(400, f"query parameter(s) {', '.join(repeated)} given more than once")
    return {k: v[0] for k, v in parsed.items()}


def param_int(query: Query, name: str, *, default: int | None = None, minimum: int = 0,
              maximum: int | None = None) -> int:
    """An integer parameter in [minimum, maximum]; required when ``default`` is None."""
    raw = query.get(name)
    if raw is None:
        if default is None:
            raise HttpError(400, f"query parameter {name} is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, got {raw[:40]!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise HttpError(400, f"{name} must be in [{minimum}, {'...' if maximum is None else maximum}], got {value}")
    return value


def as_bool(name: str, value: Any, default: bool | None = None) -> bool:
    """A flag from a query parameter or a JSON body: true/false, as JSON or as text (BookKeeper's
    bodies carry "true" as a string)."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise HttpError(400, f"{name} must be true or false, got {str(value)[:40]!r}")


_BUSY_BODY = json.dumps({"error": "busy: too many HTTP requests at once; retry"}).encode()
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
         b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``threads_max`` of them at once. Beyond that the
    accepting thread answers 503 itself and closes the connection: no thread, no queue."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], threads_max: int) -> None:
        assert threads_max >= 1, threads_max
        self.threads_max = threads_max
        self._slots = threading.BoundedSemaphore(threads_max)
        self.refused = 0  # connections answered 503 (for tests and logs)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=limits.http_slot_wait_s):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer was written (its own timeout ran out) is
        not an error of the server's: no traceback for it. Anything else is printed as
        socketserver does."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("admin HTTP: %s hung up before its answer was written", client_address)
            return
        super().handle_error(request, client_address)

    def _refuse(self, request: socket.socket) -> None:
        self.refused += 1
        if self.refused % 100 == 1:
            log.warning("admin HTTP: %d connection(s) refused with 503: more than %d at once",
                        self.refused, self.threads_max)
        try:
            # Read the request first (it is usually there already): a socket closed with unread
            # data resets the connection, and the client could lose the 503 with it.
            request.settimeout(limits.http_refusal_s_max)
            with contextlib.suppress(TimeoutError):
                request.recv(64 * 1024)
            request.sendall(_BUSY)
        except OSError:
            pass  # gone, or not reading its answer: nothing more is owed to it
        finally:
            self.shutdown_request(request)


class AdminHttpServer:
    def __init__(self, host: str, port: int, *, token: str = "", exposed: bool | None = None,
                 request_timeout_s: float = limits.http_request_timeout_s_default,
                 threads_max: int = limits.http_threads_max) -> None:
        self.routes: dict[tuple[str, str], _Route] = {}
        self.token = token
        # Reachable from other machines? (Tests force it to check the policy on loopback.)
        self.exposed = not is_loopback_host(host) if exposed is None else exposed
        if self.exposed and not token:
            log.warning("admin HTTP API on %s:%s without admin_token: PUT/POST endpoints are refused "
                        "(set admin_token to use them remotely)", host, port)
        self.route("GET", "/heartbeat", lambda _body: {"status": "ok"})
        outer = self

        class _H(BaseHTTPRequestHandler):
            timeout = request_timeout_s  # socket timeout: a client that stalls is cut off

            def log_message(self, fmt: str, *args: Any) -> None:  # quiet: metrics scrapes are frequent
                log.debug(fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str = "application/json",
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has headers only
                    self.wfile.write(body)

            def _handle(self, method: str) -> None:
                path, _, raw_query = self.path.partition("?")
                if method == "GET" and path == "/metrics":
                    self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
                    return
                handler = outer.routes.get((method, path))
                if handler is None:
                    allowed = sorted(m for m, p in outer.routes if p == path)
                    if path == "/metrics":
                        allowed = ["GET"]
                    if allowed:
                        self._send(405, json.dumps({"error": f"{method} is not allowed on {path}; "
                                                             f"it takes {', '.join(allowed)}"}).encode(),
                                   headers={"Allow": ", ".join(allowed)})
                    else:
                        self._send(404, json.dumps({"error": f"no such endpoint: {path}"}).encode())
                    return
                if method != "GET":
                    refused = outer.refuse_mutation(self.headers.get("Authorization"), self.headers.get("Origin"))
                    if refused is not None:
                        self._send(refused[0], json.dumps({"error": refused[1]}).encode())
                        return
                try:
                    body = self._body()
                except HttpError as e:
                    self.close_connection = True  # the body may still be on the wire
                    self._send(e.status, json.dumps({"error": str(e)}).encode())
                    return
                try:
                    result = handler(body, raw_query)
                except HttpError as e:
                    self._send(e.status, json.dumps({"error": str(e)}).encode())
                    return
                except ZbkError as e:
                    # A typed error is an answer, not a crash: its status, no traceback.
                    if e.http_status >= 500:
                        log.warning("admin HTTP %s %s: %s: %s", method, path, e.code, e)
                    self._send(e.http_status, json.dumps({"error": str(e), "code": e.code}).encode())
                    return
                except Exception as e:  # noqa: BLE001 - a handler bug answers 500, never drops the client
                    log.exception("admin HTTP %s %s failed", method, path)
                    self._send(500, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
                    return
                self._send(200, json.dumps(result).encode())

            def _body(self) -> dict[str, Any] | None:
                raw = self.headers.get("Content-Length") or "0"
                try:
                    length = int(raw)
                except ValueError:
                    raise HttpError(400, f"bad Content-Length {raw[:20]!r}") from None
                if length < 0:
                    raise HttpError(400, f"bad Content-Length {length}")
                if length > limits.http_body_bytes_max:
                    raise HttpError(413, f"body of {length} bytes exceeds {limits.http_body_bytes_max}")
                if not length:
                    return None
                try:
                    doc = json.loads(self.rfile.read(length))
                except (ValueError, RecursionError):
                    raise HttpError(400, "body is not JSON") from None
                if not isinstance(doc, dict):
                    raise HttpError(400, "body must be a JSON object")
                return doc

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._handle("GET")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._handle("DELETE")

            def do_PATCH(self) -> None:  # noqa: N802
                self._handle("PATCH")

            def do_HEAD(self) -> None:  # noqa: N802
                self._handle("HEAD")

            def do_OPTIONS(self) -> None:  # noqa: N802
                self._handle("OPTIONS")

        try:
            self.httpd = BoundedHTTPServer((host, port), _H, threads_max)
        except OSError as e:
            raise ConfigError(f"cannot listen on http://{host}:{port} (http_port): {e.strerror}") from e
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="zbk-http", daemon=True)

    def refuse_mutation(self, authorization: str | None, origin: str | None) -> tuple[int, str] | None:
        """Why a PUT/POST with these headers is refused (status, message), or None."""
        if self.token:
            if not hmac.compare_digest((authorization or "").encode(), f"Bearer {self.token}".encode()):
                return 401, "admin token required (Authorization: Bearer <admin_token>)"
            return None
        if self.exposed:
            return 403, "this admin API is reachable beyond loopback: set admin_token to use PUT/POST"
        if origin is not None:
            return 403, "cross-origin requests to the admin API are refused (set admin_token to allow them)"
        return None

    def route(self, method: str, path: str, handler: Handler) -> None:
        """A route without query parameters (any is a 400)."""
        self.route_query(method, path, (), lambda body, _query: handler(body))

    def route_query(self, method: str, path: str, params: tuple[str, ...], handler: QueryHandler) -> None:
        """A route that takes the query parameters ``params`` (others are a 400)."""
        assert method in METHODS, method

        def parsed(body: dict[str, Any] | None, raw_query: str) -> Any:
            return handler(body, parse_query(raw_query, params))

        self.routes[(method, path)] = parsed

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
