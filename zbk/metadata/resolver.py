"""From a bookie id to the address to connect to (BP-41): the one place that decides it.

A bookie's registration (zbk/metadata/registry.py) records its current wire address. The
ensembles of ledger metadata name bookies by id, so whatever contacts a bookie (the client's
transport, auto-recovery through it, the shell's one-bookie commands, the admin API's list
of bookies) asks a :class:`BookieResolver`:

* a registered bookie is at the address its registration records; an older bookie's
  registration records none and its id (host:port) is its address;
* an unregistered bookie whose id is of the form host:port is tried there (it may be
  starting, or its registration may have expired while it still serves);
* an unregistered bookie with a name id has no address: nothing can reach it.

Addresses are cached per id. The cache is filled by listings of the registered bookies (a
client lists them to place ledgers) and by single reads, and a caller that cannot connect
to a bookie calls :meth:`BookieResolver.refresh` to read the registration again: that is
how a bookie restarted at another address under the same id is found again. No request
reads metadata as long as its bookie answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from zbk.bookieid import is_address
from zbk.errors import BookieUnavailableError, CorruptMetadataError
from zbk.metadata.registry import BookieRegistration, read_registration
from zbk.metadata.store import MetadataStore

log = logging.getLogger(__name__)


def registered_address(reg: BookieRegistration) -> str | None:
    """The address ``reg`` names, or None when it names none a socket could connect to (a
    name-id registration without an address: corrupt, or written by a broken bookie)."""
    address = reg.wire_address
    if is_address(address):
        return address
    log.error("registration of bookie %s names no usable address (%r)", reg.bookie_id, address)
    return None


def fallback_address(bookie_id: str) -> str | None:
    """Where to look for an unregistered bookie: at its id if that is host:port, else nowhere."""
    return bookie_id if is_address(bookie_id) else None


class BookieResolver:
    """Bookie id -> wire address, cached; :meth:`refresh` re-reads one registration.

    Thread-safe: the cache is a dict whose single reads and writes the GIL keeps whole, and
    two refreshes of one id racing each other both write what the metadata said."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self._addresses: dict[str, str] = {}  # registered bookies only

    def cached(self, bookie_id: str) -> str | None:
        """The address known for ``bookie_id`` without reading metadata, or None."""
        return self._addresses.get(bookie_id)

    def learn(self, registrations: Iterable[BookieRegistration]) -> None:
        """Take the addresses of registrations read elsewhere (a listing of the bookies)."""
        for reg in registrations:
            address = registered_address(reg)
            if address is not None:
                self._addresses[reg.bookie_id] = address

    def refresh(self, bookie_id: str) -> str | None:
        """Read ``bookie_id``'s registration again: its address, the fallback of an
        unregistered one, or None (a name id nobody has registered). An undecodable
        registration counts as absent. Raises what the metadata store raises when it
        cannot be read."""
        try:
            reg = read_registration(self.store, bookie_id)
        except CorruptMetadataError as e:
            log.error("%s", e)
            reg = None
        address = registered_address(reg) if reg is not None else None
        if address is None:
            self._addresses.pop(bookie_id, None)
            return fallback_address(bookie_id)
        self._addresses[bookie_id] = address
        return address

    def address(self, bookie_id: str) -> str:
        """The address of ``bookie_id``, from the cache or the metadata (blocking);
        BookieUnavailableError if it has none."""
        address = self.cached(bookie_id) or self.refresh(bookie_id)
        if address is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered: no address is known for it")
        return address


def resolve(store: MetadataStore, bookie_id: str) -> str:
    """One bookie's address, read now (the shell's one-bookie commands)."""
    return BookieResolver(store).address(bookie_id)
