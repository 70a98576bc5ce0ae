"""The reads-beside-writes phase of bench/openloop.py: how its target is judged from the
rounds, with the CPU burners' floor reported beside the judgement and never in it, and the
burner worker itself (a real process, stopped by its PID)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import openloop  # noqa: E402

RW = "rw: writers' p99 with readers <= 2 x without (medians of the rounds)"


def run(p99_ms: float) -> dict[str, Any]:
    return {"p99_ms": p99_ms}


def rnd(alone: float, readers: float, burners: float | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"alone": run(alone), "readers": run(readers)}
    if burners is not None:
        r["burners"] = run(burners)
    return r


def test_rw_target_is_judged_on_the_readers_and_reports_the_burners_floor_beside() -> None:
    t = openloop.targets({"rw": {"rounds": [rnd(5.0, 30.0, 9.0), rnd(6.0, 11.0, 20.0), rnd(7.0, 40.0, 10.0)]}})[RW]
    assert t["alone_ms"] == 6.0 and t["readers_ms"] == 30.0
    assert t["met"] is False and t["ratio"] == 5.0
    assert t["burners_ms"] == 10.0 and t["floor_ratio"] == round(10.0 / 6.0, 2)


def test_a_floor_that_misses_does_not_fail_a_target_the_readers_meet() -> None:
    t = openloop.targets({"rw": {"rounds": [rnd(5.0, 9.0, 50.0)] * 3}})[RW]
    assert t["met"] is True and t["floor_ratio"] == 10.0


def test_rounds_without_burners_report_no_floor() -> None:
    t = openloop.targets({"rw": {"rounds": [rnd(5.0, 9.0)] * 3}})[RW]
    assert t["met"] is True and "burners_ms" not in t and "floor_ratio" not in t


def test_a_failed_burner_run_is_left_out_of_the_floor() -> None:
    rounds = [rnd(5.0, 9.0, 8.0), rnd(5.0, 9.0, 12.0), rnd(5.0, 9.0)]
    rounds[2]["burners"] = {"error": "run failed"}
    t = openloop.targets({"rw": {"rounds": rounds}})[RW]
    assert t["burners_ms"] == 10.0


def test_the_burner_takes_no_more_than_its_duty_and_stops_on_sigterm() -> None:
    argv = [sys.executable, openloop.SCRIPT, "--worker", "burn", "--duty", "0.3", "--max-seconds", "60"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    report = json.loads(out.decode().splitlines()[-1])
    assert report["duty"] == 0.3
    assert report["seconds"] < 30  # stopped by the signal, not by --max-seconds
    # Paced by its own CPU time, it cannot take more than its duty (plus a period's slack);
    # how much less it gets depends on the machine, so no lower bound is asserted.
    assert 0 < report["cores"] <= 0.3 + 0.1


def test_worker_logs_go_when_the_phase_ends_and_stay_when_it_fails(tmp_path: Path, monkeypatch: Any,
                                                                    capsys: Any) -> None:
    monkeypatch.setattr(openloop.tempfile, "tempdir", str(tmp_path))
    with openloop.worker_logs("openloop-readers-") as done:
        (done / "reader-0-0.log").write_text("{}\n")
    assert not done.exists()
    with pytest.raises(RuntimeError, match="no report"), openloop.worker_logs("openloop-readers-") as failed:
        (failed / "reader-0-0.log").write_text("Traceback ...\n")
        raise RuntimeError("a reader printed no report")
    assert (failed / "reader-0-0.log").read_text() == "Traceback ...\n"
    assert f"worker logs kept in {failed}" in capsys.readouterr().err
