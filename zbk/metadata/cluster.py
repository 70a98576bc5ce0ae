"""A cluster's metadata as a whole: create it (``initnewcluster``), delete it (``nukeexistingcluster``).

A cluster is everything below one store's scope. A new one gets ``layout`` (the layout
version, decimal ASCII) and ``instanceid``; bookies also create the instance id on first
boot, so a cluster that was never initialized explicitly works the same.

Deleting refuses, as BookKeeper does, while any bookie is registered (writable or
read-only): a live bookie would keep writing into a cluster that no longer exists. It also
wants proof that the caller means this cluster: ``force``, or the cluster's instance id.
"""

from __future__ import annotations

import uuid

from zbk import limits
from zbk.errors import KeyExistsError, OperationRefusedError
from zbk.metadata import layout
from zbk.metadata.registry import list_bookies
from zbk.metadata.store import MetadataStore

LAYOUT_VERSION = 1


def init_new_cluster(store: MetadataStore) -> str:
    """Create a cluster in an empty scope; returns its instance id. OperationRefusedError
    if the scope holds anything (an existing cluster, or the remains of a failed init)."""
    existing = store.list("", limit=1)
    if existing:
        raise OperationRefusedError(f"{store.uri} already holds a cluster (key {existing[0].key!r}); "
                                    "nuke it first (nukeexistingcluster) to start over")
    try:
        store.create(layout.LAYOUT, str(LAYOUT_VERSION).encode("ascii"))
    except KeyExistsError:
        raise OperationRefusedError(f"{store.uri}: another process initialized the cluster meanwhile") from None
    instance_id = uuid.uuid4().hex
    try:
        store.create(layout.INSTANCE_ID, instance_id.encode("ascii"))
    except KeyExistsError:  # a bookie booting at this moment made one: that is the cluster's id now
        kv = store.get(layout.INSTANCE_ID)
        assert kv is not None, "instance id vanished right after a create found it"
        instance_id = kv.value.decode("ascii", "replace")
    return instance_id


def count_keys(store: MetadataStore) -> int:
    n = 0
    after: str | None = None
    while True:
        page = store.list("", start_after=after)
        n += len(page)
        if len(page) < limits.metadata_list_page_keys:
            return n
        after = page[-1].key


def nuke_cluster(store: MetadataStore, *, force: bool = False, instance_id: str | None = None) -> int:
    """Delete every key of the cluster; returns how many. Without ``force`` the caller must
    give the cluster's ``instance_id``; either way nothing is deleted while a bookie is
    registered (OperationRefusedError, nothing changed)."""
    kv = store.get(layout.INSTANCE_ID)
    current = kv.value.decode("ascii", "replace") if kv is not None else None
    if not force:
        if instance_id is None:
            raise OperationRefusedError(f"refusing to delete the {count_keys(store)} keys of the cluster in "
                                        f"{store.uri} without --force (or --instanceid ID, the cluster's id)")
        if instance_id != current:
            raise OperationRefusedError(f"{store.uri} holds cluster {current or '(no instance id)'}, "
                                        f"not {instance_id}: nothing deleted")
    alive = [r.bookie_id for r in list_bookies(store)] + [r.bookie_id for r in list_bookies(store, readonly=True)]
    if alive:
        raise OperationRefusedError(f"bookies are still registered in this cluster ({', '.join(sorted(alive))}); "
                                    "stop every bookie before nuking it: nothing deleted")
    deleted = 0
    while True:
        page = store.list("", limit=limits.metadata_list_page_keys)
        if not page:
            return deleted
        for item in page:
            deleted += store.delete(item.key)
