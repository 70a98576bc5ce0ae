"""The Server loop's decisions without sockets or a clock: reply backlogs and stalls
(PeerBacklogs), and when the disk is probed (DiskProbeSchedule). Time is whatever the test
passes as ``now``."""

from __future__ import annotations

from zbk.actors.serverpolicy import DiskProbeSchedule, PeerBacklogs

A, B = b"peer-a", b"peer-b"


def frames(n: int) -> list[bytes]:
    """A reply of ``n`` bytes in two frames."""
    return [b"h", b"x" * (n - 1)]


def test_replies_wait_in_order_and_leave_as_the_pipe_takes_them() -> None:
    p = PeerBacklogs(peer_bytes_max=100, total_bytes_max=1000, stall_s=5.0)
    assert not p.waiting(A) and p.poll_timeout_ms() == 50.0
    first, second = frames(30), frames(40)
    assert p.hold(A, first, now=0.0) and p.hold(A, second, now=0.0)
    assert p.waiting(A) and not p.waiting(B)
    assert p.peer_bytes[A] == p.total_bytes == 70
    assert p.poll_timeout_ms() == 2.0  # replies waiting: the loop looks at the pipes again soon
    assert p.peers() == [A] and p.head(A) is first
    p.sent(A)
    assert p.head(A) is second and p.total_bytes == 40
    p.sent(A)
    assert not p.waiting(A) and p.head(A) is None and p.total_bytes == 0 and A not in p.peer_bytes
    assert p.poll_timeout_ms() == 50.0


def test_a_reply_over_the_peer_bound_is_dropped_and_the_peer_stalled_until_its_time() -> None:
    p = PeerBacklogs(peer_bytes_max=100, total_bytes_max=1000, stall_s=5.0)
    assert p.hold(A, frames(60), now=10.0)
    assert not p.hold(A, frames(60), now=11.0)  # 120 > 100: dropped
    assert p.peer_bytes[A] == 60, "a dropped reply holds nothing"
    assert p.stalled == {A: 16.0}
    assert p.admits(B, 11.0), "other peers are served"
    assert not p.admits(A, 15.9)
    assert p.admits(A, 16.0) and A not in p.stalled, "served again when the stall ends"
    assert p.waiting(A), "what was held still waits for the pipe"


def test_another_drop_extends_the_stall() -> None:
    p = PeerBacklogs(peer_bytes_max=10, total_bytes_max=1000, stall_s=5.0)
    assert not p.hold(A, frames(20), now=0.0)
    assert not p.hold(A, frames(20), now=3.0)
    assert p.stalled[A] == 8.0 and not p.admits(A, 7.0)


def test_the_bound_over_all_peers_drops_too() -> None:
    p = PeerBacklogs(peer_bytes_max=100, total_bytes_max=150, stall_s=1.0)
    assert p.hold(A, frames(90), now=0.0)
    assert not p.hold(B, frames(90), now=0.0)  # B holds nothing, but all peers would hold 180
    assert B in p.stalled and A not in p.stalled
    assert p.hold(B, frames(60), now=0.0)  # 150 fits exactly
    assert p.total_bytes == 150


def test_expire_ends_only_the_stalls_that_are_over() -> None:
    p = PeerBacklogs(peer_bytes_max=1, total_bytes_max=1000, stall_s=2.0)
    p.hold(A, frames(5), now=0.0)
    p.hold(B, frames(5), now=1.0)
    p.expire(2.0)
    assert p.stalled == {B: 3.0}
    p.expire(3.0)
    assert p.stalled == {}


def test_a_gone_peer_takes_its_waiting_replies_with_it() -> None:
    p = PeerBacklogs(peer_bytes_max=100, total_bytes_max=1000, stall_s=1.0)
    p.hold(A, frames(10), now=0.0)
    p.hold(A, frames(20), now=0.0)
    p.hold(B, frames(5), now=0.0)
    assert p.drop(A) == 2 and p.drop(A) == 0
    assert p.peers() == [B] and p.total_bytes == 5


def test_the_disk_is_probed_at_once_then_each_interval() -> None:
    s = DiskProbeSchedule(interval_s=10.0, threshold=0.95, bytes_min=64)
    assert s.due(0.0)
    s.probed(0.0, used=10, total=1_000_000)
    assert not s.due(9.99) and s.due(10.0)


def test_the_disk_is_probed_early_after_a_quarter_of_the_headroom_arrived() -> None:
    s = DiskProbeSchedule(interval_s=10.0, threshold=0.95, bytes_min=64)
    s.probed(0.0, used=550_000, total=1_000_000)  # headroom below the threshold: 400,000 bytes
    assert s.after_bytes == 100_000
    s.received(99_999)
    assert not s.due(1.0)
    s.received(1)
    assert s.due(1.0)
    s.probed(1.0, used=940_000, total=1_000_000)  # 10,000 bytes of headroom: never below the minimum
    assert s.bytes_since == 0 and s.after_bytes == 2_500
    s.probed(2.0, used=990_000, total=1_000_000)  # over the threshold already
    assert s.after_bytes == 64
    s.received(63)
    assert not s.due(3.0)
    s.received(1)
    assert s.due(3.0)
