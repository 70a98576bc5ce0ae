"""The inproc pipes between actors (zbk/actors/base.py): messages are handed over as the
same objects, in send order per pipe, and no wake-up is lost however sends and drains
interleave."""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

from zbk.actors.base import ActorLoop, SocketOutbox, drop_handoff, handoff_for
from zbk.clock import SYSTEM_CLOCK


class Recorder:
    name = "rx"
    tick_interval_s: float | None = None

    def __init__(self, expect: int) -> None:
        self.got: list[Any] = []
        self.expect = expect
        self.done = threading.Event()

    def on_message(self, msg: Any, now: float) -> None:
        self.got.append(msg)
        if len(self.got) >= self.expect:
            self.done.set()

    def on_tick(self, now: float) -> None:
        pass


def _run(senders: int, per_sender: int, instance: str) -> tuple[Recorder, list[list[Any]]]:
    ctx: zmq.Context[Any] = zmq.Context()
    stop = threading.Event()
    core = Recorder(senders * per_sender)
    names = [f"tx{i}" for i in range(senders)]
    loop = ActorLoop(ctx=ctx, instance=instance, core=core, senders=names, peers=[], clock=SYSTEM_CLOCK,
                     on_crash=lambda name, e: stop.set(), stop=stop)
    loop.start()
    assert loop.ready.wait(10)
    sent: list[list[Any]] = [[] for _ in names]

    def send(i: int) -> None:
        out = SocketOutbox(ctx, instance, names[i], ["rx"])
        for n in range(per_sender):
            msg = [names[i], n]  # a fresh mutable object per message: it must arrive as itself
            sent[i].append(msg)
            out.send("rx", msg)
            if n % 997 == 0:
                time.sleep(0.001)  # let the receiver catch up and sleep in poll now and then
        out.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert core.done.wait(60), f"received {len(core.got)} of {senders * per_sender}"
        time.sleep(0.05)
        assert handoff_for(instance).queued() == 0
    finally:
        stop.set()
        loop.join(10)
        ctx.destroy(0)
        drop_handoff(instance)
    return core, sent


def test_every_message_arrives_once_as_the_same_object_in_send_order() -> None:
    core, sent = _run(senders=1, per_sender=20_000, instance="test-pipes-1")
    assert len(core.got) == 20_000
    assert all(a is b for a, b in zip(core.got, sent[0], strict=True))


def test_several_senders_keep_their_own_order() -> None:
    core, sent = _run(senders=3, per_sender=5_000, instance="test-pipes-3")
    assert len(core.got) == 15_000
    for i, mine in enumerate(sent):
        got = [m for m in core.got if m[0] == f"tx{i}"]
        assert len(got) == len(mine) and all(a is b for a, b in zip(got, mine))
