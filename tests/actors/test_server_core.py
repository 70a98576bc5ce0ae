"""ServerCore logic without sockets: disk-usage hysteresis, read-only transitions, and the
admin messages of the HTTP handlers."""

from __future__ import annotations

from concurrent.futures import Future

from zbk.actors.base import ListOutbox
from zbk.actors.messages import BookieStatus, SetReadOnly, StatusRequest
from zbk.actors.server import LedgerState, ServerCore


def make() -> tuple[ServerCore, list[bool]]:
    changes: list[bool] = []
    core = ServerCore(ledgers={}, journal_write_data=True, max_frame_bytes=1 << 20, reply=lambda i, f: None,
                      outbox=ListOutbox(), on_state_change=changes.append)
    return core, changes


def test_read_only_above_threshold_writable_only_below_warn():
    core, changes = make()
    usage = lambda ratio: core.set_disk_usage(int(ratio * 1000), 1000, threshold=0.95, warn_threshold=0.90)  # noqa: E731
    usage(0.50)
    assert not core.read_only and changes == []
    usage(0.96)
    assert core.read_only and changes == [True]
    usage(0.92)  # between warn and threshold: stays read-only (no flapping)
    assert core.read_only and changes == [True]
    usage(0.89)
    assert not core.read_only and changes == [True, False]


def test_operator_read_only_survives_disk_recovery():
    core, changes = make()
    core.set_forced_read_only(True)
    core.set_disk_usage(10, 1000, threshold=0.95, warn_threshold=0.90)
    assert core.read_only
    core.set_forced_read_only(False)
    assert not core.read_only and changes == [True, False]


def test_read_only_mode_disabled_never_turns_read_only():
    core, _ = make()
    core.read_only_mode_enabled = False
    core.set_disk_usage(990, 1000, threshold=0.95, warn_threshold=0.90)
    assert not core.read_only


def test_admin_messages_set_read_only_and_ask_for_the_status():
    core, changes = make()
    core.ledgers.update({1: LedgerState(), 2: LedgerState(limbo=True), 3: LedgerState(limbo=True)})
    core.set_disk_usage(300, 1000, threshold=0.95, warn_threshold=0.90)
    core.on_message(SetReadOnly(True), 0.0)
    assert core.read_only and changes == [True]
    answer: Future[BookieStatus] = Future()
    core.on_message(StatusRequest(answer), 0.0)
    assert answer.result(timeout=0) == BookieStatus(read_only=True, ledgers=3, limbo_ledgers=2,
                                                    disk_used_bytes=300, disk_total_bytes=1000)
    core.on_message(SetReadOnly(False), 0.0)
    assert not core.read_only and changes == [True, False]
