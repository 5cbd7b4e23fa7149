"""benchmarks/gpu/gpu_rl_smoke.py cannot run here (no CUDA); what runs on CPU is checked: it imports,
`--help` works, it refuses to start without a GPU, and its default model pushes tensors of the
Qwen3-14B embedding's shape, larger than vLLM's default packed buffer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import gpu_rl_smoke

REPO = Path(__file__).resolve().parents[2]


def test_help_runs_on_cpu():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu_rl_smoke.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--backends" in proc.stdout and "14b-embed" in proc.stdout


def test_a_smaller_shape_resolves_when_run_as_a_script(tmp_path):
    """`--model 0.25b` takes bench_load_memory.py's shapes from benchmarks/timing/, which the script
    puts on sys.path itself (a run from another folder has only the script's own on it)."""
    code = ("import runpy, sys; g = runpy.run_path(sys.argv[1], run_name='smoke'); "
            "print(g['smoke_config']('0.25b').hidden_size)")
    script = REPO / "benchmarks" / "gpu" / "gpu_rl_smoke.py"
    proc = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1].isdigit()


def test_without_cuda_it_refuses_before_building_anything(tmp_path, capsys):
    assert not torch.cuda.is_available()
    assert gpu_rl_smoke.main(["--work", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_default_model_pushes_the_14b_embedding_shape_past_vllms_default_buffer():
    from transformers import Qwen3ForCausalLM
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES

    from rstar2_cli.rollout.weight_sync.source import MiB, packed_buffer_bytes, policy_weight_source

    with torch.device("meta"):
        model = Qwen3ForCausalLM(gpu_rl_smoke.smoke_config(gpu_rl_smoke.EMBED_14B))
    meta = {m.name: m for m in policy_weight_source(model, torch.bfloat16).metadata()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert meta[name].shape == (151936, 5120) and meta[name].dtype == torch.bfloat16
    assert 151936 * 5120 * 2 > DEFAULT_PACKED_BUFFER_SIZE_BYTES
    assert packed_buffer_bytes(list(meta.values())) == 1536 * MiB
    assert model.config.num_hidden_layers == 2
