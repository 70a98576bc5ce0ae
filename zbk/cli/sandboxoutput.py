"""`zbk sandbox`: its output, status lines or JSON events (zbk/cli/sandbox.py runs it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from zbk.cli.sandboxlayout import Layout

PLAIN_STATUS_INTERVAL_S = 10.0  # a non-terminal gets an unchanged status line this often


# -- output -----------------------------------------------------------------------------------
AR_RUNNING, AR_WAITING, AR_DOWN = "running", "waiting", "down"


@dataclass
class Status:
    running: int
    bookies: int
    autorecovery: str  # AR_RUNNING | AR_WAITING (for the bookies to register) | AR_DOWN (see problems)
    writable: int
    readonly: int
    ledgers: int | None  # None: metadata unreachable
    under_replicated: int | None = None
    auditor: str | None = None
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        parts = [f"{self.running}/{self.bookies} bookies running"]
        if self.autorecovery == AR_RUNNING:
            parts.append("autorecovery running")
        elif self.autorecovery == AR_WAITING:
            parts.append("autorecovery waits for the bookies")
        # Without metadata (ledgers None) the problems say why; the counts would be made up.
        if self.ledgers is not None:
            parts.append(f"{self.writable} writable, {self.readonly} readonly, {self.ledgers} ledgers, "
                         f"{self.under_replicated} under-replicated, auditor {self.auditor or 'none'}")
        return ", ".join([*parts, *self.problems])

    def key(self) -> tuple[Any, ...]:  # what counts as a change worth a line (not the ledger count)
        return (self.running, self.autorecovery, self.writable, self.readonly, self.ledgers is None,
                self.under_replicated, self.auditor, tuple(self.problems))


class Output:
    """Human lines (a status line rewritten in place on a terminal) or JSON lines."""

    def __init__(self, *, as_json: bool, show_status: bool, stream: IO[str] = sys.stdout) -> None:
        self.as_json, self.show_status, self.stream = as_json, show_status, stream
        self.tty = stream.isatty() and not as_json
        self._line_shown = False
        self._last_key: tuple[Any, ...] | None = None
        self._last_plain = 0.0

    def _write(self, text: str) -> None:
        if self.stream.closed:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:
            # The terminal went away (SIGHUP) or the reader of a pipe quit: keep supervising
            # and stopping the children, silently, rather than die and orphan them.
            with contextlib.suppress(OSError):
                self.stream.close()

    def _clear_line(self) -> None:
        if self._line_shown:
            self._write("\r\x1b[K")
            self._line_shown = False

    def lines(self, text: str) -> None:
        self._clear_line()
        self._write(text + "\n")

    def description(self, layout: Layout, pids: dict[str, int | None]) -> None:
        ar = layout.autorecovery
        if self.as_json:
            self.lines(json.dumps({"event": "cluster", "metadata": layout.metadata, "data_dir": layout.data_dir,
                                   "base_port": layout.base_port, "pid": os.getpid(),
                                   "bookies": [{"name": b.name, "id": b.bookie_id, "port": b.port,
                                                "http_port": b.http_port, "http": b.http_url,
                                                "metrics": f"{b.http_url}/metrics", "data_dir": b.data_dir,
                                                "log": b.log, "pid": pids[b.name]} for b in layout.bookies],
                                   "autorecovery": {"name": ar.name, "id": ar.candidate_id, "http_port": ar.http_port,
                                                    "http": ar.http_url, "metrics": f"{ar.http_url}/metrics",
                                                    "log": ar.log, "pid": pids[ar.name]}}))
            return
        rows = [f"zbk sandbox: {len(layout.bookies)} bookies and auto-recovery, data in {layout.data_dir}",
                f"  metadata  {layout.metadata}"]
        rows += [f"  {b.name}  id {b.bookie_id}  metrics {b.http_url}/metrics  pid {pids[b.name]}  log {b.log}"
                 for b in layout.bookies]
        ar_pid = pids[ar.name]
        rows.append(f"  {ar.name}  auditor candidate {ar.candidate_id}  metrics {ar.http_url}/metrics  "
                    f"{f'pid {ar_pid}' if ar_pid else 'starts once the bookies have registered'}  log {ar.log}")
        rows.append("Ctrl-C stops the cluster.")
        self.lines("\n".join(rows))

    def event(self, kind: str, message: str, **fields: Any) -> None:
        self.lines(json.dumps({"event": kind, **fields}) if self.as_json else message)

    def status(self, st: Status, now: float) -> None:
        if not self.show_status:
            return
        if self.tty:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be rewritten with \r
            self._write("\r\x1b[K" + st.text()[:width])
            self._line_shown = True
            return
        if st.key() == self._last_key and now - self._last_plain < PLAIN_STATUS_INTERVAL_S:
            return
        self._last_key, self._last_plain = st.key(), now
        if self.as_json:
            self.lines(json.dumps({"event": "status", "running": st.running, "bookies": st.bookies,
                                   "autorecovery": st.autorecovery, "writable": st.writable,
                                   "readonly": st.readonly, "ledgers": st.ledgers,
                                   "under_replicated": st.under_replicated, "auditor": st.auditor,
                                   "problems": st.problems}))
        else:
            self.lines(f"[{time.strftime('%H:%M:%S')}] {st.text()}")

    def end(self) -> None:
        self._clear_line()


