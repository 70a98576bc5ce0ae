"""A closed ``zbk.BookKeeper`` and its handles raise ZbkError ("the client is closed") on
every call: not asyncio's RuntimeError from the stopped loop, and not an append_async
future that never completes. Closing twice is harmless."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import zbk
from zbk.client.sync import SyncLedgerHandle, _LoopThread
from zbk.errors import ZbkError


def test_calls_on_a_closed_client_raise_zbk_error(tmp_path: Path) -> None:
    bk = zbk.BookKeeper(f"sqlite:///{tmp_path}/meta.db")
    assert list(bk.list_ledgers()) == [] and not bk.ledger_exists(1)
    bk.close()
    bk.close()  # again: nothing
    for call in (lambda: bk.list_ledgers(), lambda: bk.create_ledger(password=b"pw"),
                 lambda: bk.open_ledger(1, password=b"pw"), lambda: bk.ledger_metadata(1),
                 lambda: bk.delete_ledger(1), lambda: bk.ledger_exists(1)):
        with pytest.raises(ZbkError, match="the client is closed"):
            call()
    assert not bk._lt.thread.is_alive()  # its loop thread is gone


class _Unreachable:
    """Stands for the asyncio handle: its coroutines and async generators fail if they ever
    run, which a closed client must not let them do."""

    def __getattr__(self, name: str) -> Any:
        async def coroutine(*_a: Any, **_k: Any) -> Any:
            raise AssertionError(f"the handle's {name} ran on a closed client")

        async def generator(*_a: Any, **_k: Any) -> Any:
            raise AssertionError(f"the handle's {name} ran on a closed client")
            yield  # an async generator, as read, read_unconfirmed and tail are

        return generator if name in ("read", "read_unconfirmed", "tail") else coroutine


def test_handle_calls_on_a_closed_client_raise_zbk_error() -> None:
    lt = _LoopThread()
    lt.stop()
    h = SyncLedgerHandle(lt, _Unreachable())  # type: ignore[arg-type]
    fut = h.append_async(b"x")
    with pytest.raises(ZbkError, match="the client is closed"):
        fut.result(timeout=5)  # completed at once, not left pending
    for call in (lambda: h.append(b"x"), lambda: list(h.read(0, 0)), lambda: list(h.read_unconfirmed(0, 0)),
                 lambda: h.read_last_add_confirmed(), lambda: h.force(), lambda: h.close(),
                 lambda: next(h.tail(0))):
        with pytest.raises(ZbkError, match="the client is closed"):
            call()
