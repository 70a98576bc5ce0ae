"""zbk: a replicated, durable log store in the design of Apache BookKeeper.

    import zbk
    with zbk.BookKeeper("sqlite:///var/zbk/meta.db") as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        lh.append(b"payload")

The client classes load lazily, so that importing ``zbk.errors`` or ``zbk.metadata`` does
not pull in ZeroMQ or asyncio machinery.
"""

from __future__ import annotations

import importlib
from typing import Any

from zbk import errors

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first use.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("AsyncBookKeeper", "BookKeeper", "LedgerEntry", "LedgerHandle", "ReadHandle",
                     "SyncLedgerHandle", "SyncReadHandle"), "zbk.client"),
    **dict.fromkeys(("AutoRecoveryConfig", "BookieConfig", "ClientConfig", "CurveConfig", "DiskConfig",
                     "EntryLogConfig", "GcConfig", "HttpConfig", "IndexConfig", "JournalConfig",
                     "RecoveryConfig"), "zbk.config"),
}

__all__ = [
    "AsyncBookKeeper", "AutoRecoveryConfig", "BookKeeper", "BookieConfig", "ClientConfig", "CurveConfig",
    "DiskConfig", "EntryLogConfig", "GcConfig", "HttpConfig", "IndexConfig", "JournalConfig", "LedgerEntry",
    "LedgerHandle", "ReadHandle", "RecoveryConfig", "SyncLedgerHandle", "SyncReadHandle", "errors", "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zbk' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
