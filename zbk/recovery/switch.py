"""The cluster's auto-recovery switch (BookKeeper's ledger replication enable/disable).

``underreplication/disable`` present: an operator has switched auto-recovery off. While it
is, the auditor marks no ledger (lost bookies are still noticed, and audited once the switch
is back on; the periodic check neither starts nor goes on) and replicator workers take no
mark, so nothing is copied. Marks written meanwhile (by a booting bookie for its limbo
ledgers, or by hand) wait. Absent (a new cluster): on. It lives in metadata, so it holds
for every process and survives their restarts; `zbk shell autorecovery --enable | --disable
| --status` and ``GET|PUT /api/v1/autorecovery/status`` read and change it, and every
auto-recovery process exports it as ``zbk_autorecovery_enabled`` (its replicators read it
before each pass, its auditor on every change). This module sets no metric itself: bookies
serve the HTTP routes too, and must not export auto-recovery gauges.

The key's value says who switched it off and when, for ``--status``: a CBOR map, format
version 1 (``fv``), ``by`` (text) and ``ct`` (milliseconds since the epoch). Only its
presence decides: a value that does not decode still means off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import cbor2

from zbk.errors import KeyExistsError
from zbk.metadata import layout
from zbk.metadata.store import MetadataStore

_FORMAT = 1


@dataclass(frozen=True)
class SwitchState:
    enabled: bool
    disabled_by: str = ""  # who switched it off ("" while on, or when the value is unreadable)
    disabled_ms: int = 0  # when (0: on, or unknown)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled}
        if not self.enabled:
            out.update(disabled_by=self.disabled_by, disabled_ms=self.disabled_ms)
        return out


def read_switch(store: MetadataStore) -> SwitchState:
    """The switch as it is now (one metadata read)."""
    kv = store.get(layout.AUTORECOVERY_DISABLED)
    if kv is None:
        return SwitchState(True)
    try:
        raw: Any = cbor2.loads(kv.value)
    except Exception:  # noqa: BLE001 - cbor2 raises several types; presence alone decides
        raw = None
    if isinstance(raw, dict) and raw.get("fv") == _FORMAT:
        by, ct = raw.get("by"), raw.get("ct")
        return SwitchState(False, by if isinstance(by, str) else "", ct if isinstance(ct, int) else 0)
    return SwitchState(False)


def is_enabled(store: MetadataStore) -> bool:
    return read_switch(store).enabled


def set_enabled(store: MetadataStore, enabled: bool, *, by: str) -> SwitchState:
    """Switch auto-recovery on or off (idempotent: switching it off again keeps who and when
    it was first switched off). Returns the state after."""
    if enabled:
        store.delete(layout.AUTORECOVERY_DISABLED)
    else:
        value = cbor2.dumps({"fv": _FORMAT, "by": by, "ct": int(time.time() * 1000)})
        try:
            store.create(layout.AUTORECOVERY_DISABLED, value)
        except KeyExistsError:
            pass  # off already
    return read_switch(store)
