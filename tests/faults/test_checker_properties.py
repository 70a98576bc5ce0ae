"""The checker against random runs (hypothesis): every valid history is green, and one
mutation of the final state that loses an acknowledged entry is always red, naming it.

A valid run: each ledger's writer appends ids 0..n-1 (pipelined; completions in order, some
appends refused before being sent), the first ``acked`` are acknowledged and the rest are
indeterminate (a timeout, or never completed); the ledger ends at some ``close`` with
``acked - 1 <= close < n``, holding exactly what was sent for 0..close. Readers read ranges
and tail up to the close, see LACs no higher, and recoverers close it there. The events of
all clients interleave at random.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .checker import check
from .history import FinalLedger, FinalState, History, HistoryRecorder, Op, digest
from .script import pl

Step = Callable[[], None]


@dataclass(frozen=True)
class Plan:
    ledger: int
    n: int  # ids 0..n-1 appended
    acked: int  # 0..acked-1 acknowledged
    fates: tuple[str, ...]  # "info" or "none" for ids acked..n-1
    refused: frozenset[int]  # before appending id k, one append is refused (fail, no id)
    close: int
    closed: bool


@st.composite
def plans(draw: st.DrawFn, ledger: int) -> Plan:
    n = draw(st.integers(0, 12))
    acked = draw(st.integers(0, n))
    fates = tuple(draw(st.lists(st.sampled_from(["info", "none"]), min_size=n - acked, max_size=n - acked)))
    refused = frozenset(draw(st.lists(st.integers(0, n), max_size=2)))
    close = draw(st.integers(acked - 1, n - 1)) if n else -1
    return Plan(ledger, n, acked, fates, refused, close, draw(st.booleans()))


@dataclass
class Run:
    text: str
    final: FinalState
    plans: list[Plan]

    def history(self) -> History:
        return History.parse(self.text)


def _writer(rec: HistoryRecorder, p: Plan, rng: random.Random) -> list[Step]:
    """The writer's events: its create, then its appends' invokes and completions, merged at
    random with each completion after its invoke and completions in invoke order."""
    proc = f"w{p.ledger}"
    ops: dict[int, Op] = {}
    created: list[Op] = []

    def invoke(k: int) -> None:
        ops[k] = rec.invoke(proc, "append", ledger=p.ledger, entry=k, payload=pl(p.ledger, k))

    def refuse(k: int) -> None:  # refused before it took an id: the next append takes k
        op = rec.invoke(proc, "append", ledger=p.ledger, entry=k, payload=pl(p.ledger, k, 7))
        rec.fail(op, "ZbkError: more adds pending than allowed")

    def complete(k: int) -> None:
        if k < p.acked:
            rec.ok(ops[k], entry=k)
        else:
            rec.info(ops[k], "ZbkTimeoutError: no answer")

    steps: list[Step] = [lambda: created.append(rec.invoke(proc, "create")),
                         lambda: rec.ok(created[0], ledger=p.ledger)]
    pending = [k for k in range(p.n) if k < p.acked or p.fates[k - p.acked] == "info"]  # "none": never completes
    for k in range(p.n + 1):
        if k in p.refused:
            steps.append(partial(refuse, k))
        if k == p.n:
            break
        steps.append(partial(invoke, k))
        while pending and pending[0] <= k and rng.random() < 0.5:
            steps.append(partial(complete, pending.pop(0)))
    steps += [partial(complete, k) for k in pending]
    return steps


def _readers(rec: HistoryRecorder, p: Plan, rng: random.Random) -> list[list[Step]]:
    """Some reads, tails, LAC reads and closes of the plan's ledger, each client one list."""
    lid, top = p.ledger, p.close
    clients: list[list[Step]] = []
    for i in range(rng.randint(0, 3)):
        proc = f"r{lid}.{i}"
        steps: list[Step] = []
        for _ in range(rng.randint(1, 3)):
            what = rng.choice(["read", "tail", "lac", "recover", "open"])
            if what == "read" and top >= 0:
                first = rng.randint(0, top)
                last = rng.randint(first, top)
                outcome = rng.choice(["ok", "ok", "info", "fail"])
                upto = last if outcome == "ok" else rng.randint(first - 1, last)
                steps.append(partial(_read, rec, proc, lid, first, last, upto, outcome))
            elif what == "tail":
                first = rng.randint(0, top + 1)
                end = p.closed and rng.random() < 0.5
                upto = top if end else rng.randint(first - 1, top)
                view = f"{proc}/{len(steps)}"
                steps.append(partial(_tail, rec, proc, lid, view, first, upto, end))
            elif what == "lac":
                lac = rng.randint(-1, top)
                steps.append(partial(_bound, rec, proc, lid, "read_lac", lac, None))
            elif what == "recover" and p.closed:
                steps.append(partial(_bound, rec, proc, lid, "open_recover", top, True))
            elif what == "open":
                closed = p.closed and rng.random() < 0.5
                last = top if closed else rng.randint(-1, top)
                steps.append(partial(_bound, rec, proc, lid, "open", last, closed))
        clients.append(steps)
    return clients


def _bound(rec: HistoryRecorder, proc: str, lid: int, kind: str, last: int, closed: bool | None) -> None:
    rec.ok(rec.invoke(proc, kind, ledger=lid), last=last, closed=closed)


def _read(rec: HistoryRecorder, proc: str, lid: int, first: int, last: int, upto: int, outcome: str) -> None:
    op = rec.invoke(proc, "read", ledger=lid, first=first, last=last)
    got = [(e, pl(lid, e)) for e in range(first, upto + 1)]
    if outcome == "ok":
        rec.ok(op, entries=got)
    elif outcome == "info":
        rec.info(op, "ZbkTimeoutError: no answer", entries=got)
    else:
        rec.fail(op, "BookieUnavailableError: gone", entries=got)


def _tail(rec: HistoryRecorder, proc: str, lid: int, view: str, first: int, upto: int, end: bool) -> None:
    for e in range(first, upto + 1):
        rec.ok(rec.invoke(proc, "tail", ledger=lid, first=e, view=view), entries=[(e, pl(lid, e))])
    if end:
        rec.ok(rec.invoke(proc, "tail", ledger=lid, first=max(first, upto + 1), view=view), entries=[], end=True)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    ps = [draw(plans(lid)) for lid in range(1, draw(st.integers(1, 3)) + 1)]
    rng = draw(st.randoms(use_true_random=False))
    buf = io.StringIO()
    rec = HistoryRecorder(buf)
    clients: list[list[Step]] = []
    for p in ps:
        clients.append(_writer(rec, p, rng))
        clients += _readers(rec, p, rng)
    clients = [c for c in clients if c]
    while clients:  # interleave the clients' events at random, each client's in its order
        c = rng.choice(clients)
        c.pop(0)()
        if not c:
            clients.remove(c)
    final = FinalState({p.ledger: FinalLedger(p.closed, p.close, {e: digest(pl(p.ledger, e))
                                                                  for e in range(p.close + 1)})
                        for p in ps})
    return Run(buf.getvalue(), final, ps)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(runs())
def test_every_valid_history_is_green(run: Run) -> None:
    result = check(run.history(), run.final)
    assert result.ok, result.table()


@st.composite
def with_an_ack(draw: st.DrawFn) -> tuple[Run, int, int]:
    """A run with at least one acknowledged entry, and one of them: (run, ledger, entry)."""
    run = draw(runs().filter(lambda r: any(p.acked for p in r.plans)))
    p = draw(st.sampled_from([p for p in run.plans if p.acked]))
    return run, p.ledger, draw(st.integers(0, p.acked - 1))


def _mutated(run: Run, lid: int, change: Callable[[FinalLedger], FinalLedger]) -> FinalState:
    return FinalState({k: change(f) if k == lid else f for k, f in run.final.ledgers.items()})


@SETTINGS
@given(with_an_ack())
def test_dropping_an_acknowledged_entry_is_always_red(case: tuple[Run, int, int]) -> None:
    run, lid, e = case
    final = _mutated(run, lid, lambda f: FinalLedger(f.closed, f.last_entry,
                                                     {k: d for k, d in f.entries.items() if k != e}))
    result = check(run.history(), final)
    assert ("missing", lid, e) in [(c.kind, c.ledger, c.entry) for c in result["lost"].counterexamples]


@SETTINGS
@given(with_an_ack())
def test_changing_an_acknowledged_entry_is_always_red(case: tuple[Run, int, int]) -> None:
    run, lid, e = case
    final = _mutated(run, lid, lambda f: FinalLedger(f.closed, f.last_entry,
                                                     {**f.entries, e: digest(pl(lid, e, 1))}))
    result = check(run.history(), final)
    assert ("changed", lid, e) in [(c.kind, c.ledger, c.entry) for c in result["lost"].counterexamples]


@SETTINGS
@given(with_an_ack())
def test_closing_below_an_acknowledged_entry_is_always_red(case: tuple[Run, int, int]) -> None:
    run, lid, e = case
    final = _mutated(run, lid, lambda f: FinalLedger(True, e - 1, {k: d for k, d in f.entries.items() if k < e}))
    result = check(run.history(), final)
    assert "below-ack" in result["persistence"].kinds()
    assert ("beyond-close", lid, e) in [(c.kind, c.ledger, c.entry) for c in result["lost"].counterexamples]
