"""The inproc outbox between actors: a message to an actor that has already stopped (its
PULL socket closed, as happens while a bookie stops) is dropped, not waited for forever."""

from __future__ import annotations

import threading
import uuid

import zmq

from zbk.actors.base import SocketOutbox, drop_handoff, handoff_for, pipe_address, send_message


def test_sending_to_a_stopped_actor_neither_blocks_nor_leaks() -> None:
    ctx = zmq.Context()
    instance = f"t-{uuid.uuid4().hex[:8]}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(pipe_address(instance, "server", "index"))
    outbox = SocketOutbox(ctx, instance, "server", ["index"])
    handoff = handoff_for(instance)
    try:
        outbox.send("index", ("lookup", 1))
        key = pull.recv()
        assert handoff.take(key) == ("lookup", 1), "a running receiver gets the message"

        pull.close(0)  # the index actor stopped first
        done = threading.Event()

        def send_after_stop() -> None:
            outbox.send("index", ("lookup", 2))
            outbox.send("index", ("lookup", 3))
            done.set()

        sender = threading.Thread(target=send_after_stop, daemon=True)
        sender.start()
        assert done.wait(5), "a send to a stopped actor blocked (the bookie's stop would hang)"
        assert len(handoff) == 0, "dropped messages are not left parked"
    finally:
        outbox.close()
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
        threading.Thread(target=lambda: (send_message(push, handoff, ("admin", "read_only", True)), done.set()),
                         daemon=True).start()
        assert done.wait(5), "an admin send to a stopped actor blocked"
        assert len(handoff) == 0
    finally:
        push.close(0)
        drop_handoff(instance)
        ctx.term()
