"""EmbeddedAutoRecovery's watch, with a stand-in for AutoRecovery (the parts themselves run
against real bookies in test_embedded_e2e.py and test_checks_e2e.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.wait import wait_until

from zbk.errors import MetadataUnavailableError
from zbk.recovery import embedded
from zbk.recovery.embedded import EmbeddedAutoRecovery


class FakeAutoRecovery:
    made: list[FakeAutoRecovery] = []
    fail_starts = 0  # the next starts that raise (the store does not answer)
    stop_raises = False

    def __init__(self, cfg: Any, *, stop_event: threading.Event, http: Any) -> None:
        self.stop_event = stop_event
        self.lease = SimpleNamespace(lost=False)
        self.candidate_id = "127.0.0.1:1"
        self.started = self.stopped = 0
        FakeAutoRecovery.made.append(self)

    def start(self) -> None:
        if FakeAutoRecovery.fail_starts:
            FakeAutoRecovery.fail_starts -= 1
            raise MetadataUnavailableError("no answer")
        self.started += 1

    def stop(self) -> None:
        self.stopped += 1
        if FakeAutoRecovery.stop_raises:
            raise RuntimeError("a bug")

    def lose_lease(self) -> None:
        self.lease.lost = True
        self.stop_event.set()

    def crash(self) -> None:
        self.stop_event.set()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeAutoRecovery]:
    FakeAutoRecovery.made = []
    FakeAutoRecovery.fail_starts = 0
    FakeAutoRecovery.stop_raises = False
    monkeypatch.setattr(embedded, "AutoRecovery", FakeAutoRecovery)
    monkeypatch.setattr(embedded.limits, "process_stop_poll_s", 0.01)
    monkeypatch.setattr(embedded.limits, "auditor_error_backoff_s_min", 0.01)
    monkeypatch.setattr(embedded.limits, "auditor_error_backoff_s_max", 0.02)
    return FakeAutoRecovery


def _embedded(crashes: list[str]) -> EmbeddedAutoRecovery:
    return EmbeddedAutoRecovery(SimpleNamespace(lease_ttl_s=2), http=None, on_crash=lambda: crashes.append("crash"))


def test_a_lost_lease_starts_a_new_autorecovery_and_stops_the_old(fake: type[FakeAutoRecovery]) -> None:
    crashes: list[str] = []
    e = _embedded(crashes)
    e.start()
    first = e.current
    assert isinstance(first, FakeAutoRecovery) and first.started == 1
    first.lose_lease()
    wait_until(lambda: e.restarts == 1, timeout_s=5, message="a restart")
    second = e.current
    assert second is not first and isinstance(second, FakeAutoRecovery) and second.started == 1
    assert first.stopped == 1
    second.lose_lease()  # and again
    wait_until(lambda: e.restarts == 2, timeout_s=5, message="a second restart")
    e.stop()
    assert [a.stopped for a in fake.made] == [1, 1, 1] and crashes == []


def test_a_restart_retries_while_the_store_does_not_answer(fake: type[FakeAutoRecovery]) -> None:
    e = _embedded([])
    e.start()
    fake.fail_starts = 3
    fake.made[0].lose_lease()
    wait_until(lambda: e.restarts == 1, timeout_s=5, message="a restart once the store answers")
    assert len(fake.made) == 5 and all(a.stopped == 1 for a in fake.made[:4])  # failed starts are closed
    e.stop()
    assert all(a.stopped == 1 for a in fake.made)


def test_a_crash_stops_the_bookie_and_is_not_restarted(fake: type[FakeAutoRecovery]) -> None:
    crashes: list[str] = []
    e = _embedded(crashes)
    e.start()
    fake.made[0].crash()
    wait_until(lambda: crashes == ["crash"], timeout_s=5, message="the bookie told")
    assert e.restarts == 0 and len(fake.made) == 1 and fake.made[0].stopped == 0  # the bookie's stop does it
    e.stop()
    assert fake.made[0].stopped == 1


def test_a_bug_in_the_watch_stops_the_bookie(fake: type[FakeAutoRecovery]) -> None:
    crashes: list[str] = []
    e = _embedded(crashes)
    e.start()
    fake.stop_raises = True
    fake.made[0].lose_lease()
    wait_until(lambda: crashes == ["crash"], timeout_s=5, message="the bookie told")
    assert e.restarts == 0
    fake.stop_raises = False
    e.stop()


def test_stop_during_a_restart_leaves_nothing_running(fake: type[FakeAutoRecovery]) -> None:
    e = _embedded([])
    e.start()
    fake.fail_starts = 10**6  # the store never answers again
    fake.made[0].lose_lease()
    wait_until(lambda: len(fake.made) >= 3, timeout_s=5, message="restarts tried")
    e.stop()
    assert e.current is None and e.restarts == 0
    assert all(a.stopped == 1 for a in fake.made)


def test_a_failed_first_start_reaches_the_caller_and_closes_what_it_opened(fake: type[FakeAutoRecovery]) -> None:
    fake.fail_starts = 1
    e = _embedded([])
    with pytest.raises(MetadataUnavailableError):
        e.start()
    assert fake.made[0].stopped == 1 and e.current is None
