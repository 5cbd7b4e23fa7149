"""The smoke benchmark's model, FLOP count and MFU, checked against numbers worked out by hand."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import smoke_model as sm

REPO = Path(__file__).resolve().parents[2]


def test_tiny_builder_matches_hand_count():
    # per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288; q/k norm 2*16; mlp 3*64*128 = 24576;
    # two RMSNorms 2*64  -> 37024; x2 layers + final norm 64 = 74112; tied embedding 1000*64 = 64000
    model, shape = sm.build_smoke_model(tiny=True)
    assert shape.non_embedding_params() == 74_112
    assert sum(p.numel() for p in model.parameters()) == 138_112
    assert model.config.num_key_value_heads == 2 and model.config.tie_word_embeddings


def test_full_shape_parameter_count_on_meta_device():
    model, shape = sm.build_smoke_model(device="meta")
    assert shape.total_params() == sm.SMOKE_1B_TOTAL_PARAMS == 1_015_870_976  # "about 1B"
    assert shape.non_embedding_params() == sm.SMOKE_1B_NON_EMBEDDING_PARAMS
    # 14 x (2048*2048*2 + 2*2048*1024 + 2*128 + 3*2048*6144 + 2*2048) + 2048
    assert (
        sm.SMOKE_1B_NON_EMBEDDING_PARAMS
        == 14 * (2 * 2048 * 2048 + 2 * 2048 * 1024 + 256 + 3 * 2048 * 6144 + 4096) + 2048
    )
    assert model.config.hidden_size == 2048 and model.config.num_hidden_layers == 14


def test_qwen3_1_7b_shape_matches_the_published_model():
    model, shape = sm.build_smoke_model(device="meta", shape="qwen3-1.7b")
    assert shape.total_params() == 1_720_574_976 and shape.non_embedding_params() == 1_409_410_048
    assert model.config.num_hidden_layers == 28
    with pytest.raises(ValueError, match="choose one of"):
        sm.build_smoke_model(device="meta", shape="7b")


def test_training_flops_and_mfu_by_hand():
    shape = sm.TINY
    # one 100-token sequence: 6 * (74112 + 1000*64) + 12 * 2 layers * 64 attn dim * 100 = 982272 per token
    assert sm.training_flops(shape, [100]) == 100 * 982_272
    # packing two sequences costs each its own attention span, not the packed length
    assert sm.training_flops(shape, [100, 50]) == 100 * 982_272 + 50 * (828_672 + 12 * 2 * 64 * 50)
    # 1.0e15 FLOP in 2 s on 2 devices of 989.4 TFLOP/s peak
    assert sm.mfu(1.0e15, 2.0, 989.4, n_devices=2) == pytest.approx(1.0e15 / 2 / (2 * 989.4e12))
    with pytest.raises(ValueError):
        sm.mfu(1.0, 0.0, 989.4)


def test_full_shape_flops_per_token_at_8k():
    per_token = sm.training_flops(sm.SMOKE_1B, [8192]) / 8192
    expected = 6 * (704_706_048 + 151_936 * 2048) + 12 * 14 * 2048 * 8192
    assert per_token == expected  # ~8.9e9 FLOP/token
    assert 8.5e9 < per_token < 9.5e9


@pytest.mark.parametrize(("name", "arch", "peak"), [
    ("NVIDIA H100 80GB HBM3", "", 989.4), ("NVIDIA H200", "", 989.4), ("NVIDIA H100 PCIe", "", 756.0),
    ("NVIDIA A100-SXM4-80GB", "", 312.0), ("AMD Instinct MI300X", "", 1307.4),
    ("", "gfx942:sramecc+:xnack-", 1307.4), ("NVIDIA GeForce RTX 4090", "", None),
])
def test_peak_table_lookup(name, arch, peak):
    assert sm.peak_tflops_for(name, arch) == peak


def test_packed_rows_keep_sequences_apart():
    model, shape = sm.build_smoke_model(tiny=True)
    gen = torch.Generator().manual_seed(1)
    batch = sm.packed_batch([10, 20, 5], shape.vocab, generator=gen)
    assert batch["position_ids"][0, 10].item() == 0 and batch["labels"][0, 30].item() == -100
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[:, 10:30]
        alone = model(input_ids=batch["input_ids"][:, 10:30], use_cache=False).logits
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(sm.packed_loss(model, batch))


def test_rollout_lengths_pack_into_8k_rows():
    lengths = sm.sample_rollout_lengths(64, max_len=8192, seed=3)
    assert all(100 < n <= 8192 for n in lengths) and max(lengths) == 8192  # some hit the cap
    rows = sm.pack_sequences(lengths, 8192)
    assert sorted(n for r in rows for n in r) == sorted(lengths)
    assert all(sum(r) <= 8192 for r in rows)
    with pytest.raises(ValueError, match="does not fit"):
        sm.pack_sequences([9000], 8192)


def test_smoke_model_imports_without_rich_or_install():
    code = "import sys; sys.modules['rich'] = None; sys.path[:0] = sys.argv[1:]; " \
           "import smoke_model as m; print(m.SMOKE_1B.total_params())"
    out = subprocess.run([sys.executable, "-c", code, str(REPO), str(REPO / "benchmarks" / "gpu")], capture_output=True,
                         text=True, cwd="/", timeout=120, check=True)
    assert out.stdout.strip() == "1015870976"


def test_benchmark_script_writes_json_on_cpu(tmp_path):
    import gpu_smoke
    out = tmp_path / "smoke.json"
    result = gpu_smoke.main(["--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
                             "--peak-tflops", "1.0", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["params_total"] == 138_112 and saved["flops_per_step"] == result["flops_per_step"]
    tokens, flops = saved["tokens_per_step"], saved["flops_per_step"]
    # rates from the step time: tokens / s, and FLOP/s over 1 TFLOP/s of peak (mfu rounded to 4 places)
    base = saved["baseline_plain_step"]
    assert base["tokens_per_s"] == pytest.approx(tokens / base["seconds_per_step"], rel=0.05)
    assert base["mfu"] == pytest.approx(flops / base["seconds_per_step"] / 1e12, rel=0.05, abs=1e-4)
    upd = saved["policy_update"]   # the trainer's own update ran on the same packed rows (+1 forward: 4/3 the FLOPs)
    assert upd["world_size"] == 1
    assert upd["tokens_per_s"] == pytest.approx(tokens / upd["seconds_per_step"], rel=0.05)
    assert upd["mfu"] == pytest.approx(flops * 4 / 3 / upd["seconds_per_step"] / 1e12, rel=0.05, abs=1e-4)
    assert upd["ratio_vs_baseline"] == pytest.approx(base["seconds_per_step"] / upd["seconds_per_step"], rel=0.05)
    load = saved["sharded_load"]      # the trainer's meta-device load, on a 1-rank process group
    assert load["method"] == "slices" and load["world_size"] == 1 and load["local_params"] == 138_112
    # ... then a forward and backward through that sharded model (a random tiny model: loss ~ ln vocab)
    assert 5.0 < load["loss"] < 9.0


def test_benchmark_runs_on_a_bare_node_without_the_clis_dependencies(tmp_path):
    """A bare GPU node has torch and transformers, not pydantic, rich, typer or vLLM (pyyaml comes
    with transformers)."""
    script = ("import sys, runpy\n"
              "for name in ('pydantic', 'rich', 'vllm', 'typer'): sys.modules[name] = None\n"
              "path, out = sys.argv[1], sys.argv[2]\n"
              "sys.argv = [path, '--tiny', '--device', 'cpu', '--steps', '1', '--warmup', '0',"
              " '--peak-tflops', '1.0', '--out', out]\n"
              "runpy.run_path(path, run_name='__main__')\n")
    out = tmp_path / "bare.json"
    run = subprocess.run([sys.executable, "-c", script, str(REPO / "benchmarks" / "gpu" / "gpu_smoke.py"), str(out)],
                         capture_output=True, text=True, cwd="/", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(out.read_text())["policy_update"]["world_size"] == 1      # the trainer's update ran


def test_bare_node_settings_equal_the_recipe_defaults():
    import gpu_smoke
    from rstar2_cli.config import LossConfig, OptimConfig

    bare = gpu_smoke.BARE_NODE_CONFIGS
    assert LossConfig().model_dump() == bare["loss"]
    assert OptimConfig(lr=1e-6, warmup_steps=0).model_dump() == bare["optim"]
