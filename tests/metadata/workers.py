"""Functions run in spawned processes by the concurrency tests (importable by name)."""

from __future__ import annotations

from zbk.errors import MetadataVersionError
from zbk.metadata.coordination import allocate_ledger_id
from zbk.metadata.uri import open_store


def cas_increments(uri: str, key: str, count: int) -> int:
    """Increment the decimal counter at ``key`` ``count`` times by raw get + cas, retrying
    each lost race; returns how many conflicts it saw."""
    store = open_store(uri)
    conflicts = 0
    try:
        done = 0
        while done < count:
            kv = store.get(key)
            assert kv is not None
            try:
                store.cas(key, str(int(kv.value) + 1).encode(), kv.version)
                done += 1
            except MetadataVersionError:
                conflicts += 1
    finally:
        store.close()
    return conflicts


def allocate_ids(uri: str, count: int) -> list[int]:
    store = open_store(uri)
    try:
        return [allocate_ledger_id(store) for _ in range(count)]
    finally:
        store.close()


def open_and_put(uri: str, key: str) -> int:
    """Open a (possibly brand-new) store and write one key; returns its version."""
    store = open_store(uri)
    try:
        return store.put(key, b"x")
    finally:
        store.close()
