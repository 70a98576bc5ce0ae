"""What ``import zbk`` gives: the clients, their handles, the config classes and the error
module, the classes loaded only when first used."""

from __future__ import annotations

import subprocess
import sys

import zbk
import zbk.client
import zbk.config


def test_every_exported_name_resolves_to_its_defining_class() -> None:
    assert sorted(zbk.__all__) == sorted({*zbk._LAZY, "errors", "__version__"})
    for name in ("BookKeeper", "AsyncBookKeeper", "LedgerHandle", "ReadHandle", "SyncLedgerHandle",
                 "SyncReadHandle", "LedgerEntry"):
        assert getattr(zbk, name) is getattr(zbk.client, name), name
    for name in ("ClientConfig", "BookieConfig", "AutoRecoveryConfig", "JournalConfig", "EntryLogConfig",
                 "IndexConfig", "GcConfig", "DiskConfig", "RecoveryConfig", "CurveConfig", "HttpConfig"):
        assert getattr(zbk, name) is getattr(zbk.config, name), name
    assert set(zbk.__all__) <= set(dir(zbk))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        zbk.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "no attribute 'NoSuchThing'" in str(e)
    else:
        raise AssertionError("zbk.NoSuchThing resolved")


def test_importing_zbk_or_its_config_classes_loads_no_zeromq() -> None:
    code = ("import sys, zbk, zbk.errors; zbk.ClientConfig; zbk.BookieConfig; "
            "assert 'zmq' not in sys.modules, 'zmq loaded'; zbk.BookKeeper; assert 'zmq' in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
