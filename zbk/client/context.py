"""What ledger handles need from their client: ``HandleContext``.

A Protocol, not the client's own class (zbk.client.bookkeeper.ClientContext, which
satisfies it): the handles, the add dispatcher and ledger recovery depend on this module
only, so none of them imports the client that creates them.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any, Protocol

from zbk.client.digest import Digest
from zbk.client.transport import Transport
from zbk.config import ClientConfig
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration

# A write set: ((bookie, bit), ...) and the mask of their bits (AddDispatcher.bit).
WriteSet = tuple[tuple[tuple[str, int], ...], int]


class Placement(Protocol):
    """The client's placement (zbk.client.placement) with its policy and random source."""

    def choose_ensemble(self, bookies: list[BookieRegistration], size: int, write_quorum: int) -> list[str]: ...

    def replace(self, bookies: list[BookieRegistration], md: LedgerMetadata, ensemble: list[str],
                positions: Sequence[int], *, exclude: Set[str]) -> list[str]:
        """``ensemble`` with new bookies at ``positions``, under ``md``'s own policy."""
        ...


class AddScheduler(Protocol):
    """The add dispatcher as a LedgerHandle sees it (zbk.client.dispatch.AddDispatcher)."""

    def bit(self, bookie: str) -> int: ...

    def rotations(self, ensemble: Sequence[str], write_quorum: int) -> tuple[WriteSet, ...]: ...

    def write_set_of(self, bookies: Sequence[str]) -> WriteSet: ...

    # ``handle`` is a LedgerHandle; typed Any because that class depends on this module, and
    # naming it here would tie the two together again.
    def wake(self, handle: Any) -> None: ...


class LacWatch(Protocol):
    """The explicit-LAC check as a LedgerHandle sees it (zbk.client.explicitlac.ExplicitLac)."""

    # ``handle`` is a LedgerHandle, typed Any for the reason given in AddScheduler.
    def note(self, handle: Any) -> None: ...


class HandleContext(Protocol):
    """Transport, metadata, configuration and placement, shared by a client's handles."""

    # Read-only properties: a Protocol attribute would have to be settable, with exactly
    # this type, by every implementation.
    @property
    def transport(self) -> Transport: ...

    @property
    def config(self) -> ClientConfig: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def adds(self) -> AddScheduler: ...

    @property
    def explicit_lac(self) -> LacWatch | None: ...  # None: explicit LAC is off

    @property
    def add_timeout_s(self) -> float: ...

    @property
    def read_timeout_s(self) -> float: ...

    @property
    def speculative_read_s(self) -> float: ...

    def digest_for(self, kind: str, password: bytes) -> Digest: ...

    def master_key_for(self, password: bytes) -> bytes: ...

    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]: ...

    async def write_metadata(self, md: LedgerMetadata, version: int) -> int: ...

    async def writable_bookies(self) -> list[BookieRegistration]: ...

    async def replacements(self, md: LedgerMetadata, ensemble: list[str], positions: Sequence[int], *,
                           exclude: Set[str], first_attempt: bool) -> list[str]:
        """``ensemble`` with new bookies at ``positions`` (zbk.client.bookies says from where)."""
        ...

    def spawn(self, coro: Any) -> None: ...

    def send_write_close(self, md: LedgerMetadata, key: bytes) -> None: ...
