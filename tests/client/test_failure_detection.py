"""Fast failure detection in the client (docs/reliability.md, "A bookie failing under a writer").

* The heartbeat options and their configuration.
* The real transport (ZmqTransport) against a stand-in bookie: a ROUTER in a process of its
  own, which takes requests and never answers, so that only the connection can tell. It is
  killed (its connection closes) or stopped with SIGSTOP (silent: only the heartbeats can
  tell). Time bounds are loose (a shared, noisy machine): each is far below the timeout the
  request would otherwise have waited for; bench/stall.py measures the real figures.
* The handle's side under the simulation (tests/client/sim.py): close() waits for an
  ensemble change under way.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import zmq
from helpers.procs import free_port, stop_process

from zbk import limits
from zbk.cli.children import spawn_tied
from zbk.client.transport import ZmqTransport, heartbeat_options
from zbk.config import ClientConfig
from zbk.errors import BookieUnavailableError, ConfigError
from zbk.wire import messages as w
from zbk.wire.status import Status

from . import sim
from .sim import Rule, SimCluster, WriteLog, check_persistence

PW = b"pw"
NO_ANSWER_S = 30.0  # the timeout of every request below: never reached when detection works

# A stand-in bookie: binds once it reads a line on stdin (so that a successor can be started
# ahead and take over the port the moment its predecessor dies), then takes requests and
# never answers them, or with "answer" answers BOOKIE_INFO requests.
_ROUTER = """
import sys, zmq
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, encode
sys.stdin.readline()
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
while True:
    ident, *frames = s.recv_multipart()
    if sys.argv[2] == "answer":
        rid = decode_request(frames).rid
        s.send_multipart([ident, *encode(w.BookieInfoResponse(
            rid=rid, status=0, free_bytes=1, total_bytes=1, state="writable", ledgers=0, limbo_ledgers=0))])
"""


def _router(port: int, mode: str) -> subprocess.Popen[bytes]:
    return spawn_tied([sys.executable, "-c", _ROUTER, str(port), mode], death_signal=signal.SIGKILL,
                      stdin=subprocess.PIPE, start_new_session=True)


def _bind(proc: subprocess.Popen[bytes], port: int) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"the stand-in bookie did not listen on {port}") from None
            time.sleep(0.02)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)  # a stopped process dies of SIGKILL too; be plain about it
        stop_process(p, kill=True)


def _info(t: ZmqTransport) -> w.BookieInfoRequest:
    return w.BookieInfoRequest(rid=t.next_rid())


def _send(t: ZmqTransport, bookie: str) -> asyncio.Future[tuple[float, Any]]:
    """t.send of one request; the future gets (when the callback ran, what it got)."""
    fut: asyncio.Future[tuple[float, Any]] = asyncio.get_running_loop().create_future()
    t.send(bookie, _info(t), NO_ANSWER_S, lambda r: fut.set_result((time.monotonic(), r)))
    return fut


async def _in_flight(t: ZmqTransport, bookie: str) -> None:
    """Until a request sent to ``bookie`` left: sends wait for a connection (IMMEDIATE)."""
    deadline = time.monotonic() + 10
    while not t.peers[bookie].calls:
        assert time.monotonic() < deadline, "never connected"
        await asyncio.sleep(0.01)


# -- heartbeat options ------------------------------------------------------------------------------
def test_heartbeat_options_bound_detection_by_the_timeout() -> None:
    assert heartbeat_options(0) == {}
    for timeout_ms in (2, 3, 100, 501, 2_000, limits.client_heartbeat_timeout_ms_max):
        opts = heartbeat_options(timeout_ms)
        ivl, wait = opts[zmq.HEARTBEAT_IVL], opts[zmq.HEARTBEAT_TIMEOUT]
        # Found out after at most IVL + TIMEOUT, and no sooner than TIMEOUT.
        assert ivl + wait == timeout_ms and wait >= timeout_ms // 2 and ivl >= 1
        assert opts[zmq.HEARTBEAT_TTL] == timeout_ms


def test_heartbeat_timeout_config() -> None:
    assert ClientConfig().bookie_heartbeat_timeout_ms == limits.client_heartbeat_timeout_ms_default
    ClientConfig(bookie_heartbeat_timeout_ms=0).validate()  # no heartbeats
    for bad in (-1, limits.client_heartbeat_timeout_ms_max + 1):
        with pytest.raises(ConfigError, match="bookie_heartbeat_timeout_ms"):
            ClientConfig(bookie_heartbeat_timeout_ms=bad).validate()


# -- the transport against a stand-in bookie ------------------------------------------------------------
def test_a_closed_connection_fails_the_adds_in_flight_and_the_next_ones_at_once() -> None:
    port = free_port()
    bookie = f"127.0.0.1:{port}"
    proc = _router(port, "silent")

    async def run() -> None:
        t = ZmqTransport(bookie_heartbeat_timeout_ms=0)  # only the closed connection can tell
        try:
            _bind(proc, port)
            in_flight = _send(t, bookie)
            await _in_flight(t, bookie)
            await asyncio.sleep(0.3)
            assert not in_flight.done()
            killed = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            when, err = await asyncio.wait_for(in_flight, NO_ANSWER_S)
            assert isinstance(err, BookieUnavailableError) and "connection lost" in str(err), err
            assert when - killed < 5.0, f"failed {when - killed:.2f}s after the kill"
            # Sent while the connection is gone: fails at once, not after the second a
            # request() gives a reconnection.
            asked = time.monotonic()
            when, err = await asyncio.wait_for(_send(t, bookie), NO_ANSWER_S)
            assert isinstance(err, BookieUnavailableError) and "connection lost" in str(err), err
            assert when - asked < 0.9, f"failed {when - asked:.2f}s after the send"
            assert t.suspect(bookie)
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        _stop(proc)


def test_adds_queued_for_a_connection_fail_when_it_is_reported_closed() -> None:
    """A writer's adds sent between a connection's close and the monitor's report of it find
    no connection and queue for one: the report fails them too, at once. A request() and a
    recovery's write-back (fail_if_lost=False) queued among them keep waiting, as do those
    sent after the report. Driven by a DISCONNECTED report given to the transport by hand,
    for a bookie it never reached (nothing listens), so that all of them stay queued."""
    bookie = f"127.0.0.1:{free_port()}"

    async def run() -> None:
        t = ZmqTransport(bookie_heartbeat_timeout_ms=0)
        loop = asyncio.get_running_loop()

        def write_back() -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            t.send_all([bookie], _info(t), NO_ANSWER_S, [fut.set_result], fail_if_lost=False)
            return fut

        try:
            first = _send(t, bookie)
            request = asyncio.ensure_future(t.request(bookie, _info(t), NO_ANSWER_S))
            recovery = write_back()
            last = _send(t, bookie)
            await asyncio.sleep(0.05)
            p = t.peers[bookie]
            assert len(p.backlog) == 4 and not first.done() and not last.done()
            t._on_event(p, zmq.EVENT_DISCONNECTED, 0)
            for fut in (first, last):
                _, err = await asyncio.wait_for(fut, 0.1)
                assert isinstance(err, BookieUnavailableError) and "connection lost" in str(err), err
            _, err = await asyncio.wait_for(_send(t, bookie), 0.1)  # after the report: at once too
            assert isinstance(err, BookieUnavailableError) and "connection lost" in str(err), err
            later = write_back()
            await asyncio.sleep(0.05)
            assert len(p.backlog) == 3 and not request.done() and not recovery.done() and not later.done()
            with pytest.raises(BookieUnavailableError, match="not connected"):
                await asyncio.wait_for(request, NO_ANSWER_S)  # after its second of grace
            assert isinstance(await asyncio.wait_for(recovery, NO_ANSWER_S), BookieUnavailableError)
        finally:
            await t.close()

    asyncio.run(run())


def test_a_request_still_waits_for_a_bookie_that_comes_back() -> None:
    """Reads and recovery (request()) keep waiting up to a second for a reconnection: a
    recovery that starts as every bookie comes back from a restart must find them."""
    port = free_port()
    bookie = f"127.0.0.1:{port}"
    first, successor = _router(port, "silent"), _router(port, "answer")

    async def run() -> None:
        t = ZmqTransport(bookie_heartbeat_timeout_ms=0)
        try:
            _bind(first, port)
            in_flight = _send(t, bookie)
            await _in_flight(t, bookie)
            await asyncio.sleep(0.3)
            os.kill(first.pid, signal.SIGKILL)
            _, err = await asyncio.wait_for(in_flight, NO_ANSWER_S)
            assert isinstance(err, BookieUnavailableError)
            assert t.peers[bookie].lost
            # Gone, its port with it: a dying process can still hold its listening socket
            # after its connection dropped, and the successor would find the port taken.
            await asyncio.to_thread(first.wait, 10)
            await asyncio.to_thread(_bind, successor, port)
            resp = await t.request(bookie, _info(t), NO_ANSWER_S)
            assert resp.status == Status.EOK
            # The monitor's report of the new handshake may be read after the answer.
            deadline = time.monotonic() + 5
            while t.peers[bookie].lost:
                assert time.monotonic() < deadline, "the new connection was never reported"
                await asyncio.sleep(0.01)
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        _stop(first, successor)


def test_a_silent_bookie_fails_the_adds_in_flight_within_the_heartbeat_timeout() -> None:
    port = free_port()
    bookie = f"127.0.0.1:{port}"
    proc = _router(port, "silent")
    heartbeat_ms = 400

    async def run() -> None:
        t = ZmqTransport(bookie_heartbeat_timeout_ms=heartbeat_ms)
        try:
            _bind(proc, port)
            in_flight = _send(t, bookie)
            await _in_flight(t, bookie)
            # Alive but not answering the request: the heartbeats are answered, nothing fails.
            await asyncio.sleep(3 * heartbeat_ms / 1000)
            assert not in_flight.done()
            stopped = time.monotonic()
            os.kill(proc.pid, signal.SIGSTOP)
            when, err = await asyncio.wait_for(in_flight, NO_ANSWER_S)
            assert isinstance(err, BookieUnavailableError) and "connection lost" in str(err), err
            assert when - stopped < heartbeat_ms / 1000 + 4.0, f"failed {when - stopped:.2f}s after the stop"
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        _stop(proc)


# -- the handle's side (simulation) -------------------------------------------------------------------
def test_close_waits_for_the_ensemble_change_under_way() -> None:
    """E3 WQ3 AQ2: one bookie fails the adds at once, before the two others confirm them, so
    the ensemble change starts from entry 0; every append then completes before the change
    lands (its metadata write is slow). close() waits for the change: the ledger closes with
    the failed bookie replaced, rather than with it in its last ensemble and the change then
    failing on the closed metadata."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        lh = await c.client("writer").create_ledger(3, 3, 2, password=PW)
        log = WriteLog()
        healthy = [c.bookie(b) for b in lh.md.last_ensemble[:2]]
        failing = c.bookie(lh.md.last_ensemble[2])
        failing.add_status = Status.EIO
        for b in healthy:
            b.rules.append(Rule("delay_reply", lambda m: isinstance(m, w.AddRequest), seconds=1.0))

        async def slow_change(md: Any) -> None:
            if not md.is_closed:
                await asyncio.sleep(5.0)

        c.before_metadata_write = slow_change
        for i in range(50):
            log.append(lh, b"entry %d" % i)
        await asyncio.gather(*log.futures)
        assert failing.id in c.ledger(lh.ledger_id).last_ensemble, "the change landed before the appends completed"
        await lh.close()
        md = c.ledger(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 49
        assert failing.id not in md.last_ensemble, md.fragments
        assert lh.failed is None, lh.failed
        c.before_metadata_write = None
        c.heal()
        assert await check_persistence(c, lh.ledger_id, PW, log) == []

    sim.run(scenario())
