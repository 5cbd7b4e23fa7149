"""The pieces of the GPU smoke benchmark that do not need the trainer: model, FLOPs, batches.

A new cluster is checked with one number before a 64-GPU run: model FLOPs utilisation (MFU) of
a policy update on a Qwen3-shaped model. That number is only meaningful if the FLOP count is
written down, so it lives here, tested on CPU against hand-computed values.

Only torch and transformers are imported (no rich, no project install): `benchmarks/gpu/gpu_smoke.py`
must run on a bare GPU box with the source tree on sys.path.

FLOP convention (PaLM appendix B / torchtitan, so numbers compare with theirs):
    training FLOPs per token of a sequence of length s
        = 6 * N_matmul + 12 * n_layers * (n_heads * head_dim) * s
    N_matmul = non-embedding parameters + vocab * hidden (the LM-head matmul is real work whether
    or not it is tied; the input-embedding lookup is not a matmul). 6 = 2 (multiply-add) x 3
    (forward + two backward matmuls). The attention term counts QK^T and AV over the full s
    (causal masking is not halved). With packed micro-batches each sequence uses its own s, so
    a packed batch costs sum_i s_i * (6 N_matmul + 12 L d_attn s_i): useful work only.
"""
from __future__ import annotations

import math
import random

import torch

from rstar2_cli.launch.model_shape import Qwen3Shape
from rstar2_cli.rl.update.packing import plan_bins

# bf16 dense peak TFLOP/s per device, most specific name first. Sources: NVIDIA H100/H200 and
# A100 datasheets (dense, without sparsity), AMD CDNA3 MI300X/MI325X datasheets.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H200", 989.4),
    ("A100", 312.0),
    ("MI325X", 1307.4),
    ("MI300X", 1307.4),
)
# ROCm sometimes reports an empty marketing name; gfx942 is the CDNA3 MI300X/MI325X die.
_ARCH_FALLBACK = {"gfx942": 1307.4}


# The default smoke shape, ~1.0B parameters: Qwen3-1.7B's widths (GQA 16/8 heads of 128, MLP
# 6144, 151,936-token tied vocabulary) with 14 of its 28 layers.
SMOKE_1B = Qwen3Shape(hidden=2048, layers=14, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151936)
SMOKE_1B_TOTAL_PARAMS = 1_015_870_976
SMOKE_1B_NON_EMBEDDING_PARAMS = 704_706_048
# Qwen3-1.7B itself (1.7B total, 1.4B non-embedding), for a closer look at a real model's step.
QWEN3_1_7B = Qwen3Shape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151936)
TINY = Qwen3Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000)
SHAPES = {"1b": SMOKE_1B, "qwen3-1.7b": QWEN3_1_7B, "tiny": TINY}


def qwen3_config(shape: Qwen3Shape, attn_implementation: str = "sdpa"):
    from transformers import Qwen3Config

    config = Qwen3Config(
        hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate_size=shape.intermediate,
        vocab_size=shape.vocab, tie_word_embeddings=shape.tie_embeddings, max_position_embeddings=32768,
    )
    config._attn_implementation = attn_implementation
    return config


def build_smoke_model(tiny: bool = False, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                      attn_implementation: str = "sdpa", seed: int = 0, shape: str = "1b"):
    """A randomly initialised Qwen3ForCausalLM of `shape` (a SHAPES key; `tiny=True` means
    "tiny"); asserts the parameter count matches the shape."""
    from transformers import AutoModelForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: choose one of {', '.join(SHAPES)}")
    shape = TINY if tiny else SHAPES[shape]
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen3_config(shape, attn_implementation), dtype=dtype)
    count = sum(p.numel() for p in model.parameters())
    if count != shape.total_params():
        raise AssertionError(f"built {count} parameters, shape says {shape.total_params()}")
    return model, shape


def training_flops(shape: Qwen3Shape, seq_lens: list[int]) -> float:
    """Model FLOPs of one forward+backward over these (packed) sequences; see module docstring."""
    per_token = 6 * (shape.non_embedding_params() + shape.vocab * shape.hidden)   # 6 * N_matmul
    attention = 12 * shape.layers * shape.attn_dim
    return float(sum(s * (per_token + attention * s) for s in seq_lens))


def mfu(flops: float, seconds: float, peak_tflops: float, n_devices: int = 1) -> float:
    """Achieved FLOP/s over the devices' bf16 dense peak, as a fraction (0.4 = 40%)."""
    if seconds <= 0 or peak_tflops <= 0 or n_devices <= 0:
        raise ValueError(f"mfu needs positive seconds, peak and devices, got {seconds}, {peak_tflops}, {n_devices}")
    return flops / seconds / (peak_tflops * 1e12 * n_devices)


def peak_tflops_for(device_name: str, arch: str = "") -> float | None:
    """Table lookup by device name (then ROCm arch); None when unknown (pass --peak-tflops)."""
    for needle, tflops in PEAK_BF16_TFLOPS:
        if needle.lower() in device_name.lower():
            return tflops
    return _ARCH_FALLBACK.get(arch.split(":", 1)[0]) if arch else None


def detect_peak_tflops(override: float | None = None) -> tuple[str, float | None]:
    """(device name, peak) for cuda:0; the override wins. CPU gives ("cpu", override)."""
    if not torch.cuda.is_available():
        return "cpu", override
    name = torch.cuda.get_device_name(0)
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    return name, override if override is not None else peak_tflops_for(name, arch)


def peak_memory_gib() -> dict[str, float] | None:
    if not torch.cuda.is_available():
        return None
    return {"allocated": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "reserved": round(torch.cuda.max_memory_reserved() / 2**30, 2)}


def sample_rollout_lengths(n: int, max_len: int = 8192, seed: int = 0) -> list[int]:
    """Prompt + response lengths shaped like agentic math rollouts with an 8K response cap.

    Prompts 100-400 tokens; responses log-normal around 3K tokens, some hitting the cap (the
    "clipped" rollouts stage 1 trains with), so micro-batches see the real length spread.
    """
    rng = random.Random(seed)
    lengths = []
    for _ in range(n):
        prompt = rng.randint(100, 400)
        response = int(rng.lognormvariate(math.log(3000), 0.6))
        lengths.append(max(prompt + 1, min(prompt + response, max_len)))
    return lengths


def pack_sequences(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing into micro-batches of at most max_tokens tokens each."""
    if any(n > max_tokens for n in lengths):
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit max_tokens={max_tokens}")
    return [sorted((lengths[i] for i in b), reverse=True) for b in plan_bins(lengths, max_tokens)]


def packed_batch(seq_lens: list[int], vocab: int, device: str | torch.device = "cpu",
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """One packed row: position ids restart per sequence (transformers derives the block-diagonal
    mask / varlen boundaries from them); the first token of every sequence is not a target, so
    no sequence learns to predict its neighbour."""
    total = sum(seq_lens)
    input_ids = torch.randint(0, vocab, (1, total), generator=generator)
    position_ids = torch.cat([torch.arange(s) for s in seq_lens]).unsqueeze(0)
    labels = input_ids.clone()
    starts = torch.tensor([0, *seq_lens[:-1]]).cumsum(0)
    labels[0, starts] = -100
    return {k: v.to(device) for k, v in
            {"input_ids": input_ids, "position_ids": position_ids, "labels": labels}.items()}


def packed_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Causal-LM loss of a packed row. `use_cache=False` matters: with a KV cache present,
    transformers skips packed-sequence detection and lets sequences attend to each other."""
    return model(**batch, use_cache=False).loss
