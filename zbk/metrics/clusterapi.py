"""The cluster-wide admin routes every bookie and every auto-recovery process serves:
``/api/v1/autorecovery/*`` and ``/api/v1/ledger/*`` (BookKeeper's names and shapes).

They answer from the metadata store (and, to read entries, through a client), never from a
bookie's own state, so any process of the cluster gives the same answer, and a bookie
serves them from the moment its HTTP server is up, before its journal replay. An
unreachable metadata store is a 503 (MetadataUnavailableError), a missing ledger a 404, a
wrong ledger password a 403, bad parameters a 400. Routes that change state (PUT) are
behind the admin token like every mutation (zbk/metrics/http.py).

Shapes (BookKeeper's where it has the endpoint; its ids are strings as JSON keys):

* ``GET /api/v1/autorecovery/status`` -> ``{"enabled": bool}`` (and, while off,
  ``disabled_by``, ``disabled_ms``); ``PUT`` with ``{"enabled": bool}`` or ``?enabled=true``
  switches it (:mod:`zbk.recovery.switch`) and answers the state after.
* ``GET /api/v1/autorecovery/list_under_replicated_ledger[?missingreplica=B |
  excludingmissingreplica=B]`` -> ``{"ledgers": [{ledger_id, missing_bookies, marked_ms}],
  "repairs": [{ledger_id, bookie, why, marked_ms, detail}]}``.
* ``GET /api/v1/autorecovery/who_is_auditor`` -> ``{"auditor": id or null}``.
* ``PUT /api/v1/autorecovery/trigger_audit`` -> ``{"triggered": true, "auditor": id or null,
  "enabled": bool}``: the auditor's periodic check of all ledgers runs now (once the switch
  is on, if it is off).
* ``GET|PUT /api/v1/autorecovery/lost_bookie_recovery_delay`` <->
  ``{"lost_bookie_recovery_delay_s": seconds}`` (PUT also takes BookKeeper's ``{"delay_seconds": s}``).
* ``GET /api/v1/ledger/list[?print_metadata=true][&page=N]`` -> ``{"<id>": metadata or null}``.
* ``GET /api/v1/ledger/metadata?ledger_id=N`` -> ``{"<id>": metadata}`` (no password).
* ``GET /api/v1/ledger/read?ledger_id=N[&start_entry_id=A][&end_entry_id=B][&password=P]
  [&encoding=text|base64|hex]`` -> ``{"<entry id>": payload}``.
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
from typing import Any

from zbk import limits
from zbk.config import ClientConfig
from zbk.metadata import layout
from zbk.metadata.coordination import current_leader
from zbk.metadata.registry import LedgerStore
from zbk.metadata.store import MetadataStore
from zbk.metrics.http import AdminHttpServer, HttpError, Query, as_bool, param_int

log = logging.getLogger(__name__)

AUTORECOVERY = "/api/v1/autorecovery"
LEDGER = "/api/v1/ledger"
_ENCODINGS = ("text", "base64", "hex")


class ClusterApi:
    """The routes, over one metadata store. ``owner``: who this process is, recorded when
    it switches auto-recovery off."""

    def __init__(self, store: MetadataStore, *, owner: str, client_config: ClientConfig | None = None) -> None:
        self.store = store
        self.owner = owner
        self.client_config = client_config or ClientConfig().validate()
        self.ledgers = LedgerStore(store)
        self._client: Any = None  # zbk.BookKeeper, opened by the first ledger/read
        self._client_lock = threading.Lock()

    def install(self, http: AdminHttpServer) -> None:
        a, led = AUTORECOVERY, LEDGER
        http.route("GET", f"{a}/status", lambda _b: self._status())
        http.route_query("PUT", f"{a}/status", ("enabled",), self._put_status)
        http.route_query("GET", f"{a}/list_under_replicated_ledger", ("missingreplica", "excludingmissingreplica"),
                         self._under_replicated)
        http.route("GET", f"{a}/who_is_auditor", lambda _b: {"auditor": current_leader(self.store)})
        http.route("PUT", f"{a}/trigger_audit", self._trigger_audit)
        http.route("GET", f"{a}/lost_bookie_recovery_delay", lambda _b: self._delay())
        http.route("PUT", f"{a}/lost_bookie_recovery_delay", self._put_delay)
        http.route_query("GET", f"{led}/list", ("print_metadata", "page"), self._list)
        http.route_query("GET", f"{led}/metadata", ("ledger_id",), self._metadata)
        http.route_query("GET", f"{led}/read", ("ledger_id", "start_entry_id", "end_entry_id", "password", "encoding"),
                         self._read)

    def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- autorecovery/* -----------------------------------------------------------------------
    def _status(self) -> dict[str, Any]:
        from zbk.recovery.switch import read_switch

        return read_switch(self.store).as_json()

    def _put_status(self, body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        from zbk.recovery.switch import set_enabled

        given = [as_bool("enabled", v) for v in (query.get("enabled"), (body or {}).get("enabled")) if v is not None]
        if not given:
            raise HttpError(400, 'say {"enabled": true|false} in the body, or ?enabled=true|false')
        if len(set(given)) > 1:
            raise HttpError(400, "the body and the query string disagree on enabled")
        return set_enabled(self.store, given[0], by=self.owner).as_json()

    def _under_replicated(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        from zbk.recovery.underreplication import UnderReplicationRegistry

        only, but = query.get("missingreplica"), query.get("excludingmissingreplica")
        if only == "" or but == "":
            raise HttpError(400, "missingreplica and excludingmissingreplica name a bookie (its id)")
        registry = UnderReplicationRegistry(self.store, self.owner)

        def keep(bookies: tuple[str, ...] | list[str]) -> bool:
            return (only is None or only in bookies) and (but is None or but not in bookies)

        return {"ledgers": [m.as_json() for m in registry.list() if keep(m.missing_bookies)],
                "repairs": [m.as_json() for m in registry.list_repairs() if keep([m.bookie_id])]}

    def _trigger_audit(self, _body: dict[str, Any] | None) -> dict[str, Any]:
        import time

        from zbk.recovery.switch import is_enabled

        self.store.put(layout.AUDITOR_TRIGGER, str(int(time.time() * 1000)).encode("ascii"))
        return {"triggered": True, "auditor": current_leader(self.store), "enabled": is_enabled(self.store)}

    def _delay(self) -> dict[str, Any]:
        from zbk.recovery.underreplication import get_recovery_delay

        return {"lost_bookie_recovery_delay_s": get_recovery_delay(self.store)}

    def _put_delay(self, body: dict[str, Any] | None) -> dict[str, Any]:
        from zbk.recovery.underreplication import set_recovery_delay

        doc = body or {}
        value = doc.get("lost_bookie_recovery_delay_s", doc.get("delay_seconds"))
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise HttpError(400, 'body must be {"lost_bookie_recovery_delay_s": seconds >= 0}')
        set_recovery_delay(self.store, float(value))
        return {"lost_bookie_recovery_delay_s": float(value)}

    # -- ledger/* -----------------------------------------------------------------------------
    def _list(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        """Every ledger, or one page of ``limits.http_ledger_list_page_ledgers`` (``page``
        counts from 1). Without ``page``, a cluster with more ledgers than an answer may hold
        (``limits.http_ledger_list_ledgers_max``; with metadata, one page) is a 400 that
        says to ask page by page: a silently cut list would look complete."""
        with_metadata = as_bool("print_metadata", query.get("print_metadata"), default=False)
        per_page = limits.http_ledger_list_page_ledgers
        ids = self.ledgers.list_ids()
        if "page" in query:
            page = param_int(query, "page", minimum=1, maximum=limits.ledger_id_max // per_page + 1)
            chosen = list(itertools.islice(ids, (page - 1) * per_page, page * per_page))
        else:
            most = per_page if with_metadata else limits.http_ledger_list_ledgers_max
            chosen = list(itertools.islice(ids, most + 1))
            if len(chosen) > most:
                raise HttpError(400, f"more than {most} ledgers: ask for them page by page "
                                     f"(page=1, 2, ...; {per_page} ledgers a page)")
        if not with_metadata:
            return dict.fromkeys((str(lid) for lid in chosen), None)
        return {str(lid): shown for lid in chosen if (shown := self._shown(lid)) is not None}

    def _shown(self, lid: int) -> dict[str, Any] | None:
        from zbk.errors import NoSuchLedgerError

        try:
            md, version = self.ledgers.read(lid)
        except NoSuchLedgerError:
            return None  # deleted since it was listed
        return md.as_json(version)

    def _metadata(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        lid = param_int(query, "ledger_id", maximum=limits.ledger_id_max)
        md, version = self.ledgers.read(lid)  # NoSuchLedgerError: 404
        return {str(lid): md.as_json(version)}

    def _read(self, _body: dict[str, Any] | None, query: Query) -> dict[str, Any]:
        """Entries ``start_entry_id`` (0) .. ``end_entry_id`` (the last add confirmed) of a
        ledger, at most ``limits.http_read_entries_max`` (a longer explicit range is a 400;
        without ``end_entry_id`` the first that many). An end beyond the last add confirmed
        reads up to it: entries past it are not confirmed. No recovery, no fencing."""
        from zbk.client.recovery import check_password

        lid = param_int(query, "ledger_id", maximum=limits.ledger_id_max)
        first = param_int(query, "start_entry_id", default=0)
        end = param_int(query, "end_entry_id", default=-1, minimum=-1)  # -1: BookKeeper's "to the end"
        encoding = query.get("encoding", "text")
        if encoding not in _ENCODINGS:
            raise HttpError(400, f"encoding must be one of {', '.join(_ENCODINGS)}, got {encoding[:20]!r}")
        most = limits.http_read_entries_max
        if end >= 0 and end < first:
            raise HttpError(400, f"end_entry_id {end} is before start_entry_id {first}")
        if end >= 0 and end - first + 1 > most:
            raise HttpError(400, f"at most {most} entries per request: ask for {first}..{first + most - 1}, then on")
        password = query.get("password", "").encode()
        md, _ = self.ledgers.read(lid)  # NoSuchLedgerError: 404
        check_password(md, password)  # UnauthorizedError: 403, before any bookie is asked
        rh = self._bookkeeper().open_ledger(lid, password=password, recovery=False)
        last = rh.last_add_confirmed if end < 0 else min(end, rh.last_add_confirmed)
        last = min(last, first + most - 1)
        if last < first:
            return {}
        return {str(e.entry_id): _encode(bytes(e.payload), encoding) for e in rh.read(first, last)}

    def _bookkeeper(self) -> Any:
        """One client for this process's reads, opened by the first (a bookie that is never
        asked to read opens none)."""
        import zbk

        with self._client_lock:
            if self._client is None:
                self._client = zbk.BookKeeper(self.store.uri, config=self.client_config)
            return self._client


def _encode(payload: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(payload).decode("ascii")
    if encoding == "hex":
        return payload.hex()
    return payload.decode("utf-8", errors="replace")  # BookKeeper answers text; base64 or hex are exact
