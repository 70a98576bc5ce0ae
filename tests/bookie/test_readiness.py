"""GET /api/v1/bookie/is_ready against a real bookie: its HTTP port comes up before the
journal replay, answers 503 while the journal replays (a journal of many records left by a
kill -9, with no checkpoint since) and 200 once the bookie is registered; 503 again from
the moment it is told to stop."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from helpers.bookie import BookieProcess, wait_registered
from helpers.procs import stop_process

from zbk.wire import messages as w
from zbk.wire.status import Status

from .util import MK, NO_ADD_FLAGS, entry

READY = "/api/v1/bookie/is_ready"
RECORDS = 120_000  # enough journal that its replay takes a while on any machine
BATCH = 400
REPLAY_STARTS = "index: checkpoints"  # logged by the boot just before the replay
REPLAY_ENDS = "journal replay: "


def probe(port: int) -> int | None:
    """The status is_ready answers, or None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{READY}", timeout=5) as resp:
            assert json.loads(resp.read()) == {"ready": True}
            return int(resp.status)
    except urllib.error.HTTPError as e:
        body: Any = json.loads(e.read())
        assert e.code == 503 and body["error"].startswith("not ready"), (e.code, body)
        return 503
    except (ConnectionError, urllib.error.URLError):
        return None


def fill_journal(b: BookieProcess) -> None:
    """RECORDS entries, pipelined in batches; every one acknowledged (in the journal)."""
    with b.connect(timeout_s=60) as c:
        pending: set[int] = set()
        for first in range(0, RECORDS, BATCH):
            rid = c.next_rid()
            lid = 1 + first // 20_000
            c.send(w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=NO_ADD_FLAGS,
                                entries=[entry(lid, e, 64) for e in range(first % 20_000, first % 20_000 + BATCH)]))
            pending.add(rid)
            while len(pending) > 16:
                resp = c.recv()
                assert resp.status == Status.EOK, resp
                pending.discard(resp.rid)
        while pending:
            resp = c.recv()
            assert resp.status == Status.EOK, resp
            pending.discard(resp.rid)


def test_is_ready_is_503_while_the_journal_replays_and_200_once_registered(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/meta.db"
    # No checkpoint while it runs: the whole journal is replayed at the next start.
    b = BookieProcess(tmp_path, uri, settings={"flush_interval_ms": 3_600_000})
    try:
        b.start()
        assert probe(b.http_port) == 200
        fill_journal(b)
        b.kill9()
        log_before = b.log.read_text()
        b.start(wait=False)

        def log() -> str:
            return b.log.read_text()[len(log_before):]

        seen: list[tuple[int | None, bool]] = []  # (answer, the replay was under way all along)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            before = log()
            answer = probe(b.http_port)
            after = log()
            during = REPLAY_STARTS in before and REPLAY_ENDS not in after
            seen.append((answer, during))
            if answer == 200:
                break
            time.sleep(0.01)
        assert seen and seen[-1][0] == 200, f"never ready:\n{b.log_tail()}"
        replayed = re.search(REPLAY_ENDS + r".*?: (\d+) records", log())  # "journal replay: DIR: N records"
        assert replayed and int(replayed.group(1)) >= RECORDS // BATCH, "the journal was replayed"
        answers_during = [a for a, during in seen if during]
        assert answers_during and set(answers_during) == {503}, \
            f"is_ready while the journal replayed: {answers_during[:5]} (of {len(seen)} probes)"
        assert len(seen) > 1, "the first answer was not already 200"
        wait_registered(uri, [b.bookie_id])  # 200 came once it was registered
        # Told to stop: never ready again (503 while it stops, then nothing listens).
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGTERM)
        time.sleep(0.05)  # the signal handler runs on the main thread
        while b.proc.poll() is None:
            assert probe(b.http_port) in (503, None)
        assert b.proc.returncode == 0
    finally:
        if b.proc is not None:
            stop_process(b.proc, kill=True)
