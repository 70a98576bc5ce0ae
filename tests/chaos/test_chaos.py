"""The chaos run of issue #9 (docs/chaos.md), and quick checks of its seeded fault plan.

    .venv/bin/pytest tests/chaos -s                          # 3 minutes of faults, table printed
    ZBK_CHAOS_SEED=1234 .venv/bin/pytest tests/chaos -s      # replay a printed seed's faults
    ZBK_CHAOS_FAULT_S=45 .venv/bin/pytest tests/chaos -s     # a shorter run while developing
    ZBK_CHAOS_DIR=/tmp/chaos .venv/bin/pytest tests/chaos -s  # keep the logs there (pytest's tmp dirs rotate)
    .venv/bin/python bench/chaos.py --minutes 30             # long runs
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from chaos.faults import BOOKIE_KINDS, KINDS, PlanSettings, make_plan, plan_counts
from chaos.harness import ChaosConfig, run_chaos
from chaos.workload import payload

SEEDS = range(300)


def chaos_seed() -> int:
    env = os.environ.get("ZBK_CHAOS_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 1 << 31)


@pytest.mark.slow
@pytest.mark.timeout(580)
def test_chaos_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = chaos_seed()
    fault_s = float(os.environ.get("ZBK_CHAOS_FAULT_S", "180"))
    root = Path(os.environ["ZBK_CHAOS_DIR"]) / f"seed-{seed}" if os.environ.get("ZBK_CHAOS_DIR") else tmp_path
    with capsys.disabled():
        print(f"\nchaos: seed {seed} (replay: ZBK_CHAOS_SEED={seed}), {fault_s:.0f} s of faults, logs in {root}")
    report = run_chaos(ChaosConfig(seed=seed, fault_s=fault_s), root)
    with capsys.disabled():
        print(report.table())
    assert all(report.injected[k] >= 1 for k in KINDS), report.injected
    assert not report.failures(), report.table()


def test_plan_is_a_function_of_the_seed() -> None:
    s = PlanSettings()
    assert make_plan(7, s) == make_plan(7, s)
    assert make_plan(7, s) != make_plan(8, s)


@pytest.mark.parametrize("fault_s", [45.0, 180.0, 1800.0])
def test_plan_injects_every_kind_within_its_limits(fault_s: float) -> None:
    s = PlanSettings(fault_s=fault_s)
    for seed in SEEDS if fault_s < 1000 else range(20):
        plan = make_plan(seed, s)
        assert all(n >= 1 for n in plan_counts(plan).values()), (seed, plan_counts(plan))
        assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)
        assert all(f.end_s <= fault_s and f.duration_s > 0 for f in plan)
        first_kill = next(f for f in plan if f.kind == "bookie_kill")
        assert first_kill.target in s.journal_off and first_kill.duration_s <= s.short_kill_s[1]
        for f in plan:
            def busy(g, f=f):  # noqa: ANN001
                settle = s.restart_settle_s
                return (g.at_s < f.end_s + (settle if f.kind == "bookie_kill" else 0)
                        and f.at_s < g.end_s + (settle if g.kind == "bookie_kill" else 0))
            # Faults that started before f and still run when f starts or during it: at the
            # instant the latest of any set of overlapping faults starts, all of them run.
            during = [g for g in plan if g is not f and g.at_s <= f.at_s and busy(g)]
            if f.kind in BOOKIE_KINDS:
                others = {g.target for g in during if g.kind in BOOKIE_KINDS}
                assert f.target not in others, (seed, f)
                assert len(others) < s.bookie_faults_max, (seed, f, during)
            else:
                assert not any(g.kind == f.kind for g in during), (seed, f)
            if f.kind == "bookie_kill" and f.target in s.journal_off:
                assert not any(g.kind == "bookie_kill" and g.target in s.journal_off and g is not f
                               and abs(g.at_s - f.at_s) < s.journal_off_kill_spacing_s for g in plan), (seed, f)


def test_payloads_are_distinct_and_sized() -> None:
    seen = {payload(1, lid, k) for lid in range(5) for k in range(200)}
    assert len(seen) == 1000
    assert all(40 <= len(p) <= 1063 for p in seen)
    assert payload(1, 2, 3) == payload(1, 2, 3) != payload(2, 2, 3)
