"""Which file systems a bookie trusts to make an index checkpoint durable with one syncfs.

Linux forwards syncfs to no FUSE daemon but virtiofs's: on FUSE a syncfs returns 0 and
makes nothing durable, so the ledger cache must fsync each index file there. The power-cut
behaviour itself is tested on a real FUSE mount in tests/faults/test_powerloss.py.
"""

from __future__ import annotations

import logging
import os

from zbk.storage import ledgercache
from zbk.storage.disk import mountinfo_fs_type, syncfs_untrusted_fs
from zbk.storage.ledgercache import LedgerCache

MOUNTINFO = "\n".join([
    "22 27 0:21 / /proc rw,relatime - proc proc rw",
    "27 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
    "40 27 8:17 / /data rw,relatime shared:7 master:2 - xfs /dev/sdb1 rw",
    "54 40 0:40 / /data/bookie rw,nosuid,nodev,relatime - fuse.powerloss powerloss rw,user_id=0",
    "55 27 0:41 / /mnt/with\\040space rw - fuseblk /dev/sdc1 rw",
    "56 27 8:17 /sub /bind rw - xfs /dev/sdb1 rw",
    "57 27 0:42 / /odd rw",  # no separator: skipped
])


def test_the_mount_of_the_device_names_the_file_system():
    assert mountinfo_fs_type(MOUNTINFO, (0, 40), "/data/bookie/journal") == "fuse.powerloss"
    assert mountinfo_fs_type(MOUNTINFO, (8, 17), "/bind/x") == "xfs"
    assert mountinfo_fs_type(MOUNTINFO, (8, 1), "/home/x") == "ext4"


def test_an_unknown_device_falls_back_to_the_deepest_mount_point_above_the_path():
    # btrfs subvolumes, for one, report devices that mountinfo does not list.
    assert mountinfo_fs_type(MOUNTINFO, (0, 99), "/data/bookie/index") == "fuse.powerloss"
    assert mountinfo_fs_type(MOUNTINFO, (0, 99), "/data/bookiex") == "xfs"
    assert mountinfo_fs_type(MOUNTINFO, (0, 99), "/mnt/with space/d") == "fuseblk"
    assert mountinfo_fs_type(MOUNTINFO, (0, 99), "/srv") == "ext4"
    assert mountinfo_fs_type("", (0, 99), "/srv") is None


def test_a_local_directory_is_trusted(tmp_path):
    assert syncfs_untrusted_fs(str(tmp_path)) is None
    assert syncfs_untrusted_fs(str(tmp_path / "missing")) is None  # unknown: as before


def test_the_ledger_cache_fsyncs_each_file_where_syncfs_is_not_trusted(tmp_path, monkeypatch, caplog):
    asked: list[str] = []

    def fuse_below_b(path: str) -> str | None:
        asked.append(path)
        return "fuse.test" if os.path.basename(path) == "b" else None

    monkeypatch.setattr(ledgercache, "SYNCFS_REPORTS_ERRORS", True)
    monkeypatch.setattr(ledgercache, "syncfs_untrusted_fs", fuse_below_b)
    with caplog.at_level(logging.WARNING, logger="zbk.storage.ledgercache"):
        assert LedgerCache([str(tmp_path / "a")]).sync_mode == "syncfs"
        assert not caplog.records
        cache = LedgerCache([str(tmp_path / "a"), str(tmp_path / "b")])
    assert cache.sync_mode == "fsync"
    assert [r.getMessage() for r in caplog.records] == [
        f"index: syncfs cannot be trusted on {tmp_path / 'b'} (fuse.test), so checkpoints fsync each "
        "index file (a syncfs reaches no FUSE daemon)"]
    assert LedgerCache([str(tmp_path / "b")], syncfs=False).sync_mode == "fsync"
    assert asked == [str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "b")], \
        "index_flush_syncfs = false asks nothing"
