"""A bookie's admin HTTP routes: info, state (GET and PUT) and a GC trigger.

HTTP handlers run on the server's threads, so they never read an actor's state: they send
the actor a message (zbk/actors/messages.py, "admin") on the admin pipes, under
``admin_lock`` (a socket is not thread-safe), and a question waits for the actor's answer
at most ``limits.server_admin_answer_wait_s`` (then :class:`ZbkTimeoutError`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import handoff_for, send_message
from zbk.actors.messages import BookieStatus, GcTrigger, SetReadOnly, StatusRequest
from zbk.bookie.registration import BookieRegistrar
from zbk.errors import ZbkTimeoutError
from zbk.metrics.http import AdminHttpServer


class BookieAdmin(BookieRegistrar):
    # Set by Bookie.start, before the HTTP server starts.
    instance: str
    admin: zmq.Socket[bytes]
    admin_gc: zmq.Socket[bytes]
    admin_lock: threading.Lock

    def _start_http(self) -> None:
        cfg = self.cfg
        self.http = AdminHttpServer(cfg.http.bind_address, cfg.http.port, token=cfg.http.admin_token)
        self.http.route("GET", "/api/v1/bookie/info", lambda _b: self.info())
        self.http.route("GET", "/api/v1/bookie/state", lambda _b: {"state": self.state()})
        self.http.route("PUT", "/api/v1/bookie/state", self._put_state)
        self.http.route("POST", "/api/v1/bookie/gc", self._post_gc)
        self.http.start()

    def status(self) -> BookieStatus:
        """The Server's answer to a StatusRequest; ZbkTimeoutError when none comes in time
        (the Server is stopping, or too busy to answer)."""
        answer: Future[BookieStatus] = Future()
        with self.admin_lock:
            send_message(self.admin, handoff_for(self.instance), StatusRequest(answer))
        wait_s = limits.server_admin_answer_wait_s
        try:
            return answer.result(timeout=wait_s)
        except FutureTimeout:
            raise ZbkTimeoutError(f"the bookie's Server did not answer within {wait_s:g} s") from None

    def state(self) -> str:
        return "readonly" if self.status().read_only else "writable"

    def info(self) -> dict[str, Any]:
        s = self.status()
        used, total = s.disk_used_bytes, s.disk_total_bytes
        return {"id": self.cfg.bookie_id, "state": "readonly" if s.read_only else "writable", "ledgers": s.ledgers,
                "limbo_ledgers": s.limbo_ledgers,
                "disk": {"used_bytes": used, "total_bytes": total,
                         "usage_ratio": round(used / total, 4) if total else 0.0}}

    def _put_state(self, body: dict[str, Any] | None) -> dict[str, Any]:
        from zbk.metrics.http import HttpError

        want = (body or {}).get("state")
        if want not in ("readonly", "writable"):
            raise HttpError(400, 'body must be {"state": "readonly" | "writable"}')
        with self.admin_lock:
            send_message(self.admin, handoff_for(self.instance), SetReadOnly(want == "readonly"))
        return {"state": want}

    def _post_gc(self, body: dict[str, Any] | None) -> dict[str, Any]:
        """POST /api/v1/bookie/gc, body optional {"major": bool, "minor": bool}: start a GC
        run now (asynchronous; forced compactions regardless of their intervals)."""
        from zbk.metrics.http import HttpError

        flags = {k: (body or {}).get(k, False) for k in ("major", "minor")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise HttpError(400, 'body must be {"major": bool, "minor": bool}')
        with self.admin_lock:
            send_message(self.admin_gc, handoff_for(self.instance), GcTrigger(**flags))
        return {"triggered": True, **flags}
