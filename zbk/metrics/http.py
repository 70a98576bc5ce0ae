"""The small HTTP server every zbk process runs: /metrics, /heartbeat and /api/v1/...

Handlers are plain functions registered by path; mutating endpoints (PUT/POST) need the
admin token when one is configured, and the server binds loopback unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from zbk.errors import ZbkError

log = logging.getLogger(__name__)
Handler = Callable[[dict[str, Any] | None], Any]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AdminHttpServer:
    def __init__(self, host: str, port: int, *, token: str = "") -> None:
        self.routes: dict[tuple[str, str], Handler] = {}
        self.token = token
        self.routes[("GET", "/heartbeat")] = lambda _body: {"status": "ok"}
        outer = self

        class _H(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:  # quiet: metrics scrapes are frequent
                log.debug(fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                if method == "GET" and path == "/metrics":
                    self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
                    return
                handler = outer.routes.get((method, path))
                if handler is None:
                    code = 405 if any(p == path for _, p in outer.routes) else 404
                    self._send(code, json.dumps({"error": f"no {method} {path}"}).encode())
                    return
                if method != "GET" and outer.token:
                    if self.headers.get("Authorization", "") != f"Bearer {outer.token}":
                        self._send(401, b'{"error": "admin token required"}')
                        return
                body: dict[str, Any] | None = None
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    try:
                        body = json.loads(self.rfile.read(min(length, 1 << 20)))
                    except ValueError:
                        self._send(400, b'{"error": "body is not JSON"}')
                        return
                try:
                    result = handler(body)
                except HttpError as e:
                    self._send(e.status, json.dumps({"error": str(e)}).encode())
                    return
                except ZbkError as e:
                    self._send(500, json.dumps({"error": str(e), "code": e.code}).encode())
                    return
                self._send(200, json.dumps(result).encode())

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._handle("GET")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

        self.httpd = ThreadingHTTPServer((host, port), _H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="zbk-http", daemon=True)

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method, path)] = handler

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
