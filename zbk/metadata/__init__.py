"""Metadata: the MetadataStore protocol, its drivers (etcd, embedded sqlite) and the models
stored in it (ledger metadata, bookie registrations, cookies)."""

from zbk.metadata.store import KeyValue, MetadataStore, Watch, WatchEvent, iter_prefix

__all__ = ["KeyValue", "MetadataStore", "Watch", "WatchEvent", "iter_prefix"]
