"""A port someone else listens on stops a `zbk bookie` or `zbk autorecovery` process with one
clear line naming the address and the setting, not a traceback; a bookie whose wire port was
taken served nothing, so it stops cleanly (no dirty marker: its next boot is a clean one)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.bookie import BookieProcess
from helpers.procs import free_port, start_process, stop_process, tail

from zbk.errors import EXIT_BOOT, EXIT_USAGE
from zbk.storage.markers import was_dirty


@contextmanager
def listening(port: int) -> Iterator[None]:
    """Another process's server on ``port`` (as a server binds: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def test_a_taken_wire_port_stops_the_bookie_cleanly_and_it_boots_clean_once_the_port_is_free(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/meta.db"
    bookie = BookieProcess(tmp_path, uri)
    try:
        with listening(bookie.port):
            bookie.start(wait=False)
            assert bookie.exit_code(30) == EXIT_BOOT, tail(bookie.log)
        text = bookie.log.read_text()
        assert f"cannot listen on tcp://127.0.0.1:{bookie.port} (port): Address already in use" in text, text
        assert "Traceback" not in text, text
        assert "stopped cleanly" in text, text
        assert not was_dirty(str(bookie.data_dir / "index")), "a bookie that served nothing left its dirty marker"
        bookie.start()  # the port is free now: the same bookie boots, clean, and registers
        assert "unclean=False" in bookie.log.read_text().split("stopped cleanly")[-1], tail(bookie.log)
    finally:
        bookie.stop()


def test_a_taken_http_port_stops_the_bookie_at_boot(tmp_path: Path) -> None:
    bookie = BookieProcess(tmp_path, f"sqlite:///{tmp_path}/meta.db")
    try:
        with listening(bookie.http_port):
            bookie.start(wait=False)
            assert bookie.exit_code(30) == EXIT_BOOT, tail(bookie.log)
    finally:
        bookie.stop()
    text = bookie.log.read_text()
    assert f"cannot listen on http://127.0.0.1:{bookie.http_port} (http_port): Address already in use" in text, text
    assert "Traceback" not in text, text


def test_a_taken_http_port_is_a_usage_error_of_autorecovery(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "autorecovery.log"
    with listening(port):
        proc = start_process([sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata",
                              f"sqlite:///{tmp_path}/meta.db", "--http-port", str(port)], log)
        try:
            assert proc.wait(30) == EXIT_USAGE, tail(log)
        finally:
            stop_process(proc)
    text = log.read_text()
    assert f"zbk: CONFIG: cannot listen on http://127.0.0.1:{port} (http_port): Address already in use" in text, text
    assert "Traceback" not in text, text
