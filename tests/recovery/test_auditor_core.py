"""AuditorCore decisions, driven by a fake clock: delay, cancel on return, read-only is
not lost, a delay change reschedules pending audits, a new leader audits dead bookies."""

from __future__ import annotations

from zbk.clock import FakeClock
from zbk.recovery.auditor import AuditorCore

ALL = {"a:1", "b:1", "c:1"}


def test_delay_zero_audits_at_once() -> None:
    clock = FakeClock()
    core = AuditorCore(0.0)
    core.observe(ALL, clock.monotonic())
    assert core.due(clock.monotonic()) == []
    core.observe(ALL - {"b:1"}, clock.monotonic())
    assert core.due(clock.monotonic()) == ["b:1"]
    assert core.due(clock.monotonic()) == [], "a bookie is audited once per loss"
    assert core.lost_count == 1


def test_audit_waits_for_the_delay() -> None:
    clock = FakeClock()
    core = AuditorCore(10.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"b:1"}, clock.monotonic())
    clock.advance(9.9)
    assert core.due(clock.monotonic()) == []
    nxt = core.next_due()
    assert nxt is not None and abs(nxt - (clock.monotonic() + 0.1)) < 1e-6
    assert core.lost_count == 1  # pending counts as lost for the gauge
    clock.advance(0.1)
    assert core.due(clock.monotonic()) == ["b:1"]


def test_bookie_back_before_the_delay_is_not_audited() -> None:
    clock = FakeClock()
    core = AuditorCore(10.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"b:1"}, clock.monotonic())
    clock.advance(5)
    core.observe(ALL, clock.monotonic())
    clock.advance(60)
    assert core.due(clock.monotonic()) == []
    assert core.lost_count == 0 and core.next_due() is None


def test_a_second_loss_restarts_the_delay() -> None:
    clock = FakeClock()
    core = AuditorCore(10.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"b:1"}, clock.monotonic())
    clock.advance(8)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"b:1"}, clock.monotonic())
    clock.advance(8)
    assert core.due(clock.monotonic()) == [], "the delay counts from the latest disappearance"
    clock.advance(2)
    assert core.due(clock.monotonic()) == ["b:1"]


def test_read_only_bookie_is_not_lost() -> None:
    # The caller passes writable | readonly: a bookie moving to read-only stays available.
    clock = FakeClock()
    core = AuditorCore(0.0)
    writable, readonly = {"a:1", "b:1"}, {"c:1"}
    core.observe(ALL, clock.monotonic())
    core.observe(writable | readonly, clock.monotonic())
    assert core.due(clock.monotonic()) == [] and core.lost_count == 0


def test_delay_change_reschedules_pending_audits() -> None:
    clock = FakeClock()
    core = AuditorCore(60.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"b:1"}, clock.monotonic())
    clock.advance(5)
    core.observe(ALL - {"b:1", "c:1"}, clock.monotonic())
    clock.advance(1)
    assert core.due(clock.monotonic()) == []
    core.set_delay(5.5)  # b gone 6 s ago: due now; c gone 1 s ago: due in 4.5 s
    assert core.due(clock.monotonic()) == ["b:1"]
    clock.advance(4.4)
    assert core.due(clock.monotonic()) == []
    clock.advance(0.1)
    assert core.due(clock.monotonic()) == ["c:1"]
    core.set_delay(100.0)  # a longer delay does not revive audits already done
    assert core.lost_count == 2


def test_longer_delay_postpones() -> None:
    clock = FakeClock()
    core = AuditorCore(5.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"a:1"}, clock.monotonic())
    clock.advance(4)
    core.set_delay(30.0)
    clock.advance(2)
    assert core.due(clock.monotonic()) == []
    clock.advance(24)
    assert core.due(clock.monotonic()) == ["a:1"]


def test_new_leader_counts_unregistered_referenced_bookies_as_gone() -> None:
    clock = FakeClock()
    core = AuditorCore(0.0)
    core.observe({"a:1", "b:1"}, clock.monotonic(), referenced={"a:1", "b:1", "dead:1"})
    assert core.due(clock.monotonic()) == ["dead:1"]


def test_returning_lost_bookie_stops_counting_and_a_new_loss_audits_again() -> None:
    clock = FakeClock()
    core = AuditorCore(0.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"a:1"}, clock.monotonic())
    assert core.due(clock.monotonic()) == ["a:1"]
    core.observe(ALL, clock.monotonic())
    assert core.lost_count == 0
    core.observe(ALL - {"a:1"}, clock.monotonic())
    assert core.due(clock.monotonic()) == ["a:1"]


def test_failed_audit_is_retried_and_empty_audit_forgotten() -> None:
    clock = FakeClock()
    core = AuditorCore(30.0)
    core.observe(ALL, clock.monotonic())
    core.observe(ALL - {"a:1", "b:1"}, clock.monotonic())
    clock.advance(30)
    assert core.due(clock.monotonic()) == ["a:1", "b:1"]
    core.retry("a:1", clock.monotonic())
    core.forget("b:1")
    assert core.due(clock.monotonic()) == ["a:1"]
    assert core.lost_count == 1
