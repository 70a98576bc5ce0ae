"""The history checker: reads a history and the final state (formats in history.py) and
gives a verdict, with counterexamples, on each property. It knows nothing of how the run
was made: processes, namespaces and faults are not its business.

    python -m tests.faults.checker HISTORY [HISTORY ...] FINAL_STATE [--json] [--all]

prints a table of verdicts and exits 1 if any is red (2 if an input cannot be read). The
history files are read a line at a time and judged as they come; what the check keeps grows
with the entries of the ledgers (under 100 bytes an entry, the final state's digests
included), not with the size of the history.

The properties
--------------
``history``        well-formed: each completion follows its invoke, once, with the same
                   process and kind; appends name their ledger and payload, and no two
                   appends that may have taken effect claim one entry id.
``lost``           every acknowledged append is in the final state with its payload
                   (absent, changed, cut off by the close, or its ledger gone: red).
``persistence``    the seeds' property: a closed ledger ends at or after every acknowledged
                   entry and every LAC a reader saw; and it closed once, at one place (every
                   ``close``, ``open_recover`` and open of a closed ledger agrees with it).
``divergent``      no entry id read with two payloads, across every read of the history and
                   the final state.
``prefix``         each reader's view (one read, or the steps of one tail) is a prefix of
                   the final ledger from where it started: consecutive ids, each in the final
                   ledger with the same payload; a tail that ended at the close saw the
                   ledger up to its last entry.
``indeterminate``  what a ledger holds beyond its acknowledged entries is what was appended,
                   in order: an indeterminate add (``info``, or never completed) may be
                   present or absent, but if appended entry k is present every earlier
                   appended entry is (an absent acknowledged one is reported as lost); one
                   present carries the payload sent for its id; and no entry is present
                   (nor a close placed) beyond what was appended.

``indeterminate`` judges the ledgers whose writer is in the history (a create or an
append). A ``fail`` append claims no id and is judged by nothing. A ledger that is not
closed in the final state is not judged for persistence (the report notes it).
"""

from __future__ import annotations

import argparse
import json
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbk.errors import EXIT_USAGE, CorruptDataError

from .history import Event, FinalLedger, FinalState, History, Seen, iter_history

PROPERTIES: tuple[tuple[str, str], ...] = (
    ("history", "well-formed history"),
    ("lost", "no acknowledged entry lost or changed"),
    ("persistence", "closed ledgers end at or after every ack"),
    ("divergent", "no entry read with two payloads"),
    ("prefix", "every reader's view a prefix of the ledger"),
    ("indeterminate", "indeterminate adds present only in order"),
)
REFS_PER_DIGEST = 3  # ops kept to name where a divergent payload was seen


@dataclass(frozen=True, slots=True)
class Counterexample:
    kind: str  # a short tag: missing, changed, beyond-close, reordered, phantom, ...
    ledger: int | None
    entry: int | None
    detail: str
    ops: tuple[str, ...] = ()  # the operations that show it ("op 17")

    def describe(self) -> str:
        where = "" if self.ledger is None else f"ledger {self.ledger}" + (
            "" if self.entry is None else f" entry {self.entry}")
        refs = f" [{', '.join(self.ops)}]" if self.ops else ""
        return f"{where + ': ' if where else ''}{self.kind}: {self.detail}{refs}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ledger": self.ledger, "entry": self.entry, "detail": self.detail,
                "ops": list(self.ops)}


@dataclass
class Verdict:
    name: str
    title: str
    checked: int = 0
    unit: str = ""
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.counterexamples

    def kinds(self) -> set[str]:
        return {c.kind for c in self.counterexamples}

    def add(self, kind: str, ledger: int | None, entry: int | None, detail: str, *ops: str) -> None:
        self.counterexamples.append(Counterexample(kind, ledger, entry, detail, tuple(ops)))


@dataclass
class CheckResult:
    verdicts: dict[str, Verdict]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts.values())

    def __getitem__(self, name: str) -> Verdict:
        return self.verdicts[name]

    def red(self) -> list[str]:
        return [name for name, v in self.verdicts.items() if not v.ok]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "notes": self.notes,
                "verdicts": {name: {"title": v.title, "ok": v.ok, "checked": v.checked, "unit": v.unit,
                                    "counterexamples": [c.to_json() for c in v.counterexamples]}
                             for name, v in self.verdicts.items()}}

    def table(self, limit: int | None = 5) -> str:
        rows = [("property", "verdict", "checked", "counterexamples", "")]
        for name, v in self.verdicts.items():
            rows.append((name, "green" if v.ok else "RED", f"{v.checked} {v.unit}", str(len(v.counterexamples)),
                         v.title))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4]).rstrip() for r in rows]
        for name, v in self.verdicts.items():
            if v.ok:
                continue
            shown = v.counterexamples if limit is None else v.counterexamples[:limit]
            more = len(v.counterexamples) - len(shown)
            lines.append(f"\n{name}: {len(v.counterexamples)} counterexample(s)"
                         + (f", the first {len(shown)}" if more else ""))
            lines += [f"  {c.describe()}" for c in shown]
        if self.notes:
            lines.append("\nnotes:")
            lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


# -- the pass over the history ------------------------------------------------------------------
# The checker judges the events as they come (a 30-minute chaos run writes several hundred
# megabytes of history): an operation is judged when its completion arrives, or at the end
# if none does. It keeps the operations still open, a code per op id (to pair completions),
# and per ledger a code and an op id per entry id that an append claimed; reads are compared
# with the final state as they arrive, and only disagreements are kept.
_NONE, _OPEN, _OK, _FAIL, _INFO = range(5)
_CODE = {"ok": _OK, "fail": _FAIL, "info": _INFO}
_TYPE = {_OK: "ok", _FAIL: "fail", _INFO: "info"}
_DENSE_MAX = 1 << 28  # op and entry ids below this are kept in arrays; others in dicts
_SOURCE_SHIFT = 40


def _pack(ev: Event) -> int:
    """An event's operation as one int: its ref is rebuilt from it (:func:`_ref`)."""
    return (ev.source << _SOURCE_SHIFT) | ev.op if 0 <= ev.op < (1 << _SOURCE_SHIFT) else -1


def _ref(packed: int, fallback: str = "op ?") -> str:
    if packed < 0:
        return fallback
    source, op = packed >> _SOURCE_SHIFT, packed & ((1 << _SOURCE_SHIFT) - 1)
    return f"op {op}" if source == 0 else f"op {source}:{op}"


class _Codes:
    """A small code per non-negative int id: a bytearray for ids below _DENSE_MAX, else a dict."""

    __slots__ = ("dense", "sparse")

    def __init__(self) -> None:
        self.dense = bytearray()
        self.sparse: dict[int, int] = {}

    def get(self, i: int) -> int:
        if 0 <= i < len(self.dense):
            return self.dense[i]
        return self.sparse.get(i, 0)

    def set(self, i: int, code: int) -> None:
        if 0 <= i < _DENSE_MAX:
            if i >= len(self.dense):
                self.dense.extend(bytes(max(i + 1 - len(self.dense), len(self.dense) // 2)))
            self.dense[i] = code
        else:
            self.sparse[i] = code

    def items(self) -> Iterator[tuple[int, int]]:
        """(id, code) for every id whose code is not 0, ids ascending."""
        sparse = sorted(self.sparse.items())
        yield from ((i, c) for i, c in sparse if i < 0)
        yield from ((i, c) for i, c in enumerate(self.dense) if c)
        yield from ((i, c) for i, c in sparse if i >= 0 and c)


class _Claims:
    """The entry ids appends claimed on one ledger: outcome code and op of each."""

    __slots__ = ("codes", "ops", "refs", "top")

    def __init__(self) -> None:
        self.codes = _Codes()
        self.ops = array("q")  # packed op by entry id (dense ids only)
        self.refs: dict[int, str] = {}  # ref by entry id where the op does not pack or the id is not dense
        self.top = -1

    def add(self, eid: int, code: int, ev: Event) -> None:
        self.codes.set(eid, code)
        packed = _pack(ev)
        if 0 <= eid < _DENSE_MAX and packed >= 0:
            if eid >= len(self.ops):
                self.ops.extend([-1] * (eid + 1 - len(self.ops)))
            self.ops[eid] = packed
        else:
            self.refs[eid] = ev.ref
        self.top = max(self.top, eid)

    def ref(self, eid: int) -> str:
        if eid in self.refs:
            return self.refs[eid]
        return _ref(self.ops[eid] if 0 <= eid < len(self.ops) else -1)

    def outcome(self, eid: int) -> str:
        return "ok" if self.codes.get(eid) == _OK else "info"


@dataclass(slots=True)
class _View:
    ledger: int
    start: int | None = None  # the first id expected (None until known)
    expected: int = 0
    last: int | None = None  # the last entry seen
    seen: int = 0  # entries seen
    reported: bool = False  # a phantom from a ledger the final state lacks: said once
    order_bad: bool = False
    phantom_bad: bool = False
    ended: str = ""  # the op whose tail step found the ledger closed and ended


@dataclass(slots=True)
class _Acked:
    top: int = -1
    top_ref: str = ""
    beyond: int = 0  # acknowledged entries beyond the final close


def _indeterminate(outcome: str) -> bool:
    return outcome in ("info", "none")


class _Checker:
    def __init__(self, final: FinalState) -> None:
        self.final = final
        self.v = {name: Verdict(name, title) for name, title in PROPERTIES}
        # Malformed operations (as opposed to lines that do not pair): reported after those.
        self.malformed = Verdict("history", "")
        self.notes: list[str] = []
        self.codes: dict[int, _Codes] = {}  # source -> op id -> _OPEN or its completion's code
        self.open: dict[tuple[int, int], Event] = {}  # invoked, not completed, in invoke order
        self.next_id: dict[int, int] = {}
        self.claims: dict[int, _Claims] = {}  # ledger -> what its appends claimed (fail ones claim nothing)
        self.acked: dict[int, _Acked] = {}
        self.absent_indeterminate: dict[int, list[int]] = {}  # ledger -> indeterminate ids not in the final state
        self.written: set[int] = set()  # ledgers whose writer is in the history (a create or an append)
        self.views: dict[tuple[Any, ...], _View] = {}
        self.read: dict[int, _Codes] = {}  # ledger -> entry ids some read returned
        # ledger -> the first REFS_PER_DIGEST reads (packed ops) of each entry that agreed with
        # the final state, REFS_PER_DIGEST slots an entry id (-2: free)
        self.agreed: dict[int, array[int]] = {}
        self.disagree: dict[tuple[int, int], dict[str, list[str]]] = {}  # reads unlike the final state, or of
        # entries it lacks: (ledger, entry) -> digest -> ops
        self.closes: dict[int, list[tuple[int, str]]] = {}  # ledger -> (last entry, op) of each close seen
        self.lacs: dict[int, tuple[int, str]] = {}  # ledger -> the highest LAC seen, and where

    # -- pairing ---------------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        bad = self.v["history"]
        codes = self.codes.setdefault(ev.source, _Codes())
        code = codes.get(ev.op)
        key = (ev.source, ev.op)
        if ev.type == "invoke":
            if code != _NONE:
                bad.add("invoked-twice", ev.ledger, None, f"a second invoke of the same op ({ev.kind})", ev.ref)
            else:
                codes.set(ev.op, _OPEN)
                self.open[key] = ev
                self.v["history"].checked += 1
            return
        if code == _NONE:
            bad.add("no-invoke", ev.ledger, None, f"a {ev.type} of {ev.kind} that was never invoked", ev.ref)
            return
        if code != _OPEN:
            bad.add("completed-twice", ev.ledger, None, f"{ev.kind} completed as {_TYPE[code]}, then {ev.type}",
                    ev.ref)
            return
        inv = self.open[key]
        if (ev.kind, ev.process) != (inv.kind, inv.process):
            bad.add("mismatch", ev.ledger, None, f"invoked as {inv.kind} by {inv.process}, completed "
                    f"as {ev.kind} by {ev.process}", ev.ref)
            return
        del self.open[key]
        codes.set(ev.op, _CODE[ev.type])
        self._judge(inv, ev)

    # -- what each operation tells ---------------------------------------------------------------
    def _judge(self, inv: Event, done: Event | None) -> None:
        kind = inv.kind
        if kind == "append":  # completed or not: one never completed is indeterminate
            self._append(inv, done)
        elif done is None:
            return
        elif kind in ("read", "tail"):
            self._observe(inv, done)
        elif kind == "create" and done.type == "ok":
            if done.ledger is None:
                self.malformed.add("no-ledger", None, None, "a create confirmed without its ledger id", done.ref)
            else:
                self.written.add(done.ledger)
        elif kind in ("read_lac", "open", "open_recover", "close") and done.type == "ok":
            self._bound(inv, done)

    def _append(self, inv: Event, done: Event | None) -> None:
        bad = self.malformed
        if inv.ledger is None or inv.digest is None:
            bad.add("bad-append", inv.ledger, inv.entry, "an append without its ledger or payload digest", inv.ref)
            return
        lid = inv.ledger
        self.written.add(lid)
        outcome = "none" if done is None else done.type
        if outcome == "fail":
            return
        eid = inv.entry
        if done is not None and done.type == "ok" and done.entry is not None:
            if eid is not None and eid != done.entry:
                bad.add("renumbered", lid, eid, f"appended as entry {eid}, confirmed as entry {done.entry}",
                        inv.ref)
            eid = done.entry
        if eid is None:  # ids follow the order of a ledger's appends (one writer)
            eid = self.next_id.get(lid, 0)
        self.next_id[lid] = max(self.next_id.get(lid, 0), eid + 1)
        mine = self.claims.setdefault(lid, _Claims())
        if mine.codes.get(eid):
            bad.add("same-id", lid, eid, "two appends claim this entry id", mine.ref(eid), inv.ref)
            return
        mine.add(eid, _OK if outcome == "ok" else _INFO, inv)
        f = self.final.ledgers.get(lid)
        if outcome == "ok":
            self._lost(lid, eid, inv, f)
        elif f is not None and eid in f.entries:
            if f.entries[eid] != inv.digest:
                self.v["indeterminate"].add("wrong-payload", lid, eid, f"an indeterminate add of {inv.digest[:12]} "
                                            f"is present as {f.entries[eid][:12]}", inv.ref)
        elif f is not None:
            self.absent_indeterminate.setdefault(lid, []).append(eid)

    def _lost(self, lid: int, eid: int, inv: Event, f: FinalLedger | None) -> None:
        v = self.v["lost"]
        v.checked += 1
        a = self.acked.setdefault(lid, _Acked())
        if eid > a.top:
            a.top, a.top_ref = eid, inv.ref
        if f is None:
            v.add("ledger-missing", lid, eid, "acknowledged; the ledger is not in the final state", inv.ref)
        elif f.closed and eid > f.last_entry:
            a.beyond += 1
            v.add("beyond-close", lid, eid, f"acknowledged; the ledger closed at {f.last_entry}", inv.ref)
        elif eid not in f.entries:
            v.add("missing", lid, eid, "acknowledged; not read back after healing", inv.ref)
        elif f.entries[eid] != inv.digest:
            assert inv.digest is not None
            v.add("changed", lid, eid, f"acknowledged with {inv.digest[:12]}, read back as "
                  f"{f.entries[eid][:12]}", inv.ref)

    def _observe(self, inv: Event, done: Event) -> None:
        if inv.ledger is None:
            self.malformed.add("bad-read", None, None, f"a {inv.kind} without its ledger", inv.ref)
            return
        lid = inv.ledger
        tail = inv.kind == "tail" and bool(inv.view)
        vkey: tuple[Any, ...] = ("view", inv.source, inv.view) if tail else ("op", inv.source, inv.op)
        view = self.views.get(vkey)
        if view is None:
            view = self.views[vkey] = _View(lid, inv.first)
            self.v["prefix"].checked += 1
        elif view.ledger != lid:
            self.malformed.add("bad-read", lid, None, f"tail view {inv.view!r} moved from ledger "
                                  f"{view.ledger} to ledger {lid}", inv.ref)
            return
        f = self.final.ledgers.get(lid)
        read = self.read.setdefault(lid, _Codes())
        for s in done.entries or ():
            if not read.get(s.entry):
                read.set(s.entry, 1)
                self.v["divergent"].checked += 1
            if f is None or s.entry not in f.entries or f.entries[s.entry] != s.digest:
                refs = self.disagree.setdefault((lid, s.entry), {}).setdefault(s.digest, [])
                if len(refs) < REFS_PER_DIGEST:
                    refs.append(done.ref)
            elif 0 <= s.entry < _DENSE_MAX:  # kept to name it beside a disagreeing read, should one come
                agreed = self.agreed.setdefault(lid, array("q"))
                at = REFS_PER_DIGEST * s.entry
                if at >= len(agreed):
                    agreed.extend([-2] * (at + REFS_PER_DIGEST - len(agreed)))
                free = next((i for i in range(at, at + REFS_PER_DIGEST) if agreed[i] == -2), None)
                if free is not None:
                    agreed[free] = _pack(done)
            self._step(view, s, done.ref, f)
        if done.type == "ok" and done.end:
            view.ended = done.ref
        if not tail:  # a read is a view of its own, whole now
            self._view_end(self.views.pop(vkey), f)

    def _step(self, view: _View, s: Seen, ref: str, f: FinalLedger | None) -> None:
        """One entry of a reader's view, in the order returned."""
        v, lid = self.v["prefix"], view.ledger
        if view.start is None:
            view.start = s.entry
        if view.last is None:
            view.expected = view.start
        if f is None:
            if not view.reported:
                view.reported = True
                v.add("phantom", lid, s.entry, "read from a ledger that is not in the final state", ref)
            view.last = s.entry
            return
        if s.entry != view.expected and not view.order_bad:
            view.order_bad = True
            v.add("reordered", lid, s.entry, f"position {view.seen} of a view from {view.start} is entry "
                  f"{s.entry}, expected {view.expected}", ref)
        view.seen += 1
        view.expected = s.entry + 1
        view.last = s.entry
        if view.phantom_bad:
            return
        if f.closed and s.entry > f.last_entry:
            view.phantom_bad = True
            v.add("phantom", lid, s.entry, f"read; the ledger closed at {f.last_entry}", ref)
        elif s.entry in f.entries and f.entries[s.entry] != s.digest:
            view.phantom_bad = True
            v.add("phantom", lid, s.entry, f"read as {s.digest[:12]}; the final ledger holds "
                  f"{f.entries[s.entry][:12]} there", ref)
        elif s.entry not in f.entries and s.entry <= f.last_entry:
            view.phantom_bad = True
            v.add("absent", lid, s.entry, "read; not read back after healing", ref)

    def _view_end(self, view: _View, f: FinalLedger | None) -> None:
        if view.ended and f is not None and f.closed:
            start = view.start if view.start is not None else 0
            end = view.last if view.last is not None else start - 1
            if end < f.last_entry:
                self.v["prefix"].add("ended-short", view.ledger, end, f"a tail from {start} ended at the close after "
                                     f"entry {end}; the ledger closed at {f.last_entry}", view.ended)

    def _bound(self, inv: Event, done: Event) -> None:
        lid = done.ledger if done.ledger is not None else inv.ledger
        if lid is None or done.last is None:
            self.malformed.add("bad-bound", lid, None, f"a {inv.kind} confirmed without its ledger or last entry",
                                  done.ref)
            return
        closing = inv.kind in ("open_recover", "close") or (inv.kind == "open" and bool(done.closed))
        if closing:
            self.closes.setdefault(lid, []).append((done.last, done.ref))
        elif done.last > self.lacs.get(lid, (-2, ""))[0]:
            self.lacs[lid] = (done.last, done.ref)

    # -- the properties, once every event is in ---------------------------------------------------
    def finish_ops(self) -> None:
        pending = list(self.open.values())
        self.open.clear()
        for inv in pending:
            self._judge(inv, None)
        if pending:
            self.notes.append(f"{len(pending)} operation(s) never completed: judged indeterminate")
        for key in list(self.views):
            view = self.views.pop(key)
            self._view_end(view, self.final.ledgers.get(view.ledger))

    def persistence(self) -> None:
        v = self.v["persistence"]
        v.unit = "closed ledgers"
        ledgers = set(self.claims) | set(self.closes) | set(self.lacs)
        unjudged = []
        for lid in sorted(ledgers):
            f = self.final.ledgers.get(lid)
            if f is None:
                continue  # its acknowledged entries are lost; nothing is closed to judge
            a = self.acked.get(lid)
            if not f.closed:
                for last, ref in self.closes.get(lid, ()):
                    v.add("reopened", lid, None, f"seen closed at {last}; not closed in the final state", ref)
                if a is not None:
                    unjudged.append(lid)
                continue
            v.checked += 1
            if a is not None and a.top > f.last_entry:
                v.add("below-ack", lid, a.top, f"closed at {f.last_entry}, below acknowledged entry {a.top} "
                      f"({a.beyond} acknowledged entries beyond the close)", a.top_ref)
            lac = self.lacs.get(lid)
            if lac is not None and lac[0] > f.last_entry:
                v.add("below-lac", lid, lac[0], f"closed at {f.last_entry}, below LAC {lac[0]} seen by a reader",
                      lac[1])
            for last, ref in self.closes.get(lid, ()):
                if last != f.last_entry:
                    v.add("closed-twice", lid, None, f"seen closed at {last}; the final state has it closed at "
                          f"{f.last_entry}", ref)
        if unjudged:
            self.notes.append(f"{len(unjudged)} ledger(s) with acknowledged entries not closed in the final state, "
                              f"persistence not judged: {_few(unjudged)}")

    def divergent(self) -> None:
        v = self.v["divergent"]
        v.unit = "entries read"
        for (lid, eid), digests in sorted(self.disagree.items()):
            f = self.final.ledgers.get(lid)
            named = {d: list(refs) for d, refs in digests.items()}
            if f is not None and eid in f.entries:
                agreed = self.agreed.get(lid, array("q"))
                at = REFS_PER_DIGEST * eid
                refs = [_ref(p) for p in agreed[at:at + REFS_PER_DIGEST] if p != -2] if eid >= 0 else []
                named.setdefault(f.entries[eid], []).extend([*refs, "final state"])
            if len(named) > 1:
                text = "; ".join(f"{d[:12]} by {', '.join(refs)}" for d, refs in named.items())
                v.add("two-payloads", lid, eid, f"read with {len(named)} payloads: {text}",
                      *(r for refs in named.values() for r in refs if r != "final state"))

    def indeterminate(self) -> None:
        v = self.v["indeterminate"]
        v.unit = "indeterminate adds"
        early = v.counterexamples  # wrong payloads, found as the adds came
        v.counterexamples = []
        for lid in sorted(self.written):
            mine = self.claims.get(lid, _Claims())
            claimed = list(mine.codes.items())
            v.checked += sum(1 for _, c in claimed if c == _INFO)
            v.counterexamples += [c for c in early if c.ledger == lid]
            f = self.final.ledgers.get(lid)
            if f is None:
                continue
            # The first present claimed id after each claimed id (ids of one writer are dense).
            later: dict[int, int] = {}
            absent = set(self.absent_indeterminate.get(lid, ()))
            nxt: int | None = None
            for eid, _ in reversed(claimed):
                if eid in absent and nxt is not None:
                    later[eid] = nxt
                if eid in f.entries:
                    nxt = eid
            for eid in sorted(later):
                k = later[eid]
                v.add("out-of-order", lid, eid, f"an indeterminate add is absent while entry {k} "
                      f"({mine.outcome(k)}) after it is present", mine.ref(eid), mine.ref(k))
            stray = [e for e in f.entries if not mine.codes.get(e)]
            if stray:
                v.add("never-appended", lid, stray[0], f"{len(stray)} entr{'y' if len(stray) == 1 else 'ies'} "
                      f"present that no append claimed ({_few(stray)})")
            if f.closed and f.last_entry > mine.top:
                v.add("closed-beyond", lid, f.last_entry, f"closed at {f.last_entry}; appends reached entry {mine.top}")
        v.counterexamples.sort(key=lambda c: (c.ledger if c.ledger is not None else -1))

    def result(self, notes: Iterable[str] = ()) -> CheckResult:
        self.v["history"].unit = "operations"
        self.v["lost"].unit = "acknowledged entries"
        self.v["prefix"].unit = "reader views"
        self.finish_ops()
        self.v["history"].counterexamples += self.malformed.counterexamples
        self.v["lost"].counterexamples.sort(key=lambda c: (c.ledger or 0, c.entry or 0))
        self.persistence()
        self.divergent()
        self.indeterminate()
        missing = sorted(lid for lid in self.written | set(self.read) if lid not in self.final.ledgers)
        if missing:
            self.notes.append(f"{len(missing)} ledger(s) of the history not in the final state: {_few(missing)}")
        return CheckResult(self.v, list(notes) + self.notes)


def _few(ids: list[int], n: int = 8) -> str:
    return ", ".join(map(str, ids[:n])) + (", ..." if len(ids) > n else "")


def check(history: History | Iterable[Event], final: FinalState, notes: Iterable[str] = ()) -> CheckResult:
    """Every verdict for ``history`` (a History, or events as they come) against ``final``."""
    c = _Checker(final)
    events = history.events if isinstance(history, History) else history
    for ev in events:
        c.feed(ev)
    return c.result([*history.notes] if isinstance(history, History) else notes)


def check_files(histories: Iterable[Path | str], final: Path | str | FinalState) -> CheckResult:
    """The verdicts on history files, read a line at a time: the memory the check takes
    grows with the entries of the ledgers, not with the size of the history."""
    state = final if isinstance(final, FinalState) else FinalState.load(final)
    notes: list[str] = []
    c = _Checker(state)
    for ev in iter_history(histories, notes):
        c.feed(ev)
    return c.result(notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.checker",
                                 description="Judge a history of client operations against the final state.")
    ap.add_argument("history", nargs="+", type=Path, help="history files (JSON lines)")
    ap.add_argument("final_state", type=Path, help="the final state (JSON)")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON instead of a table")
    ap.add_argument("--all", action="store_true", help="list every counterexample, not the first five")
    args = ap.parse_args(argv)
    try:
        result = check_files(args.history, args.final_state)
    except (OSError, CorruptDataError) as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(result.table(limit=None if args.all else 5))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
