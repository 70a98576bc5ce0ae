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
        asyncio.run(_delete(zc.metadata, gone))
        time.sleep(1.5)  # checkpoints: only logs one has flushed are candidates (zbk/actors/gc.py)
        before = _logs(zc)
        assert all(len(logs) >= 4 for logs in before), before
        assert zc.collect_garbage(timeout_s=60) < 60
        after = _logs(zc)
        for b, was, now in zip(zc.bookies, before, after, strict=True):
            assert now < was, f"{b.name}: no log removed ({sorted(was)})"
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
