"""The admin HTTP API: loopback by default, token-protected, refused when exposed without a
token, closed to browsers' cross-site requests, and robust to bad requests.

Servers run in this process on 127.0.0.1 (loopback only); "exposed" is the policy of a
server bound beyond loopback, forced with ``exposed=True`` since tests never bind there.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from zbk import errors
from zbk.config import AutoRecoveryConfig, BookieConfig
from zbk.metrics.http import AdminHttpServer, HttpError, is_loopback_host

calls: list[Any] = []


def _start(**kw: Any) -> AdminHttpServer:
    server = AdminHttpServer("127.0.0.1", 0, **kw)
    server.route("PUT", "/api/v1/thing", lambda body: calls.append(body) or {"ok": True})
    server.route("GET", "/api/v1/thing", lambda _b: {"thing": 1})
    server.route("POST", "/api/v1/boom", lambda _b: 1 / 0)
    server.route("POST", "/api/v1/refuse", lambda _b: (_ for _ in ()).throw(HttpError(409, "no")))
    server.start()
    return server


@pytest.fixture
def make() -> Iterator[Any]:
    started: list[AdminHttpServer] = []

    def factory(**kw: Any) -> AdminHttpServer:
        started.append(_start(**kw))
        return started[-1]

    calls.clear()
    try:
        yield factory
    finally:
        for s in started:
            s.stop()


def http(server: AdminHttpServer, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method, data=data,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_processes_bind_the_admin_api_to_loopback_by_default() -> None:
    assert BookieConfig().http.bind_address == "127.0.0.1"
    assert AutoRecoveryConfig().http_bind_address == "127.0.0.1"
    server = AdminHttpServer(BookieConfig().http.bind_address, 0)
    try:
        assert server.httpd.server_address[0] == "127.0.0.1" and not server.exposed
    finally:
        server.httpd.server_close()


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.1.2.3", False), ("bookie-1.example", False),
])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_loopback_without_token_allows_local_tools_but_not_browsers(make: Any) -> None:
    s = make()
    assert http(s, "GET", "/api/v1/thing") == (200, {"thing": 1})
    assert http(s, "PUT", "/api/v1/thing", {"a": 1})[0] == 200
    code, body = http(s, "PUT", "/api/v1/thing", {"a": 2}, headers={"Origin": "http://evil.example"})
    assert code == 403 and "cross-origin" in body["error"]
    assert calls == [{"a": 1}]


def test_token_is_required_for_mutations_and_compared_exactly(make: Any) -> None:
    s = make(token="s3cret")
    assert http(s, "GET", "/api/v1/thing")[0] == 200
    assert http(s, "GET", "/heartbeat")[0] == 200
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"},
                    {"Authorization": "Bearer s3cret "}, {"Authorization": "Bearer s3cre"}):
        assert http(s, "PUT", "/api/v1/thing", {"a": 1}, headers=headers)[0] == 401, headers
    assert calls == []
    ok = {"Authorization": "Bearer s3cret"}
    assert http(s, "PUT", "/api/v1/thing", {"a": 3}, headers=ok)[0] == 200
    assert http(s, "PUT", "/api/v1/thing", {"a": 4}, headers={**ok, "Origin": "http://ops.example"})[0] == 200
    assert calls == [{"a": 3}, {"a": 4}]


def test_exposed_without_token_refuses_every_mutation_but_serves_reads(make: Any) -> None:
    s = make(exposed=True)
    assert http(s, "GET", "/api/v1/thing")[0] == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=10) as resp:
        assert resp.status == 200  # Prometheus scrapes stay open
    code, body = http(s, "PUT", "/api/v1/thing", {"a": 1})
    assert code == 403 and "admin_token" in body["error"]
    assert http(s, "POST", "/api/v1/boom")[0] == 403
    assert calls == []
    exposed_with_token = make(exposed=True, token="t")
    assert http(exposed_with_token, "PUT", "/api/v1/thing", {"a": 5}, headers={"Authorization": "Bearer t"})[0] == 200


def test_bad_bodies_and_failing_handlers_get_an_answer(make: Any) -> None:
    s = make()
    assert http(s, "PUT", "/api/v1/thing", raw=b"{not json")[0] == 400
    assert http(s, "PUT", "/api/v1/thing", [1, 2])[0] == 400  # a JSON array is not an object
    assert http(s, "PUT", "/api/v1/thing", raw=b"[" * 100_000 + b"]" * 100_000)[0] in (400, 413)
    code, body = http(s, "POST", "/api/v1/boom")
    assert code == 500 and "ZeroDivisionError" in body["error"]
    assert http(s, "POST", "/api/v1/refuse")[0] == 409
    for length in ("-5", "abc", str(5 << 20)):
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
            c.sendall(f"PUT /api/v1/thing HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            status = c.recv(200).split(b" ")[1]
            assert status in (b"400", b"413"), (length, status)
    assert http(s, "GET", "/api/v1/thing")[0] == 200  # still serving
    assert calls == []


def test_a_client_that_sends_nothing_is_cut_off(make: Any) -> None:
    s = make(request_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
        c.sendall(b"PUT /api/v1/thing HTTP/1.1\r\n")  # and then nothing
        started = time.monotonic()
        assert c.recv(100) == b""  # the server closed the connection
        assert time.monotonic() - started < 4
    assert http(s, "GET", "/heartbeat")[0] == 200


def test_connections_beyond_the_thread_bound_get_503_at_once_and_no_thread(make: Any) -> None:
    """A real server with room for two connections: two slow requests hold both threads;
    more connections are answered 503 quickly by the accepting thread, and no thread is
    started for them. Once the slow ones finish, requests are served again."""
    s = make(threads_max=2)
    release = threading.Event()
    inside = threading.Semaphore(0)

    def slow(_body: Any) -> dict[str, Any]:
        inside.release()
        release.wait(20)
        return {"slow": True}

    s.route("GET", "/api/v1/slow", slow)
    results: list[int] = []
    slow_clients = [threading.Thread(target=lambda: results.append(http(s, "GET", "/api/v1/slow")[0]))
                    for _ in range(2)]
    try:
        for t in slow_clients:
            t.start()
        for _ in slow_clients:
            assert inside.acquire(timeout=10), "the slow requests hold both threads"
        threads_before = threading.active_count()
        for _ in range(5):
            started = time.monotonic()
            code, body = http(s, "GET", "/heartbeat")
            assert (code, "busy" in body.get("error", "")) == (503, True)
            assert time.monotonic() - started < 2
        # A client that connects and says nothing is refused as well, within the bound.
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
            started = time.monotonic()
            assert c.recv(100).startswith(b"HTTP/1.0 503")
            assert time.monotonic() - started < 2
        assert threading.active_count() == threads_before, "a refused connection started no thread"
        assert s.httpd.refused == 6
    finally:
        release.set()
        for t in slow_clients:
            t.join(20)
    assert results == [200, 200]
    assert http(s, "GET", "/heartbeat")[0] == 200  # both slots came back


def test_a_failing_handler_gives_its_thread_back(make: Any) -> None:
    s = make(threads_max=1)
    for _ in range(3):
        assert http(s, "POST", "/api/v1/boom")[0] == 500
    assert http(s, "GET", "/api/v1/thing") == (200, {"thing": 1})
    assert s.httpd.refused == 0


_TYPED = sorted((c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ZbkError)),
                key=lambda c: c.__name__)


def test_typed_errors_answer_their_own_status_without_a_traceback(make: Any) -> None:
    """Through a real server: a handler that raises a typed error answers that error's
    http_status and code, not 500 with a traceback."""
    s = make()
    for cls in _TYPED:
        s.route("GET", f"/api/v1/raise/{cls.__name__}", lambda _b, cls=cls: (_ for _ in ()).throw(cls("it failed")))
    for cls in _TYPED:
        code, body = http(s, "GET", f"/api/v1/raise/{cls.__name__}")
        assert (code, body) == (cls.http_status, {"error": "it failed", "code": cls.code}), cls
    assert {404, 409, 503} <= {c.http_status for c in _TYPED}  # not everything is a 500


def test_a_client_that_hangs_up_before_its_answer_leaves_no_traceback(make: Any,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A chaos run's bookie printed a BrokenPipeError traceback: the harness's HTTP client
    gave up (its timeout) before a slow answer was written. A peer that went away is not an
    error of the server's; a handler's own failure still is reported."""
    s = make()
    gate = threading.Event()
    s.route("GET", "/api/v1/slow", lambda _b: gate.wait(5) and {"blob": "x" * 1_000_000})
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            c.sendall(b"GET /api/v1/slow HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
        # closed with SO_LINGER 0: a reset, so the server's write of the answer fails
        gate.set()
        time.sleep(0.3)
        gate.clear()
    assert http(s, "GET", "/api/v1/thing") == (200, {"thing": 1})
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err
