"""A bookie under a flood of garbage frames keeps serving a well-behaved writer."""

from __future__ import annotations

import os
import random
import threading

import cbor2

from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.status import Status

from .util import MK, add, check_payloads, entry, read

FRAMES = 10_000


def _garbage(rng: random.Random) -> list[bytes]:
    kind = rng.randrange(6)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 200))]
    if kind == 1:  # valid CBOR, wrong shape
        return [cbor2.dumps(rng.choice([[1, 2], {"v": 1}, {"v": 1, "op": 99, "rid": 5}, "x", -1, {"rid": "a"}]))]
    if kind == 2:  # a real request, truncated or bit-flipped
        frames = [bytes(f) for f in encode(w.AddRequest(rid=rng.randrange(1 << 40), ledger_id=5, master_key=MK,
                                                        flags=w.AddFlag(0), entries=[entry(5, 0)]))]
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        if f and rng.random() < 0.5:
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        else:
            f = f[: rng.randrange(len(f) + 1)]
        frames[i] = bytes(f)
        return frames
    if kind == 3:  # unknown protocol version
        return [cbor2.dumps({"v": 99, "op": 1, "rid": 7})]
    if kind == 4:  # many empty frames
        return [b""] * rng.randrange(1, 50)
    return [cbor2.dumps({"v": 1, "op": 2, "rid": 1, "l": -5, "e": 2**70})]


def test_garbage_flood_while_writer_succeeds(bookies):
    seed = int(os.environ.get("ZBK_SEED", random.randrange(1 << 30)))
    print(f"ZBK_SEED={seed}")
    rng = random.Random(seed)
    bk = bookies()
    bk.start()
    done = threading.Event()
    sent = [0]

    def flood() -> None:
        with bk.connect(timeout_s=0.01) as c:
            while sent[0] < FRAMES:
                c.send_frames(_garbage(rng))
                sent[0] += 1
                if sent[0] % 200 == 0:  # drain answers so our own receive queue stays small
                    while c.sock.poll(0):
                        c.sock.recv_multipart()
        done.set()

    t = threading.Thread(target=flood)
    t.start()
    acked = 0
    with bk.connect() as c:
        e = 0
        while not done.is_set() or e < 500:
            assert add(c, 9, list(range(e, e + 5))).status == Status.EOK
            e += 5
            acked = e
        t.join(60)
        got: list[int] = []
        while len(got) < acked:
            r = read(c, 9, len(got), 1000)
            assert r.entries
            got += check_payloads(r, 9)
    assert sent[0] == FRAMES
    assert bk.proc is not None and bk.proc.poll() is None, "the bookie died"
    assert bk.stop() == 0
