"""benchmarks/compare/chaos_rl.py without a full run: the seeded fault schedule, the per-step metric
comparison, the "not supported by this build" detection, and the process faults on stand-in
processes (a parent with a child, a child whose command line names EngineCore)."""
from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chaos_rl

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_the_schedule_is_drawn_from_the_seed_and_leaves_a_step_after_each_fault():
    kinds = ["trainer_kill", "preempt"]
    a = chaos_rl.draw_schedule(3, 4, kinds, 10)
    assert a == chaos_rl.draw_schedule(3, 4, kinds, 10)
    assert any(chaos_rl.draw_schedule(s, 4, kinds, 10) != a for s in range(4, 10))
    steps = [f.after_step for f in a]
    assert steps == sorted(steps) and len(set(steps)) == 4 and all(1 <= s <= 9 for s in steps)
    assert all(f.kind in kinds and 0 <= f.delay_frac < 1 for f in a)
    many = chaos_rl.draw_schedule(0, 10, kinds, 4)            # more faults than steps: steps repeat
    assert len(many) == 10 and {f.after_step for f in many} <= {1, 2, 3}
    assert {f.kind for f in chaos_rl.draw_schedule(0, 30, kinds, 6)} == set(kinds)


def test_the_schedule_refuses_a_run_with_no_step_after_a_fault():
    with pytest.raises(ValueError, match="--steps 1"):
        chaos_rl.draw_schedule(0, 1, ["preempt"], 1)
    with pytest.raises(ValueError, match="no fault kinds"):
        chaos_rl.draw_schedule(0, 1, [], 5)


def test_metric_comparison_ignores_wall_clock_and_fault_counters_and_reports_the_largest_difference():
    clean = [{"step": 1, "train/loss": 0.5, "rollout/accuracy": 0.25, "time/step": 3.0},
             {"step": 2, "train/loss": 0.4, "rollout/accuracy": 0.5, "time/step": 2.0}]
    same = [{**r, "time/step": 9.0, "faults/engine_restarts": 1.0} for r in clean]
    got = chaos_rl.compare_metrics(clean, same)
    assert got["all_identical"] and got["identical"] == ["rollout/accuracy", "step", "train/loss"]

    off = [dict(clean[0]), {**clean[1], "train/loss": 0.1}]
    got = chaos_rl.compare_metrics(clean, off)
    assert not got["all_identical"]
    assert got["different"] == {"train/loss": pytest.approx(0.3)}

    short = chaos_rl.compare_metrics(clean, clean[:1])
    assert not short["all_identical"] and short["steps_chaos"] == [1]
    assert set(short["missing"]) == {"rollout/accuracy", "step", "train/loss"}


def test_kinds_without_their_machinery_are_reported_not_supported(monkeypatch):
    from rstar2_cli.config import SandboxConfig

    monkeypatch.setattr(chaos_rl, "_mentions", lambda text: False)
    monkeypatch.delitem(SandboxConfig.model_fields, "outage_s", raising=False)
    why = chaos_rl.supported()
    assert why["trainer_kill"] == "" and why["preempt"] == ""
    for kind in ("engine_kill", "sandbox_kill", "checkpoint_fail"):
        assert why[kind].startswith("not supported by this build"), kind
    monkeypatch.setattr(chaos_rl, "_mentions", lambda text: True)
    why = chaos_rl.supported()
    assert why["engine_kill"] == "" and why["checkpoint_fail"] == ""


def test_the_detection_reads_this_tree():
    assert chaos_rl._mentions("PREEMPTED_EXIT_CODE")
    assert not chaos_rl._mentions("a string no module holds " + "x" * 3)
    assert set(chaos_rl.FAULTS) == set(chaos_rl.KINDS)


def test_an_unknown_kind_is_refused_with_its_name():
    with pytest.raises(SystemExit, match="'bogus'"):
        chaos_rl.main(["--kinds", "preempt,bogus"])


def _parent_with_child(tmp_path: Path, child_arg: str) -> subprocess.Popen:
    code = ("import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {child_arg!r}]); "
            "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while not chaos_rl._descendants(proc.pid):
        assert time.monotonic() < deadline, "the stand-in child did not start"
        time.sleep(0.1)
    return proc


def test_trainer_kill_kills_the_trainer_and_reaps_its_children(tmp_path):
    proc = _parent_with_child(tmp_path, "worker")
    children = chaos_rl._descendants(proc.pid)
    run = chaos_rl.Run(tmp_path / "out", tmp_path / "r.yaml", proc=proc)
    chaos_rl.trainer_kill(run, chaos_rl.Fault("trainer_kill", 1, 0.0), random.Random(0))
    assert proc.returncode == -9
    assert not any(c.is_running() and c.status() != "zombie" for c in children)


def test_engine_kill_kills_only_the_engine_core_child(tmp_path):
    proc = _parent_with_child(tmp_path, "EngineCore_DP0")
    try:
        run = chaos_rl.Run(tmp_path / "out", tmp_path / "r.yaml", proc=proc)
        fault = chaos_rl.Fault("engine_kill", 1, 0.0)
        chaos_rl.engine_kill(run, fault, random.Random(0))
        assert fault.note == "" and proc.poll() is None
        assert not [c for c in chaos_rl._descendants(proc.pid) if c.status() != "zombie"]
    finally:
        proc.kill()
        proc.wait()
