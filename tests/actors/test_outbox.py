"""The inproc outbox between actors: a message to an actor that has already stopped (its
PULL socket closed, as happens while a bookie stops) is dropped, not waited for forever."""

from __future__ import annotations

import threading
import uuid

import pytest
import zmq

from zbk.actors.base import SocketOutbox, drop_handoff, handoff_for, pipe_address, send_message
from zbk.actors.messages import SetReadOnly


def test_sending_to_a_stopped_actor_neither_blocks_nor_leaks() -> None:
    ctx = zmq.Context()
    instance = f"t-{uuid.uuid4().hex[:8]}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(pipe_address(instance, "server", "index"))
    outbox = SocketOutbox(instance, "server", ["index"])
    outbox.connect(ctx)
    handoff = handoff_for(instance)
    try:
        outbox.send("index", ("lookup", 1))
        key = pull.recv()
        assert handoff.take(key) == ("lookup", 1), "a running receiver gets the message"

        pull.close(0)  # the index actor stopped first
        done = threading.Event()

        def send_after_stop() -> None:
            # libzmq tears the pipe down asynchronously: the first sends after the close may
            # still enter the dying pipe (their objects stay parked until drop_handoff, as
            # at a bookie's stop); once the pipe is gone they are refused and dropped.
            for i in range(10_000):
                outbox.send("index", ("lookup", i))
                if "index" in outbox._gone:
                    break
                threading.Event().wait(0.001)
            parked = len(handoff)
            for i in range(3):
                outbox.send("index", ("late", i))
            assert len(handoff) == parked, "a refused message is not left parked"
            done.set()

        sender = threading.Thread(target=send_after_stop, daemon=True)
        sender.start()
        assert done.wait(10), "a send to a stopped actor blocked (the bookie's stop would hang)"
        assert "index" in outbox._gone, "the stopped actor was noticed"
    finally:
        outbox.close()
        drop_handoff(instance)
        ctx.term()


def test_a_closed_outbox_drops_what_its_core_still_sends() -> None:
    """A core fed after its loop stopped (ActorLoop.drain_inbound) keeps its outbox: once
    closed, it drops messages; before, a destination it has no pipe to is a bug."""
    ctx = zmq.Context()
    instance = f"t-{uuid.uuid4().hex[:8]}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(pipe_address(instance, "index", "server"))
    outbox = SocketOutbox(instance, "index", ["server"])
    handoff = handoff_for(instance)
    try:
        with pytest.raises(KeyError):
            outbox.send("server", "before connect")
        outbox.connect(ctx)
        with pytest.raises(KeyError):
            outbox.send("gc", "not a peer")
        assert len(handoff) == 0, "a refused message is not left parked"
        outbox.close()
        outbox.send("server", "after close")
        assert len(handoff) == 0 and pull.poll(50) == 0, "sent after the close"
    finally:
        outbox.close()
        pull.close(0)
        drop_handoff(instance)
        ctx.term()


def test_admin_send_to_a_stopped_actor_does_not_block() -> None:
    ctx = zmq.Context()
    instance = f"t-{uuid.uuid4().hex[:8]}"
    address = pipe_address(instance, "admin", "server")
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(address)
    handoff = handoff_for(instance)
    try:
        pull.close(0)
        done = threading.Event()

        def admin_sends() -> None:
            for _ in range(200):  # until the pipe is gone (see above); none of them may block
                send_message(push, handoff, SetReadOnly(True))
                threading.Event().wait(0.005)
            done.set()

        threading.Thread(target=admin_sends, daemon=True).start()
        assert done.wait(10), "an admin send to a stopped actor blocked"
        assert len(handoff) < 200, "refused admin messages are not left parked"
    finally:
        push.close(0)
        drop_handoff(instance)
        ctx.term()
