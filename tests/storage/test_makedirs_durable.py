"""New data directories are made durable: the parent of each one created is fsynced.

Without it, a power cut soon after a bookie's first boot took its journal, ledger and
index directories away, cookies and all (found on the power-loss layer, see
tests/faults/test_powerloss_bookie.py)."""

from __future__ import annotations

from zbk.storage.disk import RealDisk, makedirs_durable


class RecordingDisk(RealDisk):
    def __init__(self) -> None:
        self.dir_fsyncs: list[str] = []

    def fsync_dir(self, path: str) -> None:
        self.dir_fsyncs.append(path)
        super().fsync_dir(path)


def test_the_parent_of_every_directory_created_is_fsynced_top_down(tmp_path):
    disk = RecordingDisk()
    makedirs_durable(str(tmp_path / "a" / "b" / "c"), disk)
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert disk.dir_fsyncs == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]


def test_existing_directories_cost_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    disk = RecordingDisk()
    makedirs_durable(str(tmp_path / "a"), disk)
    makedirs_durable(str(tmp_path / "a" / "new"), disk)
    assert disk.dir_fsyncs == [str(tmp_path / "a")]
