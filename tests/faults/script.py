"""Histories written by hand for the checker's tests: each call records what a client did
through a real HistoryRecorder (in memory, on a clock that ticks one millisecond per event),
and :meth:`Script.history` parses the lines back as the checker would read a file."""

from __future__ import annotations

import io

from .history import FinalLedger, FinalState, History, HistoryRecorder, Op, digest


def pl(ledger: int, entry: int, variant: int = 0) -> bytes:
    """The payload of a ledger's entry (``variant`` makes a different one for the same id)."""
    return f"ledger {ledger} entry {entry} v{variant}".encode()


def final_ledger(last: int, entries: dict[int, bytes] | range | None = None, *, closed: bool = True,
                 ledger: int = 1) -> FinalLedger:
    """A ledger of the final state; ``entries`` as a range means the standard payloads."""
    if entries is None:
        entries = range(last + 1)
    if isinstance(entries, range):
        entries = {e: pl(ledger, e) for e in entries}
    return FinalLedger(closed, last, {e: digest(p) for e, p in entries.items()})


def final(**ledgers: FinalLedger) -> FinalState:
    """``final(l1=..., l2=...)``: the final state of ledgers 1 and 2."""
    return FinalState({int(name[1:]): fl for name, fl in ledgers.items()})


class Script:
    def __init__(self) -> None:
        self.buf = io.StringIO()
        self.now = 0.0
        self.rec = HistoryRecorder(self.buf, clock=self._tick)

    def _tick(self) -> float:
        self.now += 0.001
        return self.now

    def history(self) -> History:
        return History.parse(self.buf.getvalue())

    def create(self, process: str, ledger: int) -> None:
        op = self.rec.invoke(process, "create")
        self.rec.ok(op, ledger=ledger)

    def append(self, process: str, ledger: int, entry: int, payload: bytes | None = None, outcome: str = "ok", *,
               confirmed: int | None = None) -> Op:
        """One append of ``payload`` (default: the standard one) as entry ``entry``. Outcome
        ``none`` leaves it open (complete it later with :meth:`complete`, or never)."""
        op = self.rec.invoke(process, "append", ledger=ledger, entry=entry,
                             payload=pl(ledger, entry) if payload is None else payload)
        self.complete(op, outcome, entry=entry if confirmed is None else confirmed)
        return op

    def complete(self, op: Op, outcome: str, *, entry: int | None = None) -> None:
        if outcome == "ok":
            self.rec.ok(op, entry=entry)
        elif outcome == "fail":
            self.rec.fail(op, "LedgerClosedError: refused before it was sent")
        elif outcome == "info":
            self.rec.info(op, "ZbkTimeoutError: no answer")
        else:
            assert outcome == "none", outcome

    def appends(self, process: str, ledger: int, entries: range, outcome: str = "ok") -> None:
        for e in entries:
            self.append(process, ledger, e, outcome=outcome)

    def read(self, process: str, ledger: int, first: int, last: int, got: list[tuple[int, bytes]] | range,
             outcome: str = "ok") -> Op:
        if isinstance(got, range):
            got = [(e, pl(ledger, e)) for e in got]
        op = self.rec.invoke(process, "read", ledger=ledger, first=first, last=last)
        if outcome == "ok":
            self.rec.ok(op, entries=got)
        elif outcome == "fail":
            self.rec.fail(op, "NoSuchEntryError: beyond the LAC", entries=got)
        else:
            self.rec.info(op, "ZbkTimeoutError: no answer", entries=got)
        return op

    def tail(self, process: str, ledger: int, view: str, first: int, got: list[tuple[int, bytes]] | range, *,
             end: bool = False) -> None:
        """A tail from ``first`` that yields ``got``, one step each, then (``end``) stops at the close."""
        if isinstance(got, range):
            got = [(e, pl(ledger, e)) for e in got]
        nxt = first
        for e, p in got:
            op = self.rec.invoke(process, "tail", ledger=ledger, first=nxt, view=view)
            self.rec.ok(op, entries=[(e, p)])
            nxt = e + 1
        if end:
            op = self.rec.invoke(process, "tail", ledger=ledger, first=nxt, view=view)
            self.rec.ok(op, entries=[], end=True)

    def bound(self, process: str, ledger: int, kind: str, last: int, *, closed: bool | None = None) -> Op:
        """A read_lac, open, open_recover or close that answered ``last``."""
        op = self.rec.invoke(process, kind, ledger=ledger)
        self.rec.ok(op, last=last, closed=closed)
        return op
