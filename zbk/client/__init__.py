"""The zbk client: AsyncBookKeeper (asyncio core) and BookKeeper (synchronous facade)."""

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.handles import LedgerEntry, LedgerHandle, ReadHandle
from zbk.client.sync import BookKeeper, SyncLedgerHandle, SyncReadHandle

__all__ = ["AsyncBookKeeper", "BookKeeper", "LedgerEntry", "LedgerHandle", "ReadHandle", "SyncLedgerHandle",
           "SyncReadHandle"]
