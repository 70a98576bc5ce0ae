"""tail() follows an open ledger by long-poll LAC reads and stops after it closes."""

from __future__ import annotations

import threading
import time

import zbk
from zbk.config import ClientConfig

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=2000, read_timeout_ms=2000, speculative_read_ms=300)


def test_tail_sees_entries_appended_while_it_runs_and_ends_at_close(cluster):
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST) as writer, zbk.BookKeeper(c.uri, config=FAST) as reader:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(5):
            lh.append(b"e%d" % i)
        seen: list[bytes] = []
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)

        def follow() -> None:
            for e in rh.tail(0):
                seen.append(e.payload)

        t = threading.Thread(target=follow)
        t.start()
        for i in range(5, 200):
            lh.append(b"e%d" % i)
            if i % 50 == 0:
                time.sleep(0.3)  # let the tail catch up and long-poll for more
        lh.close()
        t.join(30)
        assert not t.is_alive(), "tail did not end after the ledger closed"
        # Every entry up to the close, in order, no duplicates; nothing unconfirmed.
        assert seen == [b"e%d" % i for i in range(200)]
        assert writer.ledger_metadata(lh.ledger_id).state == "CLOSED"  # tailing never fenced
