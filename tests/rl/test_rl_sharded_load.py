"""Sharded loading (meta device, local shards only) gives the same weights as from_pretrained,
for a bf16 checkpoint with tied embeddings and an fp32 one without; a sharded checkpoint
save -> --resume round-trips bit for bit at 2 ranks, from 2 ranks to 1 and from 1 to 2; a full disk
on one rank fails the save on both, leaving `latest` as it was."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rl_synthetic import TINY_QWEN3
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from rstar2_cli.rl.update.checkpoint import load_checkpoint, save_checkpoint

WORKER = Path(__file__).with_name("rl_load_worker.py")


def _save(path: Path, *, tied: bool, dtype: torch.dtype, seed: int) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3, tie_word_embeddings=tied))
    model.to(dtype).save_pretrained(path)
    return path


@pytest.mark.slow
def test_sharded_load_matches_from_pretrained_and_resume_round_trips(tmp_path, free_port):
    from transformers import AutoModelForCausalLM

    dirs = [_save(tmp_path / "tied_bf16", tied=True, dtype=torch.bfloat16, seed=1),
            _save(tmp_path / "untied_fp32", tied=False, dtype=torch.float32, seed=2)]
    out = tmp_path / "out"
    out.mkdir()
    single = _one_process_policy(dirs[0])
    save_checkpoint(out / "single" / "step_000003", single, step=3)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port}", str(WORKER), str(out), *map(str, dirs)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i, d in enumerate(dirs):
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        expected = ref.state_dict()
        for method in ("slices", "broadcast"):
            got = torch.load(out / f"{i}_{method}.pt")
            assert got["tied"] == (i == 0), method
            assert torch.equal(got["inv_freq"], ref.model.rotary_emb.inv_freq), method
            assert got["state"].keys() <= expected.keys()
            for name, value in got["state"].items():
                assert value.dtype == torch.float32, (method, name)      # fp32 master weights
                assert torch.equal(value, expected[name]), (method, name)
    saved, resumed = torch.load(out / "saved.pt"), torch.load(out / "resumed.pt")
    assert saved.keys() == resumed.keys()
    for name in saved:
        assert torch.equal(saved[name], resumed[name]), name
    optim = torch.load(out / "optim.pt", weights_only=False)
    _assert_same_moments(optim["saved"], optim["resumed"])
    # the failed save at step 2: the same one line on both ranks, step 1 still latest
    faults = [(out / f"fault_{r}.txt").read_text() for r in (0, 1)]
    assert faults[0] == faults[1] and "No space left on device" in faults[0], faults
    assert (out / "ckpt" / "latest").read_text() == "step_000001\n"
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["latest", "step_000001"]
    # saved at 2 ranks, resumed by one process (DCP reshards the AdamW moments)
    alone = _one_process_policy(dirs[0], update=False)
    load_checkpoint(out / "ckpt", alone)
    for name, value in alone.full_state_dict():
        assert torch.equal(value, saved[name]), name
    _assert_same_moments(optim["saved"], get_optimizer_state_dict(alone.model, alone.optimizer))
    # saved by one process, resumed at 2 ranks
    from_single = torch.load(out / "from_single.pt", weights_only=False)
    for name, value in single.full_state_dict():
        assert torch.equal(from_single["state"][name], value), name
    _assert_same_moments(get_optimizer_state_dict(single.model, single.optimizer), from_single["optim"])


def _one_process_policy(model_dir: Path, update: bool = True):
    from rl_synthetic import make_trajectories

    from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
    from rstar2_cli.rl.update.policy import PolicyTrainer

    policy = PolicyTrainer(ModelConfig(path=str(model_dir)), OptimConfig(lr=1e-3), LossConfig(), micro_batch_tokens=64)
    if update:
        batch = make_trajectories(8, seed=2)
        policy.update(batch, [1.0 - 2.0 * (j % 2) for j in range(len(batch))])
    return policy


def _assert_same_moments(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for name, moments in a["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(moments[key], b["state"][name][key]), (name, key)
    assert [g["lr"] for g in a["param_groups"]] == [g["lr"] for g in b["param_groups"]]
