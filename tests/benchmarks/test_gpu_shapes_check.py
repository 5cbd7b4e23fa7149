"""benchmarks/gpu/gpu_shapes_check.py on the real Qwen3-1.7B (tied) and Qwen3-14B shapes: the checks
pass on the code as it is, fail with the IPC buffer the code used before (vLLM's 1 GiB default,
smaller than the 14B embedding), and the names check fails when the trainer leaves a tensor out or
sends a wrong shape. One subprocess (it starts torch.distributed and vLLM's groups), meta only."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RUN = r"""
import contextlib, io, json, sys
import torch
sys.path.insert(0, "benchmarks/gpu")
import gpu_shapes_check as g
from rstar2_cli.rollout.weight_sync.source import policy_weight_source

def main(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = g.main(list(argv))
    return {"rc": rc, "lines": [l for l in out.getvalue().splitlines() if l.startswith(("ok", "FAIL"))]}

class Edited:
    def __init__(self, source, drop=(), shape=None):
        self.source, self.drop, self.shape = source, set(drop), shape
    def metadata(self):
        return [m for m in self.source.metadata() if m.name not in self.drop]
    def __iter__(self):
        for n, t in self.source:
            if n in self.drop:
                continue
            yield n, (t.reshape(self.shape[1]) if self.shape and n == self.shape[0] else t)

def names_error(model_name, import_dir, **edit):
    source = Edited(policy_weight_source(g.trainer_model(model_name), torch.bfloat16), **edit)
    try:
        return "passed: " + g.check_names(source, *g.vllm_model(model_name, import_dir))
    except (AssertionError, ValueError, RuntimeError) as e:
        return (str(e).splitlines() or [repr(e)])[0]

import tempfile, pathlib
tmp = pathlib.Path(tempfile.mkdtemp())
print(json.dumps({
    "now": main("--model", "qwen3-1.7b", "qwen3-14b"),
    "before": main("--model", "qwen3-14b", "--ipc-buffer-mb", "1024"),
    "no_k_proj": names_error("qwen3-1.7b", tmp / "a", drop=["model.layers.3.self_attn.k_proj.weight"]),
    "no_lm_head": names_error("qwen3-14b", tmp / "b", drop=["lm_head.weight"]),
    "bad_shape": names_error("qwen3-1.7b", tmp / "c", shape=("model.layers.0.mlp.up_proj.weight", (12288, 1024))),
}))
"""


@pytest.fixture(scope="module")
def results():
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_check_passes_on_qwen3_1_7b_and_14b(results):
    now = results["now"]
    assert now["rc"] == 0 and len(now["lines"]) == 11, now     # sleep + 5 checks x 2 models
    assert all(line.startswith("ok") for line in now["lines"]), now
    text = "\n".join(now["lines"])
    assert "qwen3-1.7b names: 310 trainer tensors fill all 226 vLLM parameters (lm_head tied" in text
    assert "qwen3-14b attention: sdpa: 13 padded buckets, no mask (causal kernel); one packed row of 16301" in text
    assert "qwen3-14b ipc: buffer 1536 MiB holds the largest tensor model.embed_tokens.weight" in text
    assert "qwen3-14b nccl:" in text and "before 220.06 GiB (4 fp32 passes), after 27.51 GiB (1 bf16 pass" in text


def test_vllms_default_buffer_fails_the_ipc_check_on_14b(results):
    before = results["before"]
    assert before["rc"] == 1
    failed = [line for line in before["lines"] if line.startswith("FAIL")]
    assert len(failed) == 1 and "qwen3-14b ipc: buffer 1024 MiB: vLLM's packed_ipc_producer refuses it" in failed[0]
    assert "Tensor 'model.embed_tokens.weight' has size 1555824640 bytes" in failed[0]


def test_names_check_fails_on_a_missing_tensor_or_a_wrong_shape(results):
    assert "partly filled" in results["no_k_proj"] and "model.layers.3.self_attn.qkv_proj" in results["no_k_proj"]
    assert "lm_head" in results["no_lm_head"] and not results["no_lm_head"].startswith("passed")
    assert results["bad_shape"].startswith("vLLM's load_weights refused a tensor: AssertionError()")
