"""zbk.wire re-exports its public names without an import cycle through zbk.errors."""

from __future__ import annotations

import subprocess
import sys

import zbk.wire


def test_every_exported_name_resolves() -> None:
    for name in zbk.wire.__all__:
        assert getattr(zbk.wire, name) is not None, name


def test_errors_then_wire_imports_cleanly_in_a_fresh_interpreter() -> None:
    code = "import zbk.errors, zbk.wire.status; from zbk.wire import FrameError, encode; print(FrameError.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "FrameError"
