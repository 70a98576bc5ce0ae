"""Explicit LAC (BookKeeper's explicitLacInterval): an idle writer tells its ensemble its LAC.

A bookie learns a ledger's LAC from the LAC piggybacked on each add, which is the writer's
LAC when it built that entry: so it lags one entry behind, and a writer that stops leaves
its last confirmed entry invisible to tailing readers until its next add or its close.
With ``explicit_lac_interval_ms`` > 0 the writer sends WRITE_LAC to the last ensemble once
its LAC has stayed ahead of everything it sent (piggybacked or explicit) for a while.

Cost: no timer per add. A handle whose LAC advances registers itself here (a dict insert
per confirmation batch); one timer per client runs every half interval while any handle is
registered. At a tick, the handles registered since the previous tick have their LAC noted;
at the next tick, a handle whose sent LAC is still below the noted one (no add carried it
meanwhile: the writer is idle) sends its current LAC. A reader thus sees the last entry of
an idle writer at most one interval (two ticks) after its confirmation, plus a round trip;
a busy writer, whose next add always carries the noted LAC, sends no WRITE_LAC at all.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from zbk.client import metrics as cm
from zbk.errors import ZbkError
from zbk.wire import messages as w
from zbk.wire.status import Status

if TYPE_CHECKING:  # the handles register here; only their type is needed
    from zbk.client.context import HandleContext
    from zbk.client.writing import LedgerHandle

log = logging.getLogger(__name__)


class ExplicitLac:
    """The explicit-LAC check of one client's writers (LedgerHandle._explicit)."""

    def __init__(self, ctx: HandleContext, interval_ms: int) -> None:
        self.ctx = ctx
        self.period_s = interval_ms / 2000  # two ticks per interval
        self._advanced: dict[LedgerHandle, None] = {}  # handles whose LAC advanced since the last tick
        self._noted: dict[LedgerHandle, int] = {}  # handle -> its LAC at the last tick
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def note(self, handle: LedgerHandle) -> None:
        """``handle`` confirmed entries: its LAC advanced."""
        self._advanced[handle] = None
        if self._timer is None and not self._stopped:
            self._timer = asyncio.get_running_loop().call_later(self.period_s, self._tick)

    def stop(self) -> None:
        """The client closes: no more ticks."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._advanced.clear()
        self._noted.clear()

    def _tick(self) -> None:
        self._timer = None
        for h, lac in self._noted.items():
            if h.lac_sent < lac and _open(h):
                self._send(h)
        advanced, self._advanced = self._advanced, {}
        self._noted = {h: h.lac for h in advanced if h.lac > h.lac_sent}
        if self._noted:
            self._timer = asyncio.get_running_loop().call_later(self.period_s, self._tick)

    def _send(self, h: LedgerHandle) -> None:
        """WRITE_LAC of ``h``'s LAC to its last ensemble, not waited for: a failure only means
        that readers wait for the next add (or the next idle period) to see the entry."""
        lac = h.lac_sent = h.lac
        t = self.ctx.transport
        msg = w.WriteLacRequest(rid=t.next_rid(), ledger_id=h.ledger_id, master_key=h.master_key, lac=lac)
        cm.EXPLICIT_LACS.inc()
        for bookie in h.md.last_ensemble:
            t.send(bookie, msg, self.ctx.add_timeout_s, functools.partial(_answered, h.ledger_id, lac, bookie))


def _open(h: LedgerHandle) -> bool:
    """A writer that may still add: not closed or closing, not failed (fenced...)."""
    return not (h.closing or h.failed is not None or h.md.is_closed)


def _answered(ledger_id: int, lac: int, bookie: str, resp: Any) -> None:
    if isinstance(resp, ZbkError):
        log.debug("ledger %d: WRITE_LAC %d to %s failed: %s", ledger_id, lac, bookie, resp)
    elif isinstance(resp, BaseException):
        log.warning("ledger %d: WRITE_LAC %d to %s failed: %r", ledger_id, lac, bookie, resp)
    elif resp.status != Status.EOK:
        log.debug("ledger %d: WRITE_LAC %d to %s: %s", ledger_id, lac, bookie, resp.status.name)
