"""What writing into new page-cache pages costs on the machine it runs on, against dropping
one's own pages behind the writer (docs/performance.md, "The machine" and "Storage").

A sequential writer of ``--gb`` GiB in 64 KiB writes, with ``sync_file_range`` writeback
started every 4 MiB as the entry logger does (``flush_entry_log_bytes``), prints its wall,
user and system time per GiB. ``keep`` leaves every page cached (what an entry logger does
with ``entry_log_keep_cached_mb = 0``); ``drop`` makes the data durable and drops the pages
``--lag-mb`` behind itself (``fdatasync`` + ``POSIX_FADV_DONTNEED``), so the kernel hands the
same memory back to the next writes. On a VM whose balloon reports free memory to the host,
``keep`` turns slow once the memory the guest had touched runs out; ``drop`` does not.

    .venv/bin/python bench/pagecache.py --gb 6 --mode both

The file is written in ``--dir`` (default: a new directory under the system's temporary
directory) and removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import tempfile
import time
from typing import Any

_GIB = 1 << 30
_MIB = 1 << 20
_CHUNK = 64 * 1024
_WRITEBACK_STEP = 4 * _MIB
_SYNC_FILE_RANGE_WRITE = 2


_LIBC = ctypes.CDLL(None, use_errno=True)


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    _LIBC.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(nbytes), ctypes.c_uint(_SYNC_FILE_RANGE_WRITE))


def run(path: str, gb: float, mode: str, lag: int) -> list[dict[str, Any]]:
    chunk = b"x" * _CHUNK
    out: list[dict[str, Any]] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = dropped = 0
        mark_t, mark_r = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        while written < gb * _GIB:
            os.write(fd, chunk)
            written += _CHUNK
            if written % _WRITEBACK_STEP == 0:
                _start_writeback(fd, written - _WRITEBACK_STEP, _WRITEBACK_STEP)
                if mode == "drop" and written - dropped > lag + _WRITEBACK_STEP:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, dropped, written - lag - dropped, os.POSIX_FADV_DONTNEED)
                    dropped = written - lag
            if written % _GIB == 0:
                t, r = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                row = {"mode": mode, "gib": written // _GIB, "wall_s": round(t - mark_t, 3),
                       "user_s": round(r.ru_utime - mark_r.ru_utime, 3),
                       "sys_s": round(r.ru_stime - mark_r.ru_stime, 3)}
                print(f"{mode:>4} GiB {row['gib']}: wall {row['wall_s']:.2f} s, user {row['user_s']:.2f} s, "
                      f"system {row['sys_s']:.2f} s", flush=True)
                out.append(row)
                mark_t, mark_r = t, r
    finally:
        os.close(fd)
        os.unlink(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=6.0, help="GiB written per mode")
    ap.add_argument("--mode", choices=("keep", "drop", "both"), default="both")
    ap.add_argument("--lag-mb", type=int, default=256, help="drop: pages this far behind the writer are dropped")
    ap.add_argument("--dir", default=None, help="where to write (default: a new temporary directory)")
    a = ap.parse_args()
    own_dir = a.dir is None
    directory = tempfile.mkdtemp(prefix="zbk-pagecache-") if own_dir else a.dir
    try:
        rows: list[dict[str, Any]] = []
        for mode in (("keep", "drop") if a.mode == "both" else (a.mode,)):
            rows += run(os.path.join(directory, f"pagecache-{mode}.dat"), a.gb, mode, a.lag_mb * _MIB)
        print(json.dumps({"bench": "pagecache", "gb": a.gb, "lag_mb": a.lag_mb, "rows": rows}))
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
