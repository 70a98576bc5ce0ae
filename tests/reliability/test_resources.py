"""Resource exhaustion against real bookie processes: floods of long polls, a client that
never reads its answers, and a disk that runs full.

Every bookie is stopped by PID at teardown (the ``bookies`` fixture of conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from helpers.wait import wait_until

from zbk import limits
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

from .util import DIGEST, MK, add, metric, read_all, rss_bytes

# --- bounded work in flight ------------------------------------------------------------------


def test_a_flood_of_long_polls_is_bounded_by_too_many_requests(bookies):
    bk = bookies().start()
    n = limits.server_pending_requests_max
    with bk.connect(timeout_s=20) as c:
        assert add(c, 1, [0, 1]).status == Status.EOK  # LAC 0
        started = time.monotonic()
        for _ in range(n):  # polls that wait for an LAC that never comes (30 s)
            c.send(w.ReadRequest(rid=c.next_rid(), ledger_id=1, first_entry_id=0, flags=ReadFlag.LONG_POLL,
                                 previous_lac=5, timeout_ms=30_000))
        with bk.connect(timeout_s=20) as other:
            # Every pending poll holds a slot: the next request is shed at once, not queued.
            def shed() -> bool:
                r = other.call(w.ReadLacRequest(rid=other.next_rid(), ledger_id=1))
                return r.status == Status.ETOOMANYREQUESTS

            wait_until(shed, timeout_s=20, interval_s=0.2, message="ETOOMANYREQUESTS once the polls are parked")
            assert time.monotonic() - started < 25, "the polls took too long to send for this test to hold"
            r = other.call(w.AddRequest(rid=other.next_rid(), ledger_id=2, master_key=MK, flags=AddFlag(0),
                                        entries=[build_entry(2, 0, -1, b"x", DIGEST)]))
            assert r.status == Status.ETOOMANYREQUESTS
            assert bk.proc is not None and rss_bytes(bk.proc.pid) < 600 * 1024 * 1024
            # The polls time out and answer (with the LAC); then the bookie serves again.
            answered = 0
            while answered < n:
                resp = c.recv(timeout_s=45)
                if isinstance(resp, w.ReadResponse):
                    assert resp.status == Status.ENOENTRY and resp.lac == 0, resp
                    answered += 1
            assert add(other, 2, [0]).status == Status.EOK
    assert bk.stop() == 0


def test_a_client_that_never_reads_costs_one_pipe_of_replies(bookies):
    """A peer that sends reads and never reads the answers: the bookie drops its replies
    once its pipe is full, stops serving it, keeps its memory flat, and serves others."""
    bk = bookies().start()
    entry_size, per_read = 4096, 8  # each answer ~32 KiB
    with bk.connect() as c:
        for first in range(0, 256, 64):
            assert add(c, 1, list(range(first, first + 64)), size=entry_size).status == Status.EOK
    assert bk.proc is not None
    before = rss_bytes(bk.proc.pid)
    ctx = zmq.Context()
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.RCVHWM, 1)  # its libzmq stops reading the TCP socket almost at once
    slow.setsockopt(zmq.RCVBUF, 4096)
    slow.setsockopt(zmq.LINGER, 0)
    slow.connect(f"tcp://{bk.bookie_id}")
    requests = 12_000  # ~400 MiB of answers if the bookie queued them all
    try:
        for rid in range(1, requests + 1):
            slow.send_multipart(encode(w.ReadRequest(rid=rid, ledger_id=1, first_entry_id=(rid * 7) % 200,
                                                     count=per_read)))
        with bk.connect() as good:  # a well-behaved client is served meanwhile
            for k in range(20):
                assert add(good, 2, [k]).status == Status.EOK
            read_all(good, 2, 19)

        def handled() -> bool:  # every request of the stuck peer was served or dropped unread
            served = metric(bk, "zbk_bookie_requests_total", 'op="read"')
            return served + metric(bk, "zbk_bookie_replies_dropped_total", 'reason="peer_stalled"') >= requests

        wait_until(handled, timeout_s=60, interval_s=0.2, message="the stuck peer's requests handled")
        grown = rss_bytes(bk.proc.pid) - before
        print(f"bookie RSS grew by {grown / 2**20:.1f} MiB for {requests} unread ~32 KiB answers")
        # At most one pipe (server_peer_send_hwm_messages answers, ~32 MiB) plus slack.
        assert grown < 100 * 1024 * 1024, f"bookie memory grew by {grown / 2**20:.0f} MiB"
        assert metric(bk, "zbk_bookie_replies_dropped_total", 'reason="peer_full"') > 0
    finally:
        slow.close(0)
        ctx.term()
    assert bk.proc.poll() is None
    assert bk.stop() == 0


# --- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, unmounted at teardown; skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_turns_the_bookie_read_only_and_writable_again(bookies, small_disk: Path):
    ballast = small_disk / "ballast"
    ballast.write_bytes(os.urandom(8 * 1024 * 1024))  # freed later: "space comes back"
    # Read-only at 90 %, writable again below 70 %: the gap is wider than what a checkpoint
    # frees by trimming the journal (about 2 MiB here), so only the ballast brings it back.
    bk = bookies(settings={"disk_usage_threshold": 0.9, "disk_usage_warn_threshold": 0.7,
                           "disk_check_interval_ms": 200, "journal_max_size_mb": 1,
                           "entry_log_size_limit_mb": 2, "flush_interval_ms": 500})
    bk.data_dir = small_disk / "bk"  # the CLI flag and the setting agree
    bk.start()
    size = 16 * 1024
    acked = -1
    with bk.connect(timeout_s=10) as c:
        for k in range(100_000):  # far more than fits: until the bookie refuses
            eids = list(range(k * 8, k * 8 + 8))
            r = add(c, 1, eids, size=size)
            if r.status == Status.EREADONLY:
                break
            assert r.status == Status.EOK, r
            acked = eids[-1]
        else:
            raise AssertionError("the disk never filled")
        print(f"read-only after {acked + 1} entries of {size} bytes")
        assert acked > 100
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).state == "readonly"
        read_all(c, 1, acked, size)  # every acknowledged entry still reads back, byte for byte
        ballast.unlink()

        def writable_again() -> bool:
            return add(c, 1, [acked + 1], size=size).status == Status.EOK

        wait_until(writable_again, timeout_s=20, interval_s=0.3, message="writable once space is freed")
        acked += 1
    assert bk.stop() == 0
    bk.start()  # nothing was corrupted: a restart replays and serves every acknowledged entry
    with bk.connect() as c:
        read_all(c, 1, acked, size)
    assert bk.stop() == 0
