"""A short coverage-guided atheris run on the frame decoder (tests/wire/atheris_codec.py).

Seeded with valid messages of every type, then ATHERIS_RUNS mutated inputs (default 5000,
a few seconds). The libFuzzer seed is printed; set ZBK_SEED to replay a run. Skipped only
when atheris cannot be imported (it is in the dev extra; it ships wheels for CPython 3.11
on x86-64 Linux).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TARGET = HERE / "atheris_codec.py"


def _require_atheris() -> None:
    try:
        import atheris  # noqa: F401
    except ImportError as e:
        pytest.skip(f"atheris is not installed ({e}); pip install atheris (dev extra) to run the fuzzer")


def test_atheris_frame_decoder_short_run(tmp_path: Path) -> None:
    _require_atheris()
    runs = int(os.environ.get("ATHERIS_RUNS", "5000"))
    seed = int(os.environ.get("ZBK_SEED", random.randrange(1, 1 << 30)))
    print(f"ZBK_SEED={seed} ATHERIS_RUNS={runs}")
    corpus = tmp_path / "corpus"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent.parent), str(HERE)]))
    seeds = subprocess.run([sys.executable, str(TARGET), "--write-seeds", str(corpus)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert seeds.returncode == 0, seeds.stderr
    assert len(list(corpus.iterdir())) >= 4 * 19 - 10, "seed corpus too small"
    proc = subprocess.run([sys.executable, str(TARGET), f"-runs={runs}", f"-seed={seed}", "-max_len=4096",
                           "-rss_limit_mb=2048", str(corpus)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert proc.returncode == 0 and not crashes, f"fuzzer failed (seed {seed}), inputs {crashes}:\n{out[-4000:]}"
    assert f"Done {runs} runs" in out, out[-2000:]
