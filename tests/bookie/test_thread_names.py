"""A running bookie's actor threads carry their names in the kernel (/proc/.../comm), so
``top -H``, ``strace -f`` and ``perf`` tell the journal from the Server; with ``actor_cpus``
those threads, and only those, are confined to the CPUs it names."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from helpers.procs import free_port

from zbk.bookie.process import Bookie
from zbk.config import BookieConfig, HttpConfig
from zbk.osthread import name_current_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_NAME) is Linux's")


def _threads() -> dict[str, set[int]]:
    """kernel name -> thread ids of this process."""
    out: dict[str, set[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.setdefault(f.read().strip(), set()).add(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _kernel_names() -> set[str]:
    return set(_threads())


ACTORS = ("zbk-journal", "zbk-entrylogger", "zbk-index", "zbk-server", "zbk-gc")


def test_name_current_thread_sets_and_cuts_the_kernel_name() -> None:
    seen: list[str] = []

    def run() -> None:
        assert name_current_thread("zbk-a-name-longer-than-fifteen")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["zbk-a-name-long"]


def test_a_bookies_actor_threads_are_named(tmp_path: Path) -> None:
    cfg = BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path / "bookie"),
                       port=free_port(), http=HttpConfig(port=free_port()))
    bk = Bookie(cfg)
    bk.start()
    try:
        names = _kernel_names()
    finally:
        bk.stop()
    for actor in ACTORS:
        assert actor in names, (actor, sorted(names))
    assert not {"zbk-journal", "zbk-server"} & _kernel_names(), "the threads ended with the bookie"


def test_actor_cpus_confines_the_actor_threads_only(tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    cfg = BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path / "bookie"),
                       port=free_port(), http=HttpConfig(port=free_port()), actor_cpus=str(cpu))
    bk = Bookie(cfg)
    bk.start()
    try:
        threads = _threads()
        for actor in ACTORS:
            for tid in threads[actor]:
                assert os.sched_getaffinity(tid) == {cpu}, actor
        assert os.sched_getaffinity(0) == allowed, "the process (its main thread) is not confined"
    finally:
        bk.stop()
