"""Metadata: the MetadataStore protocol, its drivers (etcd, embedded sqlite) and the models
stored in it (ledger metadata, bookie registrations, cookies)."""

from zbk.metadata.store import KeyValue, MetadataStore, Watch, WatchEvent, iter_prefix

__all__ = ["KeyValue", "MetadataStore", "Watch", "WatchEvent", "iter_prefix"]

# Drivers load lazily inside open_store (the etcd driver pulls in grpc and protobuf).
from zbk.metadata.coordination import (  # noqa: E402
    LeaderElection,
    LeaseKeeper,
    LeaseLock,
    allocate_ledger_id,
    cas_retry,
)
from zbk.metadata.registry import (  # noqa: E402
    BookieRegistration,
    Cookie,
    LedgerStore,
    get_or_create_instance_id,
    list_bookies,
    register_bookie,
)
from zbk.metadata.uri import open_store, parse_uri  # noqa: E402

__all__ += [
    "open_store", "parse_uri", "LeaderElection", "LeaseKeeper", "LeaseLock", "allocate_ledger_id",
    "cas_retry", "BookieRegistration", "Cookie", "LedgerStore", "get_or_create_instance_id",
    "list_bookies", "register_bookie",
]
