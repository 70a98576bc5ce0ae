"""zbk: a replicated, durable log store in the design of Apache BookKeeper.

    import zbk
    with zbk.BookKeeper("sqlite:///var/zbk/meta.db") as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        lh.append(b"payload")

The client classes load lazily, so that importing ``zbk.errors`` or ``zbk.metadata`` does
not pull in ZeroMQ or asyncio machinery.
"""

from __future__ import annotations

from typing import Any

from zbk import errors

__version__ = "0.1.0"
__all__ = ["AsyncBookKeeper", "BookKeeper", "errors", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("BookKeeper", "AsyncBookKeeper"):
        from zbk import client

        return getattr(client, name)
    raise AttributeError(f"module 'zbk' has no attribute {name!r}")
