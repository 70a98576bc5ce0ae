"""A `zbk bookie` process reads its sections from TOML tables and from `--set table.key=value`,
and the flat names of API.md beside them; a key given both ways stops it with a usage error
that names both."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

from helpers.procs import free_port, start_process, stop_process, tail

from zbk.errors import EXIT_USAGE
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", f"sqlite:///{tmp_path}/meta.db",
            "--data-dir", str(tmp_path / "bookie"), *extra]


def _get(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return dict(json.load(r))
    except OSError:
        return None


def test_sections_from_a_file_and_the_command_line_reach_the_bookie(tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    conf = tmp_path / "bookie.toml"
    conf.write_text(f'port = {port}\nrack = "/r9"\nregistration_ttl_s = 2\ngc_wait_time_ms = 3600000\n\n'
                    f'[http]\nport = {http_port}\n\n[disk]\ncheck_interval_ms = 1000\n')
    log = tmp_path / "bookie.log"
    proc = start_process(_argv(tmp_path, "--config", str(conf), "--set", "journal.sync_data=false",
                               "--set", "flush_interval_ms=2000"), log)
    try:
        deadline = time.monotonic() + 30
        info = None
        while info is None and time.monotonic() < deadline:
            assert proc.poll() is None, tail(log)
            info = _get(f"http://127.0.0.1:{http_port}/api/v1/bookie/info")  # [http] port
            time.sleep(0.1)
        assert info is not None and info["id"] == f"127.0.0.1:{port}", tail(log)
        store = open_store(f"sqlite:///{tmp_path}/meta.db")
        try:
            deadline = time.monotonic() + 30
            regs = list_bookies(store)
            while not regs and time.monotonic() < deadline:
                time.sleep(0.1)
                regs = list_bookies(store)
            assert [(r.rack, r.http_url) for r in regs] == [("/r9", f"http://127.0.0.1:{http_port}")]
        finally:
            store.close()
    finally:
        stop_process(proc, timeout_s=20.0)
    assert proc.returncode == 0, tail(log)


def test_a_key_given_two_ways_is_a_usage_error_naming_both(tmp_path: Path) -> None:
    log = tmp_path / "bookie.log"
    proc = start_process(_argv(tmp_path, "--set", "journal_sync_data=false", "--set", "journal.sync_data=true"),
                         log)
    try:
        assert proc.wait(30) == EXIT_USAGE
    finally:
        stop_process(proc)
    assert "'journal_sync_data' and 'journal.sync_data' are the same key" in log.read_text()


def test_an_unknown_dotted_key_names_the_nearest(tmp_path: Path) -> None:
    log = tmp_path / "bookie.log"
    proc = start_process(_argv(tmp_path, "--set", "journal.sync_dat=false"), log)
    try:
        assert proc.wait(30) == EXIT_USAGE
    finally:
        stop_process(proc)
    assert "did you mean journal.sync_data" in log.read_text()
