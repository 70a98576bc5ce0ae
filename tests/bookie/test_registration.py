"""A bookie's registration at boot survives its own new lease expiring before first use
(a loaded metadata store answered a keep-alive too late: seen in a chaos run, where a
restarted bookie then exited with "requested lease not found")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.procs import free_port

import zbk.bookie.registration as bookie_module
from zbk.bookie.process import Bookie
from zbk.config import BookieConfig, HttpConfig
from zbk.metadata import layout
from zbk.metadata.uri import open_store


def test_a_lease_that_expired_before_the_registration_is_replaced(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    expired: list[int] = []
    real = bookie_module.register_bookie

    def first_lease_expires(store: Any, reg: Any, lease: int) -> int:
        if not expired:
            expired.append(lease)
            store.revoke_lease(lease)  # as if the store had let it expire
        return real(store, reg, lease)

    monkeypatch.setattr(bookie_module, "register_bookie", first_lease_expires)
    cfg = BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path / "bookie"),
                       port=free_port(), http=HttpConfig(port=free_port()), registration_ttl_s=2)
    bk = Bookie(cfg)
    bk.start()
    store = open_store(cfg.metadata_uri)
    try:
        kv = store.get(layout.writable_key(bk.cfg.bookie_id))
        assert kv is not None, "registered"
        assert expired and kv.lease not in (None, expired[0]), "on a new lease"
    finally:
        store.close()
        bk.stop()
