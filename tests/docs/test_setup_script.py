"""scripts/setup.sh (run by scripts/demo.sh and .ci/run): a failed pip install stops it,
and a .venv without pip is used as it is (the docs test runs demo.sh in such a workspace)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from docs.runner import Workspace
from docs.test_doc_commands import REPO


def setup(tmp_path: Path, pip: str | None) -> subprocess.CompletedProcess[str]:
    ws = Workspace(REPO, tmp_path)
    if pip is not None:
        (ws.bin / "pip").write_text(pip)
        (ws.bin / "pip").chmod(0o755)
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=ws.root, env=ws.env, capture_output=True,
                          text=True, timeout=120)


def test_a_failed_pip_install_stops_the_setup(tmp_path: Path) -> None:
    res = setup(tmp_path, "#!/bin/sh\necho 'ERROR: no route to the index' >&2\nexit 1\n")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no route to the index" in res.stdout + res.stderr
    assert "setup: pip install failed" in res.stderr


def test_pip_warnings_are_filtered_and_a_good_install_passes(tmp_path: Path) -> None:
    res = setup(tmp_path, "#!/bin/sh\necho 'WARNING: Location of something'\necho 'installed'\n")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "installed" in res.stdout and "WARNING: Location" not in res.stdout


def test_a_venv_without_pip_is_used_as_it_is(tmp_path: Path) -> None:
    res = setup(tmp_path, None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "setup: .venv has no pip; using it as it is" in res.stdout
