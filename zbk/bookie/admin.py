"""A bookie's admin HTTP routes: info, state (GET and PUT) and a GC trigger.

HTTP handlers run on the server's threads: what they change goes to the actors as a
message on the admin pipes, under ``admin_lock`` (a socket is not thread-safe).
"""

from __future__ import annotations

import threading
from typing import Any

import zmq

from zbk.actors.base import handoff_for, send_message
from zbk.actors.messages import GcTrigger
from zbk.bookie.registration import BookieRegistrar
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

    def state(self) -> str:
        return "readonly" if self.server and self.server.read_only else "writable"

    def info(self) -> dict[str, Any]:
        assert self.server is not None
        used, total = self.server.disk_usage
        return {"id": self.cfg.bookie_id, "state": self.state(), "ledgers": len(self.server.ledgers),
                "limbo_ledgers": sum(1 for s in self.server.ledgers.values() if s.limbo),
                "disk": {"used_bytes": used, "total_bytes": total,
                         "usage_ratio": round(used / total, 4) if total else 0.0}}

    def _put_state(self, body: dict[str, Any] | None) -> dict[str, Any]:
        from zbk.metrics.http import HttpError

        want = (body or {}).get("state")
        if want not in ("readonly", "writable"):
            raise HttpError(400, 'body must be {"state": "readonly" | "writable"}')
        with self.admin_lock:
            send_message(self.admin, handoff_for(self.instance), ("admin", "read_only", want == "readonly"))
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

