"""The sharded model the trainer loads (meta device, `fully_shard` per layer, local shards) runs a
forward and a backward with no mixed-precision policy given, and gives the unsharded model's
loss and gradients; `shard_model` never hands `fully_shard` a None policy."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("rl_sharded_forward_worker.py")


@pytest.mark.slow
def test_two_rank_sharded_forward_backward_matches_unsharded(tmp_path, tiny_model_dir, free_port):
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(WORKER.parent))
    from rl_sharded_forward_worker import batch

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port}", str(WORKER), str(tiny_model_dir), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = torch.load(tmp_path / "result.pt")
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    ref.train()
    loss = ref(**batch(), use_cache=False).loss
    loss.backward()
    torch.testing.assert_close(got["loss"], loss.detach(), atol=1e-5, rtol=0)
    expected = {name: p.grad for name, p in ref.named_parameters()}
    assert got["grads"].keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_shard_model_rejects_a_policy_that_is_not_one():
    from rl_synthetic import build_tiny_model

    from rstar2_cli.rl.update.model_load import shard_model

    with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
        shard_model(build_tiny_model(), mp_policy="bf16")
