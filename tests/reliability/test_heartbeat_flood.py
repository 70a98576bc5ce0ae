"""A client that sends ZMTP heartbeats, floods a bookie past what libzmq buffers for one
peer, and hangs up, must not abort the bookie.

The bug: with a bounded receive high-water mark on the bookie's ROUTER, libzmq 4.3.5 stops
reading a peer whose pipe is full; if that connection then closes, the engine marks itself
failed, and when the Server drains the pipe libzmq decodes the rest of the peer's buffered
input, answers a PING found there with a PONG, and aborts the process on
``Assertion failed: !_io_error (src/stream_engine_base.cpp:310)``. zbk's clients send a PING
every half heartbeat timeout, and a bookie whose pipe stays full stops answering them, so
the client itself hangs up: a chaos run's bookie died of it under network faults, and any
client could kill any bookie on purpose. The bookie now reads every peer without a bound in
libzmq (``server_peer_recv_hwm_messages = 0``) and sheds load itself (ETOOMANYREQUESTS).
"""

from __future__ import annotations

import os
import signal
import time

import zmq
from helpers.procs import tail
from helpers.wait import wait_until

from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.status import Status

FLOOD = 5_000  # requests: several pipes' worth at the old bound of 1,000 per peer


def test_a_heartbeating_client_that_floods_a_stopped_bookie_and_hangs_up_does_not_abort_it(bookies):
    bk = bookies().start()
    assert bk.proc is not None
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.HEARTBEAT_IVL, 1)  # a PING every millisecond: some land between the requests
    d.setsockopt(zmq.HEARTBEAT_TIMEOUT, 60_000)
    d.setsockopt(zmq.SNDHWM, 0)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://{bk.address}")
    try:
        d.send_multipart(encode(w.BookieInfoRequest(rid=1)))  # the handshake is done once this answers
        assert d.poll(10_000), "the bookie did not answer"
        d.recv_multipart()
        os.kill(bk.proc.pid, signal.SIGSTOP)  # nothing reads: requests and PINGs pile up in its socket
        try:
            for rid in range(2, FLOOD + 2):
                d.send_multipart(encode(w.ReadLacRequest(rid=rid, ledger_id=1)), zmq.NOBLOCK)
                if rid % 25 == 0:
                    time.sleep(0.002)
            time.sleep(0.2)
        finally:
            d.close(0)  # hangs up with all of it unread
            os.kill(bk.proc.pid, signal.SIGCONT)
    finally:
        ctx.term()

    def served() -> bool:  # the flood is worked off (or shed) and the bookie answers again
        with bk.connect(timeout_s=2) as c:
            return c.call(w.BookieInfoRequest(rid=c.next_rid())).status == Status.EOK

    wait_until(served, timeout_s=30, interval_s=0.5, message="the bookie serving after the flood")
    time.sleep(1.0)
    assert bk.proc.poll() is None, f"the bookie exited with {bk.proc.returncode}"
    code = bk.stop()
    assert code == 0, f"the bookie did not stop cleanly (exit {code}):\n{tail(bk.log)}"
