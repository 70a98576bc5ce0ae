"""bench/_procs.py's ZbkCluster.collect_garbage, which bench/openloop.py runs between runs so
that a long ladder does not fill its disk: against real bookie processes, it gives back the
entry logs of a deleted ledger and keeps those of a live one."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _procs import ZbkCluster  # noqa: E402

PASSWORD = b"collect-garbage"


async def _write(metadata: str, entries: int) -> int:
    from zbk.client.bookkeeper import AsyncBookKeeper

    async with AsyncBookKeeper(metadata) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        payload = os.urandom(1024)
        for start in range(0, entries, 500):
            await asyncio.gather(*(lh.append(payload) for _ in range(min(500, entries - start))))
        await lh.close()
        return lh.ledger_id


async def _delete(metadata: str, ledger_id: int) -> None:
    from zbk.client.bookkeeper import AsyncBookKeeper

    async with AsyncBookKeeper(metadata) as bk:
        await bk.delete_ledger(ledger_id)


def _logs(zc: ZbkCluster) -> list[set[str]]:
    return [{p.name for p in (b.data_dir / "ledgers").glob("*.log")} for b in zc.bookies]


def test_collect_garbage_removes_the_logs_of_a_deleted_ledger_and_keeps_a_live_one(tmp_path: Path) -> None:
    settings = {"entry_log_size_limit_mb": 1, "flush_interval_ms": 300}
    with ZbkCluster(3, settings=settings, root=tmp_path) as zc:
        gone = asyncio.run(_write(zc.metadata, 3000))  # about 3 MiB: logs rotated at 1 MiB
        kept = asyncio.run(_write(zc.metadata, 1500))
        before = _logs(zc)
        assert all(len(logs) >= 4 for logs in before), before
        asyncio.run(_delete(zc.metadata, gone))
        # Only logs that a checkpoint has flushed are candidates (zbk/actors/gc.py): the GC
        # runs again, every 0.5 s, until one has on every bookie.
        deadline = time.monotonic() + 30
        while True:
            assert zc.collect_garbage(timeout_s=30) < 30
            for b in zc.bookies:  # it returns once no bookie is in a GC run any more
                assert not b.gc_running()
            after = _logs(zc)
            if all(was - now for was, now in zip(before, after, strict=True)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for b, was, now in zip(zc.bookies, before, after, strict=True):
            assert was - now, f"{b.name}: no log removed in 30 s ({sorted(was)})"
        # The live ledger is whole: every entry reads back.

        async def read_all() -> int:
            from zbk.client.bookkeeper import AsyncBookKeeper

            async with AsyncBookKeeper(zc.metadata) as bk:
                rh = await bk.open_ledger(kept, password=PASSWORD)
                n = 0
                async for _ in rh.read(0, rh.last_add_confirmed):
                    n += 1
                return n

        assert asyncio.run(read_all()) == 1500
