"""A bookie's admin HTTP API: BookKeeper's bookie endpoints, its effective configuration, and
the cluster-wide ``autorecovery/*`` and ``ledger/*`` routes (zbk/metrics/clusterapi.py).

The HTTP server comes up first, before the journal replay (:meth:`BookieAdmin.boot`), so
that ``GET /api/v1/bookie/is_ready`` can tell a readiness probe "not yet" (503) while the
bookie replays and registers, "yes" (200) once it is registered (writable or read-only),
and "no" (503) again from the moment it starts to stop. Routes that ask the actors answer
503 until the actors run; the cluster-wide routes answer from the metadata at once.

HTTP handlers run on the server's threads, so they never read an actor's state: they send
the actor a message (zbk/actors/messages.py, "admin") on the admin pipes, under
``admin_lock`` (a socket is not thread-safe), and a question waits for the actor's answer
at most ``limits.server_admin_answer_wait_s`` (then :class:`ZbkTimeoutError`). What they
read directly is on disk (the last log mark, the file listing) or in metadata.

Bookie routes (BookKeeper's names; JSON):
GET /api/v1/bookie/info, GET|PUT /api/v1/bookie/state ({"state": "readonly"|"writable"}: an
operator's read-only state, kept on disk so that it lasts across restarts,
zbk/storage/operatorstate.py), POST /api/v1/bookie/gc ({"major": bool, "minor": bool}),
GET /api/v1/bookie/gc -> {"is_in_force_gc": bool}, GET /api/v1/bookie/is_ready,
GET /api/v1/bookie/list_bookies[?type=rw|ro][&print_hostnames=true] -> {bookie: host name or null},
GET /api/v1/bookie/gc_details -> [{forceCompacting, majorCompacting, minorCompacting,
lastMajorCompactionTime, lastMinorCompactionTime, majorCompactionCounter, minorCompactionCounter}],
GET|PUT /api/v1/bookie/gc/suspend_compaction ({"suspendMajor": bool, "suspendMinor": bool}) and
PUT /api/v1/bookie/gc/resume_compaction ({"resumeMajor": bool, "resumeMinor": bool}) ->
{"isMajorGcSuspended": bool, "isMinorGcSuspended": bool},
GET /api/v1/bookie/last_log_mark -> {journal dir: {"log_id": segment id, "offset": bytes}},
GET /api/v1/bookie/list_disk_file[?file_type=journal|entrylog|index] ->
{"journal files": [{kind, id, bytes, path}], "entrylog files": [...], "index files": [...]},
GET /api/v1/config/server_config -> the effective BookieConfig, the admin token, the
metadata URI's password and the secret CURVE key's path masked.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import handoff_for, send_message
from zbk.actors.messages import (
    BookieStatus,
    GcStatus,
    GcStatusRequest,
    GcSuspend,
    GcTrigger,
    SetReadOnly,
    StatusRequest,
)
from zbk.actors.server import ServerCore
from zbk.bookie.boot import BootReport
from zbk.bookie.registration import BookieRegistrar
from zbk.errors import BookieIOError, BookieUnavailableError, ZbkTimeoutError
from zbk.metadata.registry import BookieRegistration
from zbk.metrics.http import AdminHttpServer, HttpError, Query, as_bool

log = logging.getLogger(__name__)
BOOKIE = "/api/v1/bookie"
SECRET_SHOWN = "********"
_FILE_TYPES = {"journal": ("journal", "journal-free"), "entrylog": ("entrylog",), "index": ("index",)}


class BookieAdmin(BookieRegistrar):
    # Set by Bookie.start once the actors run (admin pipes connected): ``serving``; once it
    # has registered: ``ready``. Plain flags, written by the starting thread, read by HTTP threads.
    instance: str
    admin: zmq.Socket[bytes]
    admin_gc: zmq.Socket[bytes]
    admin_lock: threading.Lock
    serving = False
    ready = False
    api: Any = None  # zbk.metrics.clusterapi.ClusterApi
    # An operator's read-only change is persisted, then sent, as one step (two PUTs at once
    # must leave the disk and the Server agreeing). One bookie per process: one lock.
    _state_lock = threading.Lock()

    # -- the HTTP server, before the boot ---------------------------------------------------
    def boot(self) -> BootReport:
        """The HTTP server first (is_ready answers 503 during the replay), then the boot."""
        self._start_http()
        try:
            return super().boot()
        except BaseException:
            self._stop_http()
            raise

    def _start_http(self) -> None:
        """Start the HTTP server with every route, once (later calls do nothing)."""
        if self.http is not None:
            return
        from zbk.metrics.clusterapi import ClusterApi

        cfg = self.cfg
        http = AdminHttpServer(cfg.http.bind_address, cfg.http.port, token=cfg.http.admin_token)
        r, rq = http.route, http.route_query
        r("GET", f"{BOOKIE}/info", lambda _b: self.info())
        r("GET", f"{BOOKIE}/state", lambda _b: {"state": self.state()})
        r("PUT", f"{BOOKIE}/state", self._put_state)
        r("POST", f"{BOOKIE}/gc", self._post_gc)
        r("GET", f"{BOOKIE}/gc", lambda _b: {"is_in_force_gc": self.gc_status().forced})
        r("GET", f"{BOOKIE}/is_ready", self._is_ready)
        rq("GET", f"{BOOKIE}/list_bookies", ("type", "print_hostnames"), self._list_bookies)
        r("GET", f"{BOOKIE}/gc_details", lambda _b: [_gc_details(self.gc_status())])
        r("GET", f"{BOOKIE}/gc/suspend_compaction", lambda _b: _suspension(self.gc_status()))
        r("PUT", f"{BOOKIE}/gc/suspend_compaction", lambda b: self._suspend(b, "suspend", True))
        r("PUT", f"{BOOKIE}/gc/resume_compaction", lambda b: self._suspend(b, "resume", False))
        r("GET", f"{BOOKIE}/last_log_mark", lambda _b: self._last_log_mark())
        rq("GET", f"{BOOKIE}/list_disk_file", ("file_type",), self._list_disk_file)
        r("GET", "/api/v1/config/server_config", lambda _b: self.server_config())
        self.api = ClusterApi(self.store, owner=f"bookie {cfg.bookie_id}",
                              client_config=cfg.autorecovery_config(http.port).client_config())
        self.api.install(http)
        http.start()
        self.http = http

    def _serve_admin(self) -> None:
        """The actors run and the admin pipes are connected: the routes that ask them serve."""
        self._start_http()
        self.serving = True

    def _stop_http(self) -> None:
        if self.http is not None:
            self.http.stop()
        if self.api is not None:
            self.api.close()

    def _restore_read_only(self, server: ServerCore) -> None:
        """Before the Server's thread starts: an operator's read-only state lasts across
        restarts, and ``start_read_only`` (``zbk bookie --readonly``) sets it."""
        from zbk.metrics import bookie as m
        from zbk.storage.operatorstate import operator_read_only, set_operator_read_only

        dirs = list(self.cfg.index_dirs)
        if self.cfg.start_read_only and not operator_read_only(dirs):
            set_operator_read_only(dirs, True)
        if operator_read_only(dirs):
            server.admin.force_read_only = True  # its thread has not started: no message needed
            self.server_read_only = True  # what the first registration publishes
            m.WRITABLE.set(0)
            log.info("read-only, as an operator set it (PUT /api/v1/bookie/state writable to undo)")

    # -- asking the actors ----------------------------------------------------------------------
    def _ask(self, sock_name: str, make: Any, what: str) -> Any:
        if not self.serving:
            raise BookieUnavailableError("the bookie is starting (journal replay, registration): ask again soon")
        answer: Future[Any] = Future()
        with self.admin_lock:
            send_message(getattr(self, sock_name), handoff_for(self.instance), make(answer))
        wait_s = limits.server_admin_answer_wait_s
        try:
            return answer.result(timeout=wait_s)
        except FutureTimeout:
            raise ZbkTimeoutError(f"the bookie's {what} did not answer within {wait_s:g} s") from None

    def _tell(self, sock_name: str, msg: Any) -> None:
        if not self.serving:
            raise BookieUnavailableError("the bookie is starting (journal replay, registration): ask again soon")
        with self.admin_lock:
            send_message(getattr(self, sock_name), handoff_for(self.instance), msg)

    def status(self) -> BookieStatus:
        """The Server's answer to a StatusRequest; ZbkTimeoutError when none comes in time
        (the Server is stopping, or too busy to answer)."""
        status: BookieStatus = self._ask("admin", StatusRequest, "Server")
        return status

    def gc_status(self) -> GcStatus:
        status: GcStatus = self._ask("admin_gc", GcStatusRequest, "GarbageCollector")
        return status

    def state(self) -> str:
        return "readonly" if self.status().read_only else "writable"

    def info(self) -> dict[str, Any]:
        s = self.status()
        used, total = s.disk_used_bytes, s.disk_total_bytes
        return {"id": self.cfg.bookie_id, "state": "readonly" if s.read_only else "writable", "ledgers": s.ledgers,
                "limbo_ledgers": s.limbo_ledgers,
                "disk": {"used_bytes": used, "total_bytes": total,
                         "usage_ratio": round(used / total, 4) if total else 0.0}}

    # -- handlers ---------------------------------------------------------------------------------
    def _put_state(self, body: dict[str, Any] | None) -> dict[str, Any]:
        """The operator's read-only state: on disk first (durably), then to the Server."""
        from zbk.storage.operatorstate import set_operator_read_only

        want = (body or {}).get("state")
        if want not in ("readonly", "writable"):
            raise HttpError(400, 'body must be {"state": "readonly" | "writable"}')
        if not self.serving:
            raise BookieUnavailableError("the bookie is starting (journal replay, registration): ask again soon")
        with self._state_lock:
            try:
                set_operator_read_only(list(self.cfg.index_dirs), want == "readonly")
            except OSError as e:
                raise BookieIOError(f"cannot keep the read-only state on disk: {e}") from None
            self._tell("admin", SetReadOnly(want == "readonly"))
        return {"state": want}

    def _post_gc(self, body: dict[str, Any] | None) -> dict[str, Any]:
        """POST /api/v1/bookie/gc, body optional {"major": bool, "minor": bool}: start a GC
        run now (asynchronous; forced compactions regardless of their intervals)."""
        flags = {k: (body or {}).get(k, False) for k in ("major", "minor")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise HttpError(400, 'body must be {"major": bool, "minor": bool}')
        self._tell("admin_gc", GcTrigger(**flags))
        return {"triggered": True, **flags}

    def _suspend(self, body: dict[str, Any] | None, verb: str, value: bool) -> dict[str, Any]:
        doc = body or {}
        names = (f"{verb}Major", f"{verb}Minor")
        unknown = sorted(set(doc) - set(names))
        if unknown or not doc:
            raise HttpError(400, f'body must be {{"{names[0]}": bool, "{names[1]}": bool}}'
                                 + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        major, minor = (value if as_bool(n, doc.get(n), default=False) else None for n in names)
        status: GcStatus = self._ask("admin_gc", lambda answer: GcSuspend(major, minor, answer), "GarbageCollector")
        return _suspension(status)

    def _is_ready(self, _body: dict[str, Any] | None) -> dict[str, Any]:
        # An answer, not a failure: a probe asks every few seconds, so a 503 here logs nothing.
        if self.stop_event.is_set():
            raise HttpError(503, "not ready: the bookie is stopping")
        if not self.ready:
            raise HttpError(503, "not ready: the bookie is replaying its journal or registering")
        return {"ready": True}

    def _list_bookies(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        from zbk.metadata.registry import list_bookies

        kind = query.get("type")
        if kind not in (None, "rw", "ro"):
            raise HttpError(400, f"type must be rw (writable) or ro (read-only), got {kind[:20]!r}")
        hostnames = as_bool("print_hostnames", query.get("print_hostnames"), default=False)
        regs = [] if kind == "ro" else list_bookies(self.store)
        regs += [] if kind == "rw" else list_bookies(self.store, readonly=True)
        return {r.bookie_id: _host_name(r) if hostnames else None for r in regs}

    def _last_log_mark(self) -> dict[str, Any]:
        """The journal positions the last checkpoint made durable, one per journal directory
        (read from disk: the lastMark files, not the JournalWriters' state)."""
        from zbk.storage import markers

        dirs = list(self.cfg.journal_dirs)
        marks = markers.read_last_marks(list(self.cfg.index_dirs), len(dirs))
        return {d: {"log_id": m.segment_id, "offset": m.offset} for d, m in zip(dirs, marks, strict=True)}

    def _list_disk_file(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        from zbk.storage.listing import list_files

        kind = query.get("file_type")
        if kind is not None and kind not in _FILE_TYPES:
            raise HttpError(400, f"file_type must be one of {', '.join(_FILE_TYPES)}, got {kind[:20]!r}")
        wanted = [kind] if kind else list(_FILE_TYPES)
        cfg = self.cfg
        files = list_files(cfg.journal_dirs, cfg.ledger_dirs, cfg.index_dirs, journal="journal" in wanted,
                           entrylog="entrylog" in wanted, index="index" in wanted)
        return {f"{k} files": [f for f in files if f["kind"] in _FILE_TYPES[k]] for k in wanted}

    def server_config(self) -> dict[str, Any]:
        """The effective configuration (defaults, file, --set and flags applied), secrets
        masked (shown as set, not what they are): the admin token, a password in the metadata
        URI, and where the bookie's secret CURVE key is. Public keys' paths are shown."""
        from zbk.metadata.uri import redact

        doc = dataclasses.asdict(self.cfg)
        doc["metadata_uri"] = redact(self.cfg.metadata_uri)
        for section, key in (("http", "admin_token"), ("curve", "secret_key_file")):
            if doc[section][key]:
                doc[section][key] = SECRET_SHOWN
        return doc


def _gc_details(s: GcStatus) -> dict[str, Any]:
    return {"forceCompacting": s.forced, "majorCompacting": s.major_compacting, "minorCompacting": s.minor_compacting,
            "lastMajorCompactionTime": s.last_major_ms, "lastMinorCompactionTime": s.last_minor_ms,
            "majorCompactionCounter": s.major_count, "minorCompactionCounter": s.minor_count}


def _suspension(s: GcStatus) -> dict[str, Any]:
    return {"isMajorGcSuspended": s.major_suspended, "isMinorGcSuspended": s.minor_suspended}


def _host_name(reg: BookieRegistration) -> str | None:
    """The host name of the machine the registration's address is on (its id may be a
    name that says nothing of where the bookie is: zbk/metadata/resolver.py)."""
    from zbk.bookieid import split_address
    from zbk.metadata.resolver import registered_address

    address = registered_address(reg)
    if address is None:
        return None
    parts = split_address(address)
    assert parts is not None, address  # registered_address gives host:port or nothing
    host = parts[0].strip("[]")
    try:
        return socket.gethostbyaddr(host)[0]
    except OSError:
        return host  # no reverse name: the address is the best name there is
