"""The checker on histories written by hand: each way a run can go wrong is reported red on
the right property with the right counterexample, and clean runs (indeterminate adds absent,
or present in order) are green on every property."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zbk.errors import CorruptDataError

from .checker import CheckResult, check, main
from .history import FinalLedger, FinalState, History, digest
from .script import Script, final, final_ledger, pl


def red(result: CheckResult) -> list[str]:
    return result.red()


def only(result: CheckResult, name: str) -> list[tuple[str, int | None, int | None]]:
    """The counterexamples of one property as (kind, ledger, entry)."""
    return [(c.kind, c.ledger, c.entry) for c in result[name].counterexamples]


def healthy_run() -> Script:
    """w1 writes ledger 1: entries 0..4 acknowledged, 5 and 6 indeterminate (a timeout, and
    one never completed); a reader reads 0..3, a tail follows 0..4, the writer's LAC reads
    say 4, and a recoverer closes the ledger at 4 (5 and 6 never landed)."""
    s = Script()
    s.create("w1", 1)
    s.appends("w1", 1, range(5))
    s.append("w1", 1, 5, outcome="info")
    s.append("w1", 1, 6, outcome="none")
    s.read("r1", 1, 0, 3, range(4))
    s.bound("r1", 1, "read_lac", 4)
    s.tail("r2", 1, "r2/0", 0, range(5), end=True)
    s.bound("rec", 1, "open_recover", 4, closed=True)
    s.bound("r1", 1, "open", 4, closed=True)
    return s


def test_a_clean_run_is_green_on_every_property() -> None:
    result = check(healthy_run().history(), final(l1=final_ledger(4)))
    assert result.ok, result.table()
    assert list(result.verdicts) == ["history", "lost", "persistence", "divergent", "prefix", "indeterminate"]
    assert result["lost"].checked == 5
    assert result["persistence"].checked == 1
    assert result["divergent"].checked == 5
    assert result["prefix"].checked == 2
    assert result["indeterminate"].checked == 2
    assert any("never completed" in n for n in result.notes)


def test_indeterminate_adds_present_in_order_are_green() -> None:
    """The recovery found entry 5 (a timed-out add) and 6 (never completed): both present,
    in order, with the payloads sent; a reader after the close sees them too."""
    s2 = Script()
    s2.create("w1", 1)
    s2.appends("w1", 1, range(5))
    s2.append("w1", 1, 5, outcome="info")
    s2.append("w1", 1, 6, outcome="none")
    s2.append("w1", 1, 7, outcome="info")
    s2.bound("rec", 1, "open_recover", 6, closed=True)
    s2.read("r3", 1, 0, 6, range(7))
    s2.tail("r2", 1, "r2/0", 3, range(3, 7), end=True)
    result = check(s2.history(), final(l1=final_ledger(6)))
    assert result.ok, result.table()


def test_a_failed_append_claims_no_id() -> None:
    """An append refused before it was sent does not consume its id: the next append takes
    it, with another payload, and that is no conflict."""
    s = Script()
    s.appends("w1", 1, range(3))
    s.append("w1", 1, 3, pl(1, 3, variant=9), outcome="fail")
    s.append("w1", 1, 3)
    result = check(s.history(), final(l1=final_ledger(3)))
    assert result.ok, result.table()


def test_a_lost_acknowledgement_is_red() -> None:
    s = healthy_run()
    fl = final_ledger(4, {e: pl(1, e) for e in (0, 1, 3, 4)})
    result = check(s.history(), final(l1=fl))
    assert "lost" in red(result)
    assert only(result, "lost") == [("missing", 1, 2)]
    assert result["lost"].counterexamples[0].ops == ("op 3",)  # the append of entry 2 (op 0 is the create)


def test_a_changed_acknowledged_entry_is_red() -> None:
    s = healthy_run()
    entries = {e: pl(1, e) for e in range(5)}
    entries[3] = pl(1, 3, variant=1)
    result = check(s.history(), final(l1=final_ledger(4, entries)))
    assert only(result, "lost") == [("changed", 1, 3)]
    # The reader that read entry 3 before saw other bytes: the entry diverged too.
    assert only(result, "divergent") == [("two-payloads", 1, 3)]
    assert ("phantom", 1, 3) in only(result, "prefix")


def test_a_closed_ledger_ending_below_an_ack_is_red() -> None:
    """The seeds' scenario without fencing: the writer's entries 3 and 4 were acknowledged,
    and the recoverer closed the ledger at 2."""
    s = Script()
    s.appends("w1", 1, range(5))
    s.bound("rec", 1, "open_recover", 2, closed=True)
    result = check(s.history(), final(l1=final_ledger(2)))
    assert only(result, "persistence") == [("below-ack", 1, 4)]
    assert "2 acknowledged entries beyond the close" in result["persistence"].counterexamples[0].detail
    assert only(result, "lost") == [("beyond-close", 1, 3), ("beyond-close", 1, 4)]


def test_a_lac_beyond_the_close_and_a_second_close_are_red() -> None:
    s = Script()
    s.appends("w1", 1, range(3))
    s.bound("r1", 1, "read_lac", 5)  # no ack is beyond the close, but a reader was told 5 was confirmed
    s.bound("w1", 1, "close", 2)
    s.bound("rec", 1, "open_recover", 1, closed=True)
    result = check(s.history(), final(l1=final_ledger(2)))
    assert red(result) == ["persistence"]
    assert only(result, "persistence") == [("below-lac", 1, 5), ("closed-twice", 1, None)]


def test_a_ledger_closed_then_found_open_is_red() -> None:
    s = Script()
    s.appends("w1", 1, range(3))
    s.bound("w1", 1, "close", 2)
    result = check(s.history(), final(l1=final_ledger(2, closed=False)))
    assert only(result, "persistence") == [("reopened", 1, None)]


def test_a_phantom_entry_is_red() -> None:
    """A tail was given entry 5 of a ledger that closed at 4."""
    s = healthy_run()
    s.tail("r3", 1, "r3/0", 3, range(3, 6))
    result = check(s.history(), final(l1=final_ledger(4)))
    assert red(result) == ["prefix"]
    assert only(result, "prefix") == [("phantom", 1, 5)]
    assert result["prefix"].counterexamples[0].ops  # names the tail step


def test_a_phantom_payload_at_a_position_is_red() -> None:
    """A read returned an entry 2 whose bytes no writer sent and the final ledger lacks."""
    s = healthy_run()
    s.read("r3", 1, 0, 2, [(0, pl(1, 0)), (1, pl(1, 1)), (2, b"never written")])
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "prefix") == [("phantom", 1, 2)]
    assert only(result, "divergent") == [("two-payloads", 1, 2)]


def test_a_reordered_read_is_red() -> None:
    s = healthy_run()
    s.read("r3", 1, 0, 3, [(e, pl(1, e)) for e in (0, 2, 1, 3)])
    result = check(s.history(), final(l1=final_ledger(4)))
    assert red(result) == ["prefix"]
    assert only(result, "prefix") == [("reordered", 1, 2)]
    assert "position 1" in result["prefix"].counterexamples[0].detail


def test_a_tail_that_skips_an_entry_is_red() -> None:
    s = healthy_run()
    s.tail("r3", 1, "r3/0", 0, [(e, pl(1, e)) for e in (0, 1, 3, 4)], end=True)
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "prefix") == [("reordered", 1, 3)]


def test_a_tail_that_ends_before_the_close_is_red() -> None:
    s = healthy_run()
    s.tail("r3", 1, "r3/0", 0, range(3), end=True)
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "prefix") == [("ended-short", 1, 2)]


def test_an_entry_read_back_missing_after_a_reader_saw_it_is_red() -> None:
    s = Script()
    s.appends("w1", 1, range(3))
    s.append("w1", 1, 3, outcome="info")
    s.read("r1", 1, 0, 3, range(4))  # after a recovery that kept the indeterminate entry 3
    fl = final_ledger(3, {e: pl(1, e) for e in range(3)})  # ...which cannot be read back now
    result = check(s.history(), final(l1=fl))
    assert only(result, "prefix") == [("absent", 1, 3)]


def test_a_divergent_read_is_red() -> None:
    """Two readers were given different bytes for entry 1: reported with both reads, even
    though neither the final state nor the ack contradicts the first."""
    s = healthy_run()
    first = s.read("r3", 1, 1, 1, [(1, pl(1, 1))])
    second = s.read("r4", 1, 1, 1, [(1, pl(1, 1, variant=2))])
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "divergent") == [("two-payloads", 1, 1)]
    ops = result["divergent"].counterexamples[0].ops
    assert f"op {first.id}" in ops and f"op {second.id}" in ops
    assert "final state" in result["divergent"].counterexamples[0].detail


def test_entries_of_a_failed_read_count_as_seen() -> None:
    s = healthy_run()
    s.read("r3", 1, 0, 4, [(0, pl(1, 0)), (1, pl(1, 1, variant=3))], outcome="info")
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "divergent") == [("two-payloads", 1, 1)]


def test_an_out_of_order_indeterminate_add_is_red() -> None:
    """Entries 3, 4 and 5 timed out; the final ledger holds 4 but not 3."""
    s = Script()
    s.appends("w1", 1, range(3))
    s.appends("w1", 1, range(3, 6), outcome="info")
    fl = final_ledger(4, {e: pl(1, e) for e in (0, 1, 2, 4)})
    result = check(s.history(), final(l1=fl))
    assert red(result) == ["indeterminate"]
    assert only(result, "indeterminate") == [("out-of-order", 1, 3)]
    assert "entry 4 (info)" in result["indeterminate"].counterexamples[0].detail


def test_an_indeterminate_add_present_with_other_bytes_is_red() -> None:
    s = Script()
    s.appends("w1", 1, range(3))
    s.append("w1", 1, 3, outcome="none")
    entries = {e: pl(1, e) for e in range(3)} | {3: pl(1, 3, variant=5)}
    result = check(s.history(), final(l1=final_ledger(3, entries)))
    assert only(result, "indeterminate") == [("wrong-payload", 1, 3)]


def test_entries_nobody_appended_are_red() -> None:
    s = Script()
    s.create("w1", 1)
    s.appends("w1", 1, range(3))
    result = check(s.history(), final(l1=final_ledger(4)))
    assert only(result, "indeterminate") == [("never-appended", 1, 3), ("closed-beyond", 1, 4)]
    # A ledger created in the history and never appended to must close empty.
    s2 = Script()
    s2.create("w1", 1)
    assert only(check(s2.history(), final(l1=final_ledger(0))), "indeterminate") == [
        ("never-appended", 1, 0), ("closed-beyond", 1, 0)]
    assert check(s2.history(), final(l1=final_ledger(-1))).ok


def test_a_ledger_gone_from_the_final_state_loses_its_acks() -> None:
    s = healthy_run()
    result = check(s.history(), FinalState())
    assert only(result, "lost") == [("ledger-missing", 1, e) for e in range(5)]
    assert ("phantom", 1, 0) in only(result, "prefix")
    assert any("not in the final state" in n for n in result.notes)


def test_an_open_ledger_is_not_judged_for_persistence_and_says_so() -> None:
    s = Script()
    s.appends("w1", 1, range(3))
    result = check(s.history(), final(l1=final_ledger(2, closed=False)))
    assert result.ok
    assert result["persistence"].checked == 0
    assert any("persistence not judged" in n for n in result.notes)


def test_malformed_histories_are_red() -> None:
    s = Script()
    s.appends("w1", 1, range(2))
    s.append("w1", 1, 1, pl(1, 1, variant=1))  # a second append claims entry 1
    s.append("w1", 1, 2, confirmed=3)  # appended as 2, confirmed as 3
    text = s.buf.getvalue()
    stray = {"type": "ok", "op": 99, "process": "w1", "kind": "append", "time": 1.0, "ledger": 1, "entry": 7}
    again = json.loads(text.splitlines()[1])  # the ok of op 0, a second time
    text += json.dumps(stray) + "\n" + json.dumps(again) + "\n"
    result = check(History.parse(text), final(l1=final_ledger(3)))
    kinds = [c.kind for c in result["history"].counterexamples]
    assert kinds == ["no-invoke", "completed-twice", "same-id", "renumbered"]


def test_histories_from_several_files_keep_their_op_ids_apart() -> None:
    a, b = Script(), Script()
    a.appends("w1", 1, range(3))
    b.appends("w2", 2, range(2))
    b.read("r2", 1, 0, 5, [(0, pl(1, 0)), (1, b"other")])
    result = check(History.parse(a.buf.getvalue(), b.buf.getvalue()),
                   final(l1=final_ledger(2), l2=final_ledger(1, ledger=2)))
    assert red(result) == ["divergent", "prefix"]
    assert result["divergent"].counterexamples[0].ops == ("op 1:2",)


# -- the files -------------------------------------------------------------------------------------
def test_a_torn_last_line_is_dropped_with_a_note(tmp_path: Path) -> None:
    s = healthy_run()
    path = tmp_path / "h.jsonl"
    path.write_text(s.buf.getvalue() + '{"type":"invoke","op":50,"proc')
    h = History.load([path])
    assert len(h.events) == len(s.history().events)
    assert h.notes and "torn last line" in h.notes[0]


def test_a_bad_line_in_the_middle_is_a_typed_error(tmp_path: Path) -> None:
    lines = healthy_run().buf.getvalue().splitlines(keepends=True)
    lines[3] = lines[3].replace('"entry":', '"entry":"x",' + '"e":')
    path = tmp_path / "h.jsonl"
    path.write_text("".join(lines))
    with pytest.raises(CorruptDataError, match="history line 4") as err:
        History.load([path])
    assert err.value.offset == sum(len(x.encode()) for x in lines[:3])
    assert err.value.path == str(path)


def test_the_final_state_round_trips_and_refuses_entries_past_a_close(tmp_path: Path) -> None:
    st = final(l1=final_ledger(4), l2=final_ledger(1, closed=False, ledger=2))
    st.save(tmp_path / "f.json")
    assert FinalState.load(tmp_path / "f.json") == st
    bad = {"ledgers": {"1": {"closed": True, "last_entry": 0, "entries": {"0": digest(b"a"), "1": digest(b"b")}}}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CorruptDataError, match="beyond"):
        FinalState.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text('{"ledgers": {"1": {"closed": "yes", "last_entry": 0}}}')
    with pytest.raises(CorruptDataError, match="closed"):
        FinalState.load(tmp_path / "bad.json")


def test_the_command_line_prints_the_table_and_exits_by_the_verdict(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "h.jsonl"
    hist.write_text(healthy_run().buf.getvalue())
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    final(l1=final_ledger(4)).save(good)
    FinalState({1: FinalLedger(True, 4, {e: digest(pl(1, e)) for e in (0, 1, 3, 4)})}).save(bad)
    assert main([str(hist), str(good)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["property", "verdict"]
    assert "RED" not in out
    assert main([str(hist), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "lost           RED" in out
    assert "ledger 1 entry 2: missing" in out
    assert main([str(hist), str(bad), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["verdicts"]["lost"]["counterexamples"][0]["entry"] == 2
    assert main([str(tmp_path / "absent.jsonl"), str(good)]) == 2
