"""benchmarks/gpu/gpu_trainer_proof.py's CPU parts at small widths: every check is in the JSON, every
check that can run on CPU passes, the GPU-only ones say they need CUDA; and the spawn-environment
check fails an engine launch that leaks torchrun's agent-store variable."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

import gpu_trainer_proof as proof
import trainer_proof_io as proof_io

REPO = Path(__file__).resolve().parents[2]
GPU_ONLY = {"update_memory", "cuda_ipc"}


def test_cpu_parts_pass_and_every_check_is_reported(tmp_path):
    out = tmp_path / "proof.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu_trainer_proof.py"), "--device", "cpu",
                          "--layers", "2", "--widths", "small", "--work", str(tmp_path), "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["checks"]) == list(proof.CHECK_NAMES)
    lines = [line.split() for line in run.stdout.splitlines() if line.split()[:1] and line.split()[0] in proof.CHECK_NAMES]
    assert [words[0] for words in lines] == list(proof.CHECK_NAMES)             # one printed line per check
    for name, entry in report["checks"].items():
        if name in GPU_ONLY:
            assert entry["status"] == "skipped: needs CUDA", (name, entry)
        elif name == "spawn_env" and entry["status"].startswith(f"skipped: no {proof_io.SCRUB_FUNCTION}() in "):
            pass                        # the engine launch has no scrub to check yet
        else:
            assert entry["status"] == "pass", (name, entry)
    checks = report["checks"]
    assert checks["sharded_load"]["tensors_equal"] is True
    assert checks["packed_attention"]["max_per_micro_batch"] >= 2
    assert checks["dcp_checkpoint"]["adamw_entries"] > 0 and checks["dcp_checkpoint"]["hf_files"] >= 1
    assert checks["update_speed"]["tokens_per_s"] > 0
    assert not any(tmp_path.glob("rstar2_proof_*")), "the work folder is removed"


@contextmanager
def scrubbing(**_):
    saved = os.environ.pop(proof_io.AGENT_STORE_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[proof_io.AGENT_STORE_ENV] = saved


@contextmanager
def leaking(**_):
    yield


@pytest.mark.parametrize("scrub, passes", [(scrubbing, True), (leaking, False)])
def test_spawn_env_check_tells_a_scrubbed_launch_from_a_leaking_one(monkeypatch, scrub, passes):
    import rstar2_cli.rollout.engine_env as engine_env

    monkeypatch.setattr(engine_env, proof_io.SCRUB_FUNCTION, scrub, raising=False)
    monkeypatch.delenv(proof_io.AGENT_STORE_ENV, raising=False)
    if passes:
        figures = proof_io.spawn_env_check()
        assert figures["child_without_scrub"] == "True" and figures["child_in_scrub"] == "<unset>"
    else:
        with pytest.raises(AssertionError, match=proof_io.AGENT_STORE_ENV):
            proof_io.spawn_env_check()
    assert proof_io.AGENT_STORE_ENV not in os.environ          # the check leaves the environment as it was
