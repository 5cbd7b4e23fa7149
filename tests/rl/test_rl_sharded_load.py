"""Sharded loading (meta device, local shards only) gives the same weights as from_pretrained,
for a bf16 checkpoint with tied embeddings and an fp32 one without, and a sharded checkpoint
save -> --resume round-trips bit for bit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rl_synthetic import TINY_QWEN3

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
