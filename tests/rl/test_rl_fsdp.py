"""A 2-rank FSDP2 update (torchrun, gloo) reproduces the 1-rank update."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("rl_fsdp_worker.py")


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_two_rank_fsdp_update_matches_one_rank(tmp_path, tiny_model_dir, free_port):
    one, two = tmp_path / "one", tmp_path / "two"
    spec = importlib.util.spec_from_file_location("rl_fsdp_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.main(str(tiny_model_dir), str(one))              # 1 rank, in this process: no process group
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port}",
          str(WORKER), str(tiny_model_dir), str(two)])
    r1, r2 = (json.loads((d / "result.json").read_text()) for d in (one, two))
    assert len(r1) == len(r2) == 2
    for a, b in zip(r1, r2):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=1e-5)
        assert a["loss_tokens"] == b["loss_tokens"] and a["trajectories"] == b["trajectories"] == 16
    assert r1[1]["ratio_mean"] != 1.0          # the second mini-batch ran on moved weights
    p1, p2 = (torch.load(d / "params.pt") for d in (one, two))
    assert p1.keys() == p2.keys()
    from safetensors.torch import load_file

    init = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert max(float((p1[k] - init[k]).abs().max()) for k in init) > 1e-3   # the tolerance below is meaningful
    for k in p1:
        torch.testing.assert_close(p2[k], p1[k], atol=1e-4, rtol=0)
