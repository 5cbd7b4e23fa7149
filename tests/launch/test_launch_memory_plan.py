"""The dry run's memory table: Qwen3-14B's real sizes, each row against hand-computed bytes, the
activation formula against what autograd keeps, the one-line verdict and the CLI option."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.launch import gpu_card
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import QWEN3_14B, Qwen3Shape, shape_for_model

GIB = 2**30
P14 = 14_768_307_200      # Qwen3-14B: 40 x 330,311,936 + final norm 5,120 + 2 x 151,936 x 5,120 (untied)


def stage2_spec(**changes) -> mp.MemorySpec:
    """Stage 2 on 64 MI300X as `rstar2 rl` sizes it: colocated, TP 2, 0.91 of the GPU for vLLM,
    512 sequences (512 prompts x 32 rollouts / 32 replicas), 16384-token steps, CUDA graphs."""
    spec = mp.MemorySpec(shape=QWEN3_14B, shape_source="test", trainer_ranks=64, colocated=True, tp_size=2,
                         gpu_memory_gib=192.0, gpu_name="mi300x", gpu_memory_utilization=0.91,
                         micro_batch_tokens=32768, logprob_chunk_tokens=1024, gradient_checkpointing=True,
                         max_model_len=12288 + 2048, max_num_seqs=512, max_num_batched_tokens=16384,
                         cuda_graphs=True)
    return dataclasses.replace(spec, **changes)


def test_qwen3_14b_counts_by_hand_and_as_transformers_builds_it():
    s = QWEN3_14B
    # q 5120x5120, k and v 5120x1024, o 5120x5120, q_norm/k_norm 128, MLP 3 x 5120 x 17408, 2 norms
    assert s.layer_params() == 2 * 5120 * 5120 + 2 * 5120 * 1024 + 256 + 3 * 5120 * 17408 + 2 * 5120 == 330_311_936
    assert s.root_params() == 2 * 151_936 * 5120 + 5120 == 1_555_829_760
    assert s.total_params() == 40 * 330_311_936 + 5120 + 2 * 151_936 * 5120 == P14
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                         head_dim=128, intermediate_size=17408, vocab_size=151936, tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == P14
    assert Qwen3Shape.from_hf_config(config.to_dict()) == s


def test_shape_comes_from_the_checkpoint_config_when_there_is_one(tmp_path):
    missing = tmp_path / "missing"
    assert shape_for_model(str(missing)) == (QWEN3_14B, f"Qwen3-14B (assumed: no {missing}/config.json)")
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, intermediate_size=128, tie_word_embeddings=True).save_pretrained(tmp_path)
    shape, source = shape_for_model(str(tmp_path))
    assert source == str(tmp_path / "config.json")
    assert shape == Qwen3Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=384,
                               tie_embeddings=True)


def saved_activation_bytes_per_token(shape: Qwen3Shape, tokens: int = 64) -> float:
    """What autograd keeps of one transformers Qwen3DecoderLayer forward in bf16 (distinct
    storages, parameters and the layer input excluded), per token."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    cfg = Qwen3Config(hidden_size=shape.hidden, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                      head_dim=shape.head_dim, intermediate_size=shape.intermediate, num_hidden_layers=1,
                      vocab_size=shape.vocab)
    cfg._attn_implementation = "sdpa"
    layer = Qwen3DecoderLayer(cfg, 0).to(torch.bfloat16)
    x = torch.randn(1, tokens, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(tokens)[None]
    rotary = Qwen3RotaryEmbedding(cfg)(x, positions)
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()} | {x.untyped_storage().data_ptr()}
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            kept[ptr] = max(kept.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_ids=positions, position_embeddings=rotary)
    return sum(kept.values()) / tokens


@pytest.mark.parametrize("shape", [
    Qwen3Shape(hidden=256, layers=1, heads=4, kv_heads=2, head_dim=64, intermediate=768, vocab=64),
    Qwen3Shape(hidden=512, layers=1, heads=8, kv_heads=2, head_dim=64, intermediate=1536, vocab=64),
    Qwen3Shape(hidden=256, layers=1, heads=8, kv_heads=4, head_dim=32, intermediate=1024, vocab=64),
])
def test_layer_activation_formula_is_what_autograd_keeps(shape):
    assert saved_activation_bytes_per_token(shape) == mp.layer_activation_bytes_per_token(shape)


def test_stage2_on_64_mi300x_row_by_row():
    plan = mp.build_memory_plan(stage2_spec())
    assert plan.columns == ("rollout", "update")
    rows = {r.name: r for r in plan.rows}
    # per-token bytes of one layer: 2 x (8x5120 + 5x5120 + 5x1024 + 4x17408 + 4x40 + 2x8 + 2x128 + 4)
    assert mp.layer_activation_bytes_per_token(QWEN3_14B) == 283_496
    expected = {   # bytes, worked out by hand
        "trainer parameters fp32 (1/64)": 4 * P14 / 64,                                      # 923,019,200
        "trainer gradients fp32 (1/64)": 4 * P14 / 64,
        "AdamW moments fp32 (1/64)": 8 * P14 / 64,
        # bf16 root + two layers, then the root's bf16 gradients and their fp32 reduce-scatter copy
        "FSDP2 all-gather/reduce buffers": 2 * (1_555_829_760 + 2 * 330_311_936) + 6 * 1_555_829_760,
        # 40 checkpointed bf16 layer inputs + one recomputed layer and its gradients, 32768 tokens
        "activations, 32768 tokens, checkpointed": 32768 * (40 * 2 * 5120 + 2 * 283_496),  # 29.80 GiB
        # final norm (fp32 in, bf16 out) and the bf16 hidden-state gradient for 32768 tokens
        # + one 1024 x 151936 chunk x 4 B x 4
        "log-prob head, 1024-token chunks": 32768 * (6 * 5120 + 4 + 2 * 5120) + 1024 * 151_936 * 16,  # 3.57 GiB
        # grad_w [151936, 5120] fp32 (3,111,649,280 B) and its bf16 copy (1,555,824,640 B)
        "log-prob head weight gradient, fp32 + bf16 copy": 151_936 * 5120 * 4 + 151_936 * 5120 * 2,   # 4.35 GiB
        "engine weights bf16 (1/TP 2)": 2 * P14 / 2,
        # 16384 profile tokens of one layer + the sampler's 512 x 151936 fp32 rows x 3
        "engine activations (profile run, 16384 tokens)": 16384 * 2 * (3 * 5120 + (5120 + 2048) / 2 + 3 * 17408 / 2)
                                                          + 512 * 151_936 * 12,
    }
    for name, nbytes in expected.items():
        value = next(v for v in rows[name].gib if v is not None)
        assert value == pytest.approx(nbytes / GIB, rel=1e-12), name
    kv = (0.91 * 192 - expected["engine weights bf16 (1/TP 2)"] / GIB
          - expected["engine activations (profile run, 16384 tokens)"] / GIB - mp.ENGINE_CUDA_GRAPHS_GIB)
    assert plan.kv_cache_gib == pytest.approx(kv) == pytest.approx(157.722, abs=1e-3)
    assert plan.kv_tokens_per_replica == int(kv * GIB // (2 * 40 * 4 * 128 * 2)) == 2_067_287
    trainer = sum(v for k, v in expected.items() if not k.startswith("engine")) / GIB + mp.TRAINER_RUNTIME_GIB
    resident = (expected["trainer parameters fp32 (1/64)"] + expected["AdamW moments fp32 (1/64)"]) / GIB \
        + mp.TRAINER_RUNTIME_GIB
    assert resident == pytest.approx(mp.trainer_resident_gib(QWEN3_14B, 64))
    # rollout: the trainer's freed memory went back before the wake (empty_cache); its parameters,
    # optimizer state and runtime stay, beside vLLM's 0.91 x 192 and its runtime; update: the
    # sleeping engine keeps its runtime and its CUDA graphs (not offloaded: memory_plan's docstring)
    assert plan.totals == pytest.approx((resident + 0.91 * 192 + mp.ENGINE_RUNTIME_GIB,
                                         trainer + mp.ENGINE_RUNTIME_GIB + mp.ENGINE_CUDA_GRAPHS_GIB))
    assert plan.totals == pytest.approx((180.80, 58.48), abs=0.005)
    assert rows["engine CUDA graphs (assumed)"].gib == (mp.ENGINE_CUDA_GRAPHS_GIB, mp.ENGINE_CUDA_GRAPHS_GIB)
    assert plan.fits and not plan.problems
    assert rows["activations, 32768 tokens, checkpointed"].gib == (None, pytest.approx(29.80, abs=0.005))
    assert rows["engine KV cache (2,067,287 tokens per replica)"].gib[1] is None      # asleep in the update


def test_without_checkpointing_every_layer_keeps_its_activations():
    plan = mp.build_memory_plan(stage2_spec(gradient_checkpointing=False))
    row = next(r for r in plan.rows if r.name.startswith("activations"))
    assert row.gib[1] == pytest.approx(32768 * 41 * 283_496 / GIB) == pytest.approx(354.72, abs=0.01)
    # 14336 tokens: 14336 x (41 x 283,496 + 40,964 + 10,240) B = 155.9 GiB of activations and head
    assert plan.problems == ("does not fit: the update phase needs 383.4 GiB of 192 GiB per GPU, 191.4 GiB over: "
                             "set train.micro_batch_tokens=14336 (or more GPUs)",)


def test_a_plan_that_does_not_fit_says_which_phase_by_how_much_and_what_to_change():
    assert mp.build_memory_plan(stage2_spec(gpu_memory_gib=80.0, gpu_name="h100",
                                            gpu_memory_utilization=0.87)).fits   # 75.7 and 58.5 GiB
    plan = mp.build_memory_plan(stage2_spec(gpu_memory_gib=48.0, gpu_memory_utilization=0.5))
    # 21504 tokens: 11264 fewer x 1,017,556 B of activations and head per token = 10.67 GiB less
    assert plan.problems == ("does not fit: the update phase needs 58.5 GiB of 48 GiB per GPU, 10.5 GiB over: "
                             "set train.micro_batch_tokens=21504 (or more GPUs)",)
    # rollout: 0.95 x 80 for vLLM, the trainer's resident 4.58 GiB and the engine runtime 1.5 GiB
    plan = mp.build_memory_plan(stage2_spec(gpu_memory_gib=80.0, gpu_memory_utilization=0.95))
    assert plan.totals[0] == pytest.approx(0.95 * 80 + (4 * P14 / 64 + 8 * P14 / 64) / GIB + mp.TRAINER_RUNTIME_GIB
                                           + mp.ENGINE_RUNTIME_GIB, rel=1e-3)
    assert plan.problems == ("does not fit: the rollout phase needs 82.1 GiB of 80 GiB per GPU, 2.1 GiB over: "
                             "set engine.gpu_memory_utilization=0.92 (or leave it auto)",)
    small = mp.build_memory_plan(stage2_spec(gpu_memory_gib=80.0, gpu_memory_utilization=0.15))
    assert small.problems[0].startswith("engine: gpu_memory_utilization 0.15 x 80 GiB = 12.0 GiB does not hold "
                                        "its weights (13.8 GiB)")
    # 13.75 GiB of weights, 3.2 of activations and one max_model_len sequence of KV: 0.23 of 80 GiB
    assert small.problems[0].endswith("set engine.gpu_memory_utilization=0.23 (or leave it auto)")
    long = mp.build_memory_plan(stage2_spec(max_model_len=3_000_000))
    assert long.problems[0].startswith("engine: the KV cache holds 2,067,287 tokens, less than one "
                                       "max_model_len=3,000,000 sequence: even all of the GPU's room")
    assert long.problems[0].endswith("set engine.tensor_parallel_size=4, or use GPUs with more memory")


def test_the_engine_advice_never_asks_for_more_than_the_gpu_has_beside_the_trainer():
    """One node of 40 GiB GPUs, colocated with 8 trainer ranks (what `--gpus 8 --gpu-memory 40` sizes
    to 0.34): the fraction that would hold one sequence is more than the GPU leaves beside the
    trainer's resident state, so the advice is a larger TP, and the plan with that TP gives its
    engine room; with 16 ranks the same GPU has the room, and the advice is that fraction."""
    spec = stage2_spec(trainer_ranks=8, gpu_memory_gib=40.0, gpu_memory_utilization=0.34)
    plan = mp.build_memory_plan(spec)
    assert "set engine.tensor_parallel_size=4" in plan.problems[0] and "gpu_memory_utilization=" not in \
        plan.problems[0].split(": ", 1)[1].split("sequence")[-1]
    fixed = mp.build_memory_plan(dataclasses.replace(spec, tp_size=4))
    assert not [p for p in fixed.problems if p.startswith("engine:")]
    wider = mp.build_memory_plan(dataclasses.replace(spec, trainer_ranks=16))
    assert wider.problems[0].endswith("set engine.gpu_memory_utilization=0.46 (or leave it auto)")


def test_one_h100_node_at_32768_tokens_says_in_one_line_what_to_change():
    """8 x H100 80GB (79.1 GiB to torch), 8 trainer ranks: the fp32 state is 27.5 GiB per rank, and
    with the chunked head's weight gradient and the sleeping engine's CUDA graphs the update at
    32768 tokens per micro-batch needs 82.5 GiB; 28672 tokens bring it to 78.7 (29696 is 0.5 over)."""
    spec = stage2_spec(trainer_ranks=8, gpu_memory_gib=79.1, gpu_name="h100", gpu_memory_utilization=0.64)
    plan = mp.build_memory_plan(spec)
    update = (16 * P14 / 8 + 2 * (1_555_829_760 + 2 * 330_311_936) + 6 * 1_555_829_760
              + 32768 * (40 * 2 * 5120 + 2 * 283_496) + 32768 * (8 * 5120 + 4) + 1024 * 151_936 * 16
              + 151_936 * 5120 * 6) / GIB + mp.TRAINER_RUNTIME_GIB + mp.ENGINE_RUNTIME_GIB + mp.ENGINE_CUDA_GRAPHS_GIB
    assert plan.totals[1] == pytest.approx(update) == pytest.approx(82.55, abs=0.005)
    assert plan.problems == ("does not fit: the update phase needs 82.5 GiB of 79.1 GiB per GPU, 3.4 GiB over: "
                             "set train.micro_batch_tokens=28672 (or more GPUs)",)
    assert mp.build_memory_plan(dataclasses.replace(spec, micro_batch_tokens=28672)).fits
    assert not mp.build_memory_plan(dataclasses.replace(spec, micro_batch_tokens=29696)).fits


def test_separate_engine_gpus_hold_only_the_engine():
    plan = mp.build_memory_plan(stage2_spec(colocated=False, trainer_ranks=48, gpu_memory_utilization=0.9))
    assert plan.columns == ("trainer GPU", "engine GPU")
    params = next(r for r in plan.rows if r.name == "trainer parameters fp32 (1/48)")
    assert params.gib == (pytest.approx(4 * P14 / 48 / GIB), None)
    assert plan.totals[1] == pytest.approx(0.9 * 192 + mp.ENGINE_RUNTIME_GIB)
    assert plan.fits


def test_gpu_memory_presets_are_what_torch_reports():
    """h100: 79.1 GiB (a lent H100 80GB: 81,559 MiB in nvidia-smi, 79.1-79.2 GiB to torch); h200:
    a lent H200, 150,109,880,320 B to torch; mi300x: totalGlobalMem 205,822,885,888 B = 191.69 GiB.
    Each rounded down to 0.1 GiB."""
    assert gpu_card.parse_gpu_memory("mi300x") == 191.6 and gpu_card.parse_gpu_memory("H100") == 79.1
    assert gpu_card.parse_gpu_memory("h200") == 139.8 and gpu_card.parse_gpu_memory("64") == 64.0
    assert gpu_card.GPU_MEMORY_PRESETS["mi300x"] == int(205_822_885_888 / GIB * 10) / 10
    assert gpu_card.GPU_MEMORY_PRESETS["h200"] == int(150_109_880_320 / GIB * 10) / 10
    for bad in ("a100x", "-8", "0"):
        with pytest.raises(gpu_card.MemoryPlanError, match="--gpu-memory"):
            gpu_card.parse_gpu_memory(bad)


def test_the_gpu_planned_for_says_where_it_came_from(monkeypatch):
    monkeypatch.setattr(gpu_card, "local_gpu_memory", lambda: None)
    assert gpu_card.resolve_gpu_memory("MI300X") == gpu_card.GpuMemory(191.6, "mi300x", None)
    assert gpu_card.resolve_gpu_memory("96") == gpu_card.GpuMemory(96.0, "custom", None)
    assumed = gpu_card.resolve_gpu_memory(None)
    assert (assumed.gib, assumed.name) == (191.6, "mi300x")
    assert assumed.note == ("memory: no GPU is visible here and no --gpu-memory was given: planned for an MI300X "
                            "(191.6 GiB); plan for yours with --gpu-memory h100|h200|mi300x|GiB")
    # a visible GPU: its real memory, rounded down to 0.1 GiB; a launch plans for it whatever
    # --gpu-memory says (and says so), a dry run plans for the card asked for
    monkeypatch.setattr(gpu_card, "local_gpu_memory", lambda: (79.19, "NVIDIA H100 80GB HBM3"))
    assert gpu_card.resolve_gpu_memory(None) == gpu_card.GpuMemory(79.1, "NVIDIA H100 80GB HBM3", None)
    assert gpu_card.resolve_gpu_memory("h200", dry_run=True) == gpu_card.GpuMemory(139.8, "h200", None)
    launch = gpu_card.resolve_gpu_memory("h200", dry_run=False)
    assert (launch.gib, launch.name) == (79.1, "NVIDIA H100 80GB HBM3")
    assert launch.note == ("memory: --gpu-memory h200 left aside: this launch runs on this node's GPU, "
                           "NVIDIA H100 80GB HBM3 (79.1 GiB)")


def test_a_sequence_longer_than_the_micro_batch_is_planned_whole():
    """The packer gives a sequence longer than train.micro_batch_tokens a micro-batch of its own
    (rl/update/packing.py `plan_bins`, `plan_buckets`): 12K responses (14336-token context) at 8192
    micro-batch tokens keep 14336 tokens of activations and log-prob head."""
    spec = stage2_spec(micro_batch_tokens=8192, max_model_len=14336)
    assert mp.largest_micro_batch(spec) == 14336
    rows = {r.name: r.gib[1] for r in mp.build_memory_plan(spec).rows}
    assert rows["activations, 14336 tokens (the longest trajectory), checkpointed"] == pytest.approx(
        14336 * (40 * 2 * 5120 + 2 * 283_496) / GIB)
    assert rows["log-prob head, 1024-token chunks"] == pytest.approx(
        (14336 * (8 * 5120 + 4) + 1024 * 151_936 * 16) / GIB)
    whole = {r.name: r.gib[1] for r in mp.build_memory_plan(stage2_spec(micro_batch_tokens=14336)).rows}
    assert whole["activations, 14336 tokens, checkpointed"] == rows[
        "activations, 14336 tokens (the longest trajectory), checkpointed"]
    # so no micro-batch size below the longest trajectory brings the update under a GPU it does not fit
    tight = stage2_spec(trainer_ranks=8, gpu_memory_gib=55.0, gpu_memory_utilization=0.3)
    assert mp.fitting_micro_batch(tight, 32768) is None
    assert mp.build_memory_plan(tight).problems[-1].endswith(
        "more GPUs (trainer ranks shard the fp32 state) or a shorter rollout.max_response_tokens")


runner = CliRunner()
DRY = ["rl", "--stage", "2", "--gpus", "64", "--master-addr", "head0", "--dry-run"]


def test_dry_run_prints_the_table_and_the_verdict():
    out = runner.invoke(app, [*DRY, "--gpu-memory", "mi300x"], terminal_width=250, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = out.output
    assert "memory per GPU (GiB): 191.6 GiB GPU (mi300x), 64 trainer ranks, colocated, TP 2" in text
    assert "engines: gpu_memory_utilization 0.91, max_num_seqs 512" in text
    assert "max_num_batched_tokens 16384" in text and "CUDA graphs" in text
    assert "activations, 20480 tokens, checkpointed" in text
    assert "fits: at most 180.4 of 191.6 GiB per GPU (11.2 GiB headroom)" in text
    out = runner.invoke(app, [*DRY, "--gpu-memory", "141"], terminal_width=250, env={"COLUMNS": "250"})
    assert "memory per GPU (GiB): 141 GiB GPU (custom)" in out.output
    out = runner.invoke(app, [*DRY, "--gpu-memory", "lots"], terminal_width=250, env={"COLUMNS": "250"})
    assert out.exit_code == 2 and "--gpu-memory 'lots': give GiB per GPU or one of mi300x, h100, h200" in out.output


def test_cpu_dry_run_has_no_memory_table():
    out = runner.invoke(app, ["rl", "--stage", "1", "--dry-run"], terminal_width=250, env={"COLUMNS": "250"})
    assert out.exit_code == 0 and "memory per GPU" not in out.output


def test_plan_with_its_memory_table_is_json_serialisable():
    import json

    from rstar2_cli.launch.topology import plan_from_args

    plan = dataclasses.replace(plan_from_args(64, 8, tp_size=2, master_addr="n1"),
                               memory=mp.build_memory_plan(stage2_spec()))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["memory"]["columns"] == ["rollout", "update"]
    assert data["memory"]["spec"]["shape"]["hidden"] == 5120 and data["memory"]["problems"] == []
