"""The history checker: reads a history and the final state (formats in history.py) and
gives a verdict, with counterexamples, on each property. It knows nothing of how the run
was made: processes, namespaces and faults are not its business.

    python -m tests.faults.checker HISTORY [HISTORY ...] FINAL_STATE [--json] [--all]

prints a table of verdicts and exits 1 if any is red (2 if an input cannot be read).

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbk.errors import EXIT_USAGE, CorruptDataError

from .history import Event, FinalLedger, FinalState, History, Seen

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
@dataclass(slots=True)
class _Op:
    invoke: Event
    done: Event | None = None

    @property
    def outcome(self) -> str:
        return "none" if self.done is None else self.done.type


@dataclass(frozen=True, slots=True)
class _Append:
    digest: str
    outcome: str  # ok, info or none (a fail claims no id)
    ref: str


@dataclass(slots=True)
class _View:
    ledger: int
    first: int | None
    seen: list[tuple[Seen, str]] = field(default_factory=list)  # in the order returned, with the op
    ended: str = ""  # the op whose tail step found the ledger closed and ended


def _indeterminate(outcome: str) -> bool:
    return outcome in ("info", "none")


class _Checker:
    def __init__(self, final: FinalState) -> None:
        self.final = final
        self.v = {name: Verdict(name, title) for name, title in PROPERTIES}
        self.notes: list[str] = []
        self.ops: dict[tuple[int, int], _Op] = {}  # in invoke order
        self.appends: dict[int, dict[int, _Append]] = {}  # ledger -> entry id -> the append claiming it
        self.written: set[int] = set()  # ledgers whose writer is in the history (a create or an append)
        self.views: dict[tuple[Any, ...], _View] = {}
        self.seen: dict[int, dict[int, dict[str, list[str]]]] = {}  # ledger -> entry -> digest -> ops
        self.closes: dict[int, list[tuple[int, str]]] = {}  # ledger -> (last entry, op) of each close seen
        self.lacs: dict[int, tuple[int, str]] = {}  # ledger -> the highest LAC seen, and where

    # -- pairing ---------------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        bad = self.v["history"]
        key = (ev.source, ev.op)
        if ev.type == "invoke":
            if key in self.ops:
                bad.add("invoked-twice", ev.ledger, None, f"a second invoke of the same op ({ev.kind})", ev.ref)
            else:
                self.ops[key] = _Op(ev)
            return
        o = self.ops.get(key)
        if o is None:
            bad.add("no-invoke", ev.ledger, None, f"a {ev.type} of {ev.kind} that was never invoked", ev.ref)
        elif o.done is not None:
            bad.add("completed-twice", ev.ledger, None, f"{ev.kind} completed as {o.done.type}, then {ev.type}",
                    ev.ref)
        elif (ev.kind, ev.process) != (o.invoke.kind, o.invoke.process):
            bad.add("mismatch", ev.ledger, None, f"invoked as {o.invoke.kind} by {o.invoke.process}, completed "
                    f"as {ev.kind} by {ev.process}", ev.ref)
        else:
            o.done = ev

    # -- what each operation tells ---------------------------------------------------------------
    def digest_ops(self) -> None:
        next_id: dict[int, int] = {}
        for key, o in self.ops.items():
            kind, done = o.invoke.kind, o.done
            self.v["history"].checked += 1
            if kind == "append":  # completed or not: one never completed is indeterminate
                self._append(o, next_id)
            elif done is None:
                continue
            elif kind in ("read", "tail"):
                self._observe(key, o)
            elif kind == "create" and done.type == "ok":
                if done.ledger is None:
                    self.v["history"].add("no-ledger", None, None, "a create confirmed without its ledger id",
                                          done.ref)
                else:
                    self.written.add(done.ledger)
            elif kind in ("read_lac", "open", "open_recover", "close") and done.type == "ok":
                self._bound(o)
        pending = sum(1 for o in self.ops.values() if o.done is None)
        if pending:
            self.notes.append(f"{pending} operation(s) never completed: judged indeterminate")

    def _append(self, o: _Op, next_id: dict[int, int]) -> None:
        inv, done, bad = o.invoke, o.done, self.v["history"]
        if inv.ledger is None or inv.digest is None:
            bad.add("bad-append", inv.ledger, inv.entry, "an append without its ledger or payload digest", inv.ref)
            return
        lid = inv.ledger
        self.written.add(lid)
        if o.outcome == "fail":
            return
        eid = inv.entry
        if done is not None and done.type == "ok" and done.entry is not None:
            if eid is not None and eid != done.entry:
                bad.add("renumbered", lid, eid, f"appended as entry {eid}, confirmed as entry {done.entry}",
                        inv.ref)
            eid = done.entry
        if eid is None:  # ids follow invocation order on a ledger (one writer)
            eid = next_id.get(lid, 0)
        next_id[lid] = max(next_id.get(lid, 0), eid + 1)
        mine = self.appends.setdefault(lid, {})
        other = mine.get(eid)
        if other is not None:
            bad.add("same-id", lid, eid, "two appends claim this entry id", other.ref, inv.ref)
            return
        mine[eid] = _Append(inv.digest, o.outcome, inv.ref)

    def _observe(self, key: tuple[int, int], o: _Op) -> None:
        inv, done = o.invoke, o.done
        assert done is not None
        if inv.ledger is None:
            self.v["history"].add("bad-read", None, None, f"a {inv.kind} without its ledger", inv.ref)
            return
        vkey: tuple[Any, ...] = ("view", inv.source, inv.view) if inv.kind == "tail" and inv.view else ("op", key)
        view = self.views.get(vkey)
        if view is None:
            view = self.views[vkey] = _View(inv.ledger, inv.first)
        elif view.ledger != inv.ledger:
            self.v["history"].add("bad-read", inv.ledger, None, f"tail view {inv.view!r} moved from ledger "
                                  f"{view.ledger} to ledger {inv.ledger}", inv.ref)
            return
        for s in done.entries or ():
            view.seen.append((s, done.ref))
            refs = self.seen.setdefault(inv.ledger, {}).setdefault(s.entry, {}).setdefault(s.digest, [])
            if len(refs) < REFS_PER_DIGEST:
                refs.append(done.ref)
        if done.type == "ok" and done.end:
            view.ended = done.ref

    def _bound(self, o: _Op) -> None:
        inv, done = o.invoke, o.done
        assert done is not None
        lid = done.ledger if done.ledger is not None else inv.ledger
        if lid is None or done.last is None:
            self.v["history"].add("bad-bound", lid, None, f"a {inv.kind} confirmed without its ledger or last entry",
                                  done.ref)
            return
        closing = inv.kind in ("open_recover", "close") or (inv.kind == "open" and bool(done.closed))
        if closing:
            self.closes.setdefault(lid, []).append((done.last, done.ref))
        elif done.last > self.lacs.get(lid, (-2, ""))[0]:
            self.lacs[lid] = (done.last, done.ref)

    # -- the properties ---------------------------------------------------------------------------
    def lost(self) -> None:
        v = self.v["lost"]
        v.unit = "acknowledged entries"
        for lid, mine in sorted(self.appends.items()):
            f = self.final.ledgers.get(lid)
            for eid, a in sorted(mine.items()):
                if a.outcome != "ok":
                    continue
                v.checked += 1
                if f is None:
                    v.add("ledger-missing", lid, eid, "acknowledged; the ledger is not in the final state", a.ref)
                elif f.closed and eid > f.last_entry:
                    v.add("beyond-close", lid, eid, f"acknowledged; the ledger closed at {f.last_entry}", a.ref)
                elif eid not in f.entries:
                    v.add("missing", lid, eid, "acknowledged; not read back after healing", a.ref)
                elif f.entries[eid] != a.digest:
                    v.add("changed", lid, eid, f"acknowledged with {a.digest[:12]}, read back as "
                          f"{f.entries[eid][:12]}", a.ref)

    def persistence(self) -> None:
        v = self.v["persistence"]
        v.unit = "closed ledgers"
        ledgers = set(self.appends) | set(self.closes) | set(self.lacs)
        unjudged = []
        for lid in sorted(ledgers):
            f = self.final.ledgers.get(lid)
            if f is None:
                continue  # its acknowledged entries are lost; nothing is closed to judge
            if not f.closed:
                for last, ref in self.closes.get(lid, ()):
                    v.add("reopened", lid, None, f"seen closed at {last}; not closed in the final state", ref)
                if any(a.outcome == "ok" for a in self.appends.get(lid, {}).values()):
                    unjudged.append(lid)
                continue
            v.checked += 1
            acked = [(eid, a) for eid, a in self.appends.get(lid, {}).items() if a.outcome == "ok"]
            if acked:
                top, a = max(acked, key=lambda t: t[0])
                if top > f.last_entry:
                    n = sum(1 for eid, _ in acked if eid > f.last_entry)
                    v.add("below-ack", lid, top, f"closed at {f.last_entry}, below acknowledged entry {top} "
                          f"({n} acknowledged entries beyond the close)", a.ref)
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
        for lid, entries in sorted(self.seen.items()):
            f = self.final.ledgers.get(lid)
            for eid, digests in sorted(entries.items()):
                v.checked += 1
                named = {d: list(refs) for d, refs in digests.items()}
                if f is not None and eid in f.entries:
                    named.setdefault(f.entries[eid], []).append("final state")
                if len(named) > 1:
                    text = "; ".join(f"{d[:12]} by {', '.join(refs)}" for d, refs in named.items())
                    v.add("two-payloads", lid, eid, f"read with {len(named)} payloads: {text}",
                          *(r for refs in named.values() for r in refs if r != "final state"))

    def prefix(self) -> None:
        v = self.v["prefix"]
        v.unit = "reader views"
        for view in self.views.values():
            v.checked += 1
            self._one_view(v, view, self.final.ledgers.get(view.ledger))

    def _one_view(self, v: Verdict, view: _View, f: FinalLedger | None) -> None:
        lid = view.ledger
        if f is None:
            if view.seen:
                s, ref = view.seen[0]
                v.add("phantom", lid, s.entry, "read from a ledger that is not in the final state", ref)
            return
        expected = view.first if view.first is not None else (view.seen[0][0].entry if view.seen else 0)
        start = expected
        order_bad = phantom_bad = False
        for i, (s, ref) in enumerate(view.seen):
            if s.entry != expected and not order_bad:
                order_bad = True
                v.add("reordered", lid, s.entry, f"position {i} of a view from {start} is entry {s.entry}, "
                      f"expected {expected}", ref)
            expected = s.entry + 1
            if phantom_bad:
                continue
            if f.closed and s.entry > f.last_entry:
                phantom_bad = True
                v.add("phantom", lid, s.entry, f"read; the ledger closed at {f.last_entry}", ref)
            elif s.entry in f.entries and f.entries[s.entry] != s.digest:
                phantom_bad = True
                v.add("phantom", lid, s.entry, f"read as {s.digest[:12]}; the final ledger holds "
                      f"{f.entries[s.entry][:12]} there", ref)
            elif s.entry not in f.entries and s.entry <= f.last_entry:
                phantom_bad = True
                v.add("absent", lid, s.entry, "read; not read back after healing", ref)
        if view.ended and f.closed:
            end = view.seen[-1][0].entry if view.seen else start - 1
            if end < f.last_entry:
                v.add("ended-short", lid, end, f"a tail from {start} ended at the close after entry {end}; the "
                      f"ledger closed at {f.last_entry}", view.ended)

    def indeterminate(self) -> None:
        v = self.v["indeterminate"]
        v.unit = "indeterminate adds"
        for lid in sorted(self.written):
            mine = self.appends.get(lid, {})
            v.checked += sum(1 for a in mine.values() if _indeterminate(a.outcome))
            f = self.final.ledgers.get(lid)
            if f is None:
                continue
            present = sorted(f.entries)
            # The first present appended id after each appended id (ids of one writer are dense).
            later: dict[int, int] = {}
            nxt: int | None = None
            for eid in sorted(mine, reverse=True):
                if nxt is not None:
                    later[eid] = nxt
                if eid in f.entries:
                    nxt = eid
            for eid, a in sorted(mine.items()):
                if not _indeterminate(a.outcome):
                    continue
                if eid in f.entries:
                    if f.entries[eid] != a.digest:
                        v.add("wrong-payload", lid, eid, f"an indeterminate add of {a.digest[:12]} is present as "
                              f"{f.entries[eid][:12]}", a.ref)
                elif eid in later:
                    k = later[eid]
                    v.add("out-of-order", lid, eid, f"an indeterminate add is absent while entry {k} "
                          f"({mine[k].outcome}) after it is present", a.ref, mine[k].ref)
            top = max(mine, default=-1)
            stray = [e for e in present if e not in mine]
            if stray:
                v.add("never-appended", lid, stray[0], f"{len(stray)} entr{'y' if len(stray) == 1 else 'ies'} "
                      f"present that no append claimed ({_few(stray)})")
            if f.closed and f.last_entry > top:
                v.add("closed-beyond", lid, f.last_entry, f"closed at {f.last_entry}; appends reached entry {top}")

    def result(self, notes: Iterable[str] = ()) -> CheckResult:
        self.v["history"].unit = "operations"
        self.digest_ops()
        self.lost()
        self.persistence()
        self.divergent()
        self.prefix()
        self.indeterminate()
        missing = sorted(lid for lid in self.written | set(self.seen) if lid not in self.final.ledgers)
        if missing:
            self.notes.append(f"{len(missing)} ledger(s) of the history not in the final state: {_few(missing)}")
        return CheckResult(self.v, list(notes) + self.notes)


def _few(ids: list[int], n: int = 8) -> str:
    return ", ".join(map(str, ids[:n])) + (", ..." if len(ids) > n else "")


def check(history: History | Iterable[Event], final: FinalState) -> CheckResult:
    """Every verdict for ``history`` against ``final``."""
    c = _Checker(final)
    events = history.events if isinstance(history, History) else history
    for ev in events:
        c.feed(ev)
    return c.result(history.notes if isinstance(history, History) else ())


def check_files(histories: Iterable[Path | str], final: Path | str) -> CheckResult:
    return check(History.load(histories), FinalState.load(final))


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
