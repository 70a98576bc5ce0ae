"""The checker reads history files a line at a time: the memory a check takes grows with
the entries of the ledgers (a few dozen bytes each), not with the size of the history, so
the history of a 30-minute chaos run (several hundred megabytes) is checked in bounded
memory.

The history here is what a chaos run writes, scaled down: writers append (each append an
invoke and an ok), a tailing reader yields every entry (two more lines each), ledgers are
closed; about 500 bytes of history an entry."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

from .checker import CheckResult, check_files
from .history import Digests, FinalLedger, FinalState, HistoryRecorder, digest, scan_ledgers

LEDGERS = 20
ENTRIES = 1500  # per ledger: 30,000 entries in all


def payload(lid: int, eid: int) -> bytes:
    return hashlib.sha512(f"{lid}/{eid}".encode()).digest()


def write_run(path: Path) -> FinalState:
    """The history of a run to ``path``; the final state it should be judged against."""
    final = FinalState()
    with HistoryRecorder(path) as rec:
        for lid in range(1, LEDGERS + 1):
            rec.ok(rec.invoke("w", "create"), ledger=lid)
            for eid in range(ENTRIES):
                rec.ok(rec.invoke("w", "append", ledger=lid, entry=eid, payload=payload(lid, eid)), entry=eid)
                rec.ok(rec.invoke("r", "tail", ledger=lid, first=eid, view=f"r/{lid}"),
                       entries=[(eid, payload(lid, eid))])
            rec.ok(rec.invoke("w", "close", ledger=lid), last=ENTRIES - 1)
            final.ledgers[lid] = FinalLedger(True, ENTRIES - 1,
                                             Digests({e: digest(payload(lid, e)) for e in range(ENTRIES)}))
    return final


def checked_in(histories: list[Path], final: Path) -> tuple[CheckResult, int]:
    """The result, and the peak of memory that Python allocated while checking."""
    tracemalloc.start()
    try:
        result = check_files(histories, final)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_history_is_checked_a_line_at_a_time_in_bounded_memory(tmp_path: Path) -> None:
    history, final_path = tmp_path / "history.jsonl", tmp_path / "final.json"
    final = write_run(history)
    final.save(final_path)
    size = history.stat().st_size
    assert size > 12_000_000, size
    assert scan_ledgers([history]) == set(range(1, LEDGERS + 1))

    result, peak = checked_in([history], final_path)
    assert result.ok, result.table()
    entries = LEDGERS * ENTRIES
    assert result["lost"].checked == entries and result["divergent"].checked == entries
    assert result["prefix"].checked == LEDGERS and result["persistence"].checked == LEDGERS
    # The history is never held: what is kept is the final state's digests (32 bytes an
    # entry) and some 40 bytes an entry of the checker's own (what each append claimed and
    # which reads agreed), far below the file's size (a history held as events would take
    # several times the file).
    assert peak < 120 * entries, f"peak {peak:,} bytes for a history of {size:,} bytes"
    assert peak < size / 5, f"peak {peak:,} bytes for a history of {size:,} bytes"

    # Streamed, it still sees everything: one acknowledged entry gone from the final state
    # deep into the file is red, with its place.
    lid, eid = LEDGERS - 3, ENTRIES // 2
    f = final.ledgers[lid]
    final.ledgers[lid] = FinalLedger(True, f.last_entry, Digests({e: d for e, d in f.entries.items() if e != eid}))
    final.save(final_path)
    result, _ = checked_in([history], final_path)
    assert result.red() == ["lost", "prefix"], result.table()
    assert [(c.kind, c.ledger, c.entry) for c in result["lost"].counterexamples] == [("missing", lid, eid)]


def test_digests_pack_dense_ids_and_keep_the_others() -> None:
    d = {e: digest(bytes([e % 256])) for e in range(10)} | {-1: digest(b"neg"), 10**9: digest(b"far")}
    packed = Digests(d)
    assert dict(packed) == d and len(packed) == len(d) and packed == d
    assert list(packed) == sorted(d)
    assert 5 in packed and 11 not in packed and 10**9 in packed and "5" not in packed
