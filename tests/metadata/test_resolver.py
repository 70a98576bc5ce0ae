"""Bookie registrations with an address, and the resolver from bookie id to address
(zbk/metadata/resolver.py), on the in-process metadata store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import cbor2
import pytest

from zbk.errors import BookieUnavailableError, CorruptMetadataError
from zbk.metadata import layout
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import BookieRegistration, list_bookies, read_registration, register_bookie
from zbk.metadata.resolver import BookieResolver, resolve


class CountingStore(MemoryMetadataStore):
    """Counts the reads of registration keys, to show which calls read metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: str) -> Any:
        if key.startswith("bookies/"):
            self.reads += 1
        return super().get(key)


@pytest.fixture
def store() -> Iterator[CountingStore]:
    s = CountingStore()
    try:
        yield s
    finally:
        s.close()


def publish(store: CountingStore, reg: BookieRegistration) -> None:
    register_bookie(store, reg, store.grant_lease(60))


# -- registration encoding -------------------------------------------------------------------------
def test_a_registration_carries_its_address_and_older_ones_decode_as_their_id() -> None:
    reg = BookieRegistration("bookie-a", rack="r1", address="127.0.0.1:4000")
    raw = cbor2.loads(reg.encode())
    assert raw["ad"] == "127.0.0.1:4000" and raw["id"] == "bookie-a"
    back = BookieRegistration.decode(reg.encode(), bookie_id="bookie-a")
    assert back == reg and back.wire_address == "127.0.0.1:4000"
    # An older bookie's registration: no "ad" key at all, and its id is its address.
    old = cbor2.dumps({k: v for k, v in cbor2.loads(BookieRegistration("127.0.0.1:3181").encode()).items()
                       if k != "ad"})
    decoded = BookieRegistration.decode(old, bookie_id="127.0.0.1:3181")
    assert (decoded.address, decoded.wire_address) == ("", "127.0.0.1:3181")
    # Without an address the encoding is byte for byte the older one.
    assert "ad" not in cbor2.loads(dataclasses.replace(reg, address="").encode())
    with pytest.raises(CorruptMetadataError, match="ad"):
        BookieRegistration.decode(cbor2.dumps({**raw, "ad": 4000}))


def test_read_registration_finds_writable_then_readonly(store: CountingStore) -> None:
    assert read_registration(store, "bookie-a") is None
    publish(store, BookieRegistration("bookie-a", state="readonly", address="127.0.0.1:4000"))
    got = read_registration(store, "bookie-a")
    assert got is not None and got.state == "readonly" and got.address == "127.0.0.1:4000"
    store.put(layout.writable_key("bookie-b"), b"\x01garbage")
    with pytest.raises(CorruptMetadataError, match="bookie-b"):
        read_registration(store, "bookie-b")


# -- the resolver ------------------------------------------------------------------------------------
def test_a_name_id_resolves_to_its_registered_address(store: CountingStore) -> None:
    r = BookieResolver(store)
    assert r.cached("bookie-a") is None
    with pytest.raises(BookieUnavailableError, match="bookie-a is not registered"):
        r.address("bookie-a")
    assert r.refresh("bookie-a") is None  # a name with no registration has no address
    publish(store, BookieRegistration("bookie-a", address="127.0.0.1:4000"))
    assert r.address("bookie-a") == "127.0.0.1:4000"
    reads = store.reads
    for _ in range(100):
        assert r.address("bookie-a") == "127.0.0.1:4000"
    assert store.reads == reads, "a cached address is not read again"
    assert resolve(store, "bookie-a") == "127.0.0.1:4000"


def test_refresh_follows_a_bookie_to_its_new_address_and_forgets_a_gone_one(store: CountingStore) -> None:
    r = BookieResolver(store)
    publish(store, BookieRegistration("bookie-a", address="127.0.0.1:4000"))
    assert r.address("bookie-a") == "127.0.0.1:4000"
    store.delete(layout.writable_key("bookie-a"))  # stopped: unregistered
    assert r.cached("bookie-a") == "127.0.0.1:4000", "the cache only changes when asked to"
    assert r.refresh("bookie-a") is None and r.cached("bookie-a") is None
    publish(store, BookieRegistration("bookie-a", address="127.0.0.1:5000"))  # back, on a new port
    assert r.refresh("bookie-a") == "127.0.0.1:5000"
    assert r.cached("bookie-a") == "127.0.0.1:5000"


def test_host_port_ids_fall_back_to_themselves(store: CountingStore) -> None:
    r = BookieResolver(store)
    assert r.address("127.0.0.1:3181") == "127.0.0.1:3181"  # unregistered: tried at its id
    assert r.cached("127.0.0.1:3181") is None, "a guess is not cached"
    # An older bookie's registration (no address), and a host:port bookie that advertises
    # another address: the registration wins.
    store.put(layout.writable_key("127.0.0.1:3182"),
              cbor2.dumps({k: v for k, v in cbor2.loads(BookieRegistration("127.0.0.1:3182").encode()).items()
                           if k != "ad"}))
    assert r.refresh("127.0.0.1:3182") == "127.0.0.1:3182"
    publish(store, BookieRegistration("10.0.0.1:3183", address="127.0.0.7:3183"))
    assert r.address("10.0.0.1:3183") == "127.0.0.7:3183"


def test_undecodable_or_addressless_registrations_count_as_absent(store: CountingStore) -> None:
    r = BookieResolver(store)
    store.put(layout.writable_key("bookie-x"), b"\x01garbage")
    assert r.refresh("bookie-x") is None
    store.put(layout.writable_key("127.0.0.1:3190"), b"\x01garbage")
    assert r.refresh("127.0.0.1:3190") == "127.0.0.1:3190"
    # A name-id registration without an address (a broken writer): no address to use.
    publish(store, BookieRegistration("bookie-y"))
    assert r.refresh("bookie-y") is None
    publish(store, BookieRegistration("bookie-z", address="not an address"))
    assert r.refresh("bookie-z") is None


def test_learn_takes_the_addresses_of_a_listing(store: CountingStore) -> None:
    for i, name in enumerate(("bookie-a", "bookie-b")):
        publish(store, BookieRegistration(name, address=f"127.0.0.1:{4000 + i}"))
    publish(store, BookieRegistration("bookie-c"))  # no address: not learnt
    r = BookieResolver(store)
    r.learn(list_bookies(store))
    reads = store.reads
    assert (r.cached("bookie-a"), r.cached("bookie-b"), r.cached("bookie-c")) == ("127.0.0.1:4000",
                                                                                   "127.0.0.1:4001", None)
    assert r.address("bookie-b") == "127.0.0.1:4001"
    assert store.reads == reads
