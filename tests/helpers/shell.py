"""`zbk shell` run as users run it: the real CLI in a child process (ended by the timeout)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def shell(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``zbk shell ARGS...``: its exit code, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "zbk.cli.main", "shell", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def shell_json(*args: str, code: int = 0, timeout_s: float = 120) -> Any:
    """``zbk shell ARGS... --json``, which must exit with ``code``: its output, decoded."""
    r = shell(*args, "--json", timeout_s=timeout_s)
    assert r.returncode == code, (args, r.returncode, r.stdout[-500:], r.stderr[-1000:])
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def refused(r: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """The command failed with exit code ``code``, one clear line naming ``words``, no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-1000:])
    assert "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
