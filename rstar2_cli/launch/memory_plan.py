"""GPU memory of an RL launch, per GPU and per phase, worked out before anything starts.

A plan that runs out of memory on the first wake-up of the engines has cost a 64-GPU job its
model loading. So `rstar2 rl --dry-run` adds up, for one GPU, everything the trainer and the
vLLM engines hold in each phase, and says in one line which phase does not fit and by how much.
Every term is a formula below with its source; the ones not derived from code are marked
*assumed* (TRAINER_RUNTIME_GIB, ENGINE_RUNTIME_GIB, ENGINE_CUDA_GRAPHS_GIB, the backward transient). Nothing here was
measured on a GPU. The card's memory the plan is for comes from `gpu_card.py`.

Trainer (rl/update/model_load.py, rl/update/policy.py): fp32 parameters sharded by FSDP2 over all N trainer
ranks (`fully_shard` per decoder layer, then the root), so per rank
  parameters 4 P / N, gradients 4 P / N (FSDP2 keeps sharded gradients in the parameters' fp32;
  the policy reduces in fp32), AdamW exp_avg + exp_avg_sq 8 P / N (fp32, like the parameters).
  There is no separate master copy: the fp32 parameters are the master weights, and
  MixedPrecisionPolicy(param_dtype=bf16) casts them only for compute.
FSDP2 buffers, bf16 all-gathers: the root unit (embeddings, LM head, final norm) stays unsharded
through forward and backward (torch reshards the root only after backward), two decoder layers
(the one computing and the one prefetched); gradient reduction of the largest unit: its bf16
gradients plus the fp32 copy reduce-scattered (reduce_dtype=fp32):
  2 B x (root + 2 x layer) + 6 B x max(root, layer).
Activations of the largest micro-batch, T = max(`train.micro_batch_tokens`, `max_model_len`)
tokens: the packer fills a micro-batch up to `train.micro_batch_tokens` but gives a longer sequence
one of its own, uncut (rl/update/packing.py `plan_bins` and `plan_buckets`: "or one long item"), and a
trajectory is at most the engine's context, prompt + `rollout.max_response_tokens`
(rollout/engine_args.py `default_max_model_len`). bf16, per layer and token (the tensors autograd
saves in transformers' Qwen3DecoderLayer; tests/launch count them):
  A = 2 B x (8 h + 5 a + 5 kv + 4 I + 4 heads + 2 kv_heads + 2 head_dim + 4)
  (h hidden, a = heads x head_dim, kv = kv_heads x head_dim, I intermediate: the RMSNorms keep
  an fp32 input and a bf16 output, q and k pass q_norm/k_norm (fp32 inside), rotary and
  attention; the MLP keeps gate, up, silu(gate) and their product; per-head fp32 statistics.)
  With `model.gradient_checkpointing` only each layer's bf16 input is kept (2 B x h), and
  backward recomputes one layer at a time: T x (L x 2 h B + 2 A), the second A being that
  layer's activation gradients (assumed the size of its activations). Without it:
  T x (L + 1) x A.
Log-prob head (rl/update/logprobs.py): the final norm's saved fp32 input and bf16 output for all T
tokens and the hidden states' bf16 gradient `grad_h` the chunked head forms in its forward,
T x (8 h + 4) B, and one chunk of `train.logprob_chunk_tokens` C tokens over the vocabulary V:
  C x V x 4 B x 4 (fp32 logits, log-softmax, the probabilities of the entropy, the logits'
  gradient). The head weight's gradient is accumulated over the chunks in fp32, `grad_w` [V, H],
  and handed to autograd as a bf16 copy made while the fp32 one still exists: V x H x (4 + 2) B
  (2.90 + 1.45 GiB at Qwen3-14B).

Engines (rollout/engines.py; vLLM's sizing in vllm/v1/worker/gpu_worker.py and utils.py): each
engine process takes `engine.gpu_memory_utilization` x GPU memory (request_memory: the fraction
is of the GPU's total, and vLLM refuses to start when less is free); of that, weights (bf16,
2 P / TP per GPU) and the profile run's peak activations are taken first, and the KV cache gets
the rest. Profile activations: `engine.max_num_batched_tokens` M tokens of one layer, plus the
sampler's dummy run over `engine.max_num_seqs` rows of the vocabulary (fp32 logits,
probabilities, log-probabilities):
  M x 2 B x (3 h + (a + 2 kv) / TP + 3 I / TP) + max_num_seqs x V x 4 B x 3.
With CUDA graphs (`engine.enforce_eager` false), vLLM 0.32 also takes its estimate of the graphs'
memory from the budget before the KV cache (gpu_worker.py, `profile_cudagraph_memory`, on by
default: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1): ENGINE_CUDA_GRAPHS_GIB, *assumed*.
KV cache per token per GPU: 2 (K and V) x L x max(1, kv_heads / TP) x head_dim x 2 B.

Phases, colocated (`engine.colocate`, the release's verl placement): during the update the
engines sleep (weights and KV cache released from the GPU: level 1 offloads weights to host,
level 2 drops them; vllm/v1/worker/gpu_worker.py `sleep`) and keep their process runtime; they
wake before the weight sync and re-create the KV cache at the same size.
What a sleeping engine keeps, with vLLM 0.32's defaults (rstar2 sets only `enable_sleep_mode`,
rollout/engines.py), is counted in the update column rather than offloaded:
- its CUDA graphs (ENGINE_CUDA_GRAPHS_GIB). `ModelConfig.sleep_mode_offload_cudagraph`
  (vllm/config/model.py:380, `AsyncEngineArgs.sleep_mode_offload_cudagraph`) is False, so graphs
  are captured outside the cuMem pool that sleep backs up (vllm/config/vllm.py:688
  `use_cumem_cudagraph_pool`; vllm/compilation/cudagraph_pool.py `capture_pool`) and stay on the
  GPU. Not offloaded: with it, the TP all-reduce copies each graph buffer instead of registering it
  (vllm/distributed/device_communicators/cuda_communicator.py:124) and vLLM sets
  NCCL_GRAPH_REGISTER=0 (vllm/config/vllm.py:2243), a cost on every decode step of a TP engine
  that no GPU run here has measured, against 1 GiB of an update phase with headroom to spare.
- its TP communicator's buffers, in the engine runtime row of both columns (ENGINE_RUNTIME_GIB,
  rollout/engine_args.py): `ModelConfig.enable_nccl_comm_suspend` (vllm/config/model.py:383) is
  False, so `Worker.sleep` leaves them (vllm/v1/worker/gpu_worker.py:312). Not suspended: vLLM
  marks it experimental, it needs ncclCommSuspend (NCCL >= 2.29.7; without it vLLM only warns and
  keeps the buffers, vllm/distributed/device_communicators/pynccl.py:588), which RCCL builds for
  the MI300X need not have, so the plan must count them either way. The trainer's freed
tensors (gradients after `zero_grad(set_to_none=True)`, activations, FSDP buffers) go back to
the GPU before the engines wake (`torch.cuda.empty_cache()` on every rank in
`rollout/weight_sync/colocated.py`), so during rollouts the trainer holds only its parameters,
optimizer state and runtime. Separate placement: trainer GPUs hold only the trainer, engine GPUs only the engines.

Each row is that component's peak and the totals add the rows, so a total is an upper bound of
its phase (the activations and the root's final reduce-scatter never coincide, yet both count).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from rstar2_cli.launch.model_shape import Qwen3Shape
from rstar2_cli.rollout.engine_args import ENGINE_RUNTIME_GIB

GIB = 1024**3
BF16, FP32 = 2, 4
# Assumed, not measured: a trainer rank's CUDA/HIP context and its NCCL/RCCL communicator buffers
# (NCCL_MIN_NCHANNELS=112 in Dockerfile.rocm: up to ~1 GiB of channel buffers).
TRAINER_RUNTIME_GIB = 2.0
# Assumed, not measured: vLLM's estimate of one engine worker's CUDA graphs (decode batches up to
# 512 sequences), taken from its budget before the KV cache.
ENGINE_CUDA_GRAPHS_GIB = 1.0
MICRO_BATCH_STEP = 1024              # train.micro_batch_tokens is sized and suggested in steps of this
LOGPROB_CHUNK_FACTOR = 4              # fp32 logits, log-softmax, entropy probabilities, logits' gradient
SAMPLER_FACTOR = 3                    # fp32 logits, probabilities, log-probabilities


# ---------------------------------------------------------------- the formulas, in bytes


def trainer_state_bytes(shape: Qwen3Shape, ranks: int) -> dict[str, float]:
    """fp32 parameters, gradients and AdamW moments of one FSDP2 rank."""
    per_rank = shape.total_params() / ranks
    return {"params": FP32 * per_rank, "grads": FP32 * per_rank, "adamw": 2 * FP32 * per_rank}


def host_memory_gib() -> float | None:
    """This machine's physical memory in GiB (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def cpu_training_line(shape: Qwen3Shape, source: str, host_gib: float | None) -> tuple[str, bool]:
    """`--gpus 0`: one line saying that the stage trains on this machine's CPU and what the model's
    fp32 parameters, gradients and AdamW moments (16 B a parameter, one rank) take there, and
    whether that fits the host's memory (False: the launch refuses)."""
    need = _gib(sum(trainer_state_bytes(shape, 1).values()))
    fits = host_gib is None or need <= host_gib
    here = f" of {host_gib:.0f} GiB here" if host_gib else ""
    return (f"--gpus 0: trains on this machine's CPU; the model ({shape.total_params() / 1e9:.1f}B parameters, "
            f"{source}) needs {need:.0f} GiB for its fp32 weights, gradients and AdamW{here}"
            + ("" if fits else ", which does not fit") + "; give --gpus N to launch on GPUs"), fits


def fsdp_buffer_bytes(shape: Qwen3Shape) -> float:
    root, layer = shape.root_params(), shape.layer_params()
    return BF16 * (root + 2 * layer) + (BF16 + FP32) * max(root, layer)


def layer_activation_bytes_per_token(shape: Qwen3Shape) -> int:
    """A: what autograd keeps of one Qwen3 decoder layer per token, bf16."""
    s = shape
    return BF16 * (8 * s.hidden + 5 * s.attn_dim + 5 * s.kv_dim + 4 * s.intermediate
                   + 4 * s.heads + 2 * s.kv_heads + 2 * s.head_dim + 4)


def largest_micro_batch(spec: "MemorySpec") -> int:
    """The most tokens one micro-batch can hold: `micro_batch_tokens`, or a longer trajectory alone."""
    return max(spec.micro_batch_tokens, spec.max_model_len)


def activation_bytes(shape: Qwen3Shape, tokens: int, checkpointing: bool) -> float:
    layer = layer_activation_bytes_per_token(shape)
    if checkpointing:
        return tokens * (shape.layers * BF16 * shape.hidden + 2 * layer)
    return tokens * (shape.layers + 1) * layer


def logprob_head_bytes(shape: Qwen3Shape, tokens: int, chunk_tokens: int) -> float:
    chunk = min(chunk_tokens, tokens)
    return tokens * (8 * shape.hidden + 4) + chunk * shape.vocab * FP32 * LOGPROB_CHUNK_FACTOR


def head_weight_grad_bytes(shape: Qwen3Shape) -> float:
    """The chunked head's fp32 `grad_w` [V, H] and the bf16 copy autograd receives."""
    return shape.vocab * shape.hidden * (FP32 + BF16)


def engine_weight_bytes(shape: Qwen3Shape, tp: int) -> float:
    return BF16 * shape.total_params() / tp


def engine_activation_bytes(shape: Qwen3Shape, tp: int, max_num_seqs: int, batch_tokens: int) -> float:
    s = shape
    per_token = BF16 * (3 * s.hidden + (s.attn_dim + 2 * s.kv_dim) / tp + 3 * s.intermediate / tp)
    return batch_tokens * per_token + max_num_seqs * s.vocab * FP32 * SAMPLER_FACTOR


def kv_bytes_per_token(shape: Qwen3Shape, tp: int) -> float:
    """One token's K and V on one GPU of a TP group (vLLM replicates KV heads when TP > kv_heads)."""
    return 2 * shape.layers * max(1.0, shape.kv_heads / tp) * shape.head_dim * BF16


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class MemorySpec:
    """What the memory of one launch depends on (built from the recipe and the launch plan)."""

    shape: Qwen3Shape
    shape_source: str
    trainer_ranks: int                # FSDP2 world size
    colocated: bool
    tp_size: int
    gpu_memory_gib: float
    gpu_name: str                     # a preset name or "custom"
    gpu_memory_utilization: float
    micro_batch_tokens: int
    logprob_chunk_tokens: int
    gradient_checkpointing: bool
    max_model_len: int                # the engine's context: the longest trajectory, a micro-batch of its own
    max_num_seqs: int
    max_num_batched_tokens: int
    cuda_graphs: bool                 # engine.enforce_eager false


@dataclass(frozen=True)
class MemoryRow:
    name: str
    gib: tuple[float | None, ...]     # one value per column; None: not on this GPU in this phase


@dataclass(frozen=True)
class MemoryPlan:
    spec: MemorySpec
    columns: tuple[str, ...]          # colocated: ("rollout", "update"); separate: ("trainer GPU", "engine GPU")
    rows: tuple[MemoryRow, ...]
    totals: tuple[float, ...]
    kv_cache_gib: float
    kv_tokens_per_replica: int
    problems: tuple[str, ...]         # one line each; empty when the plan fits

    @property
    def fits(self) -> bool:
        return not self.problems


def _gib(nbytes: float) -> float:
    return nbytes / GIB


def trainer_rows(spec: MemorySpec) -> list[tuple[str, float, bool]]:
    """(row, GiB, freed before the engines wake) of one trainer rank."""
    s, T = spec.shape, largest_micro_batch(spec)
    longest = " (the longest trajectory)" if T > spec.micro_batch_tokens else ""
    state = trainer_state_bytes(s, spec.trainer_ranks)
    return [
        (f"trainer parameters fp32 (1/{spec.trainer_ranks})", _gib(state["params"]), False),
        (f"trainer gradients fp32 (1/{spec.trainer_ranks})", _gib(state["grads"]), True),
        (f"AdamW moments fp32 (1/{spec.trainer_ranks})", _gib(state["adamw"]), False),
        ("FSDP2 all-gather/reduce buffers", _gib(fsdp_buffer_bytes(s)), True),
        (f"activations, {T} tokens{longest}, "
         + ("checkpointed" if spec.gradient_checkpointing else "no checkpointing"),
         _gib(activation_bytes(s, T, spec.gradient_checkpointing)), True),
        (f"log-prob head, {min(spec.logprob_chunk_tokens, T)}-token chunks",
         _gib(logprob_head_bytes(s, T, spec.logprob_chunk_tokens)), True),
        ("log-prob head weight gradient, fp32 + bf16 copy", _gib(head_weight_grad_bytes(s)), True),
        ("trainer runtime (assumed)", TRAINER_RUNTIME_GIB, False),
    ]


def trainer_resident_gib(shape: Qwen3Shape, ranks: int) -> float:
    """What a trainer rank keeps on its GPU while colocated engines generate (the rows of
    `trainer_rows` not freed): fp32 parameters, AdamW moments, runtime."""
    state = trainer_state_bytes(shape, ranks)
    return _gib(state["params"] + state["adamw"]) + TRAINER_RUNTIME_GIB


def engine_graphs_gib(spec: MemorySpec) -> float:
    """One engine worker's CUDA graphs (assumed), 0 without them (`engine.enforce_eager`)."""
    return ENGINE_CUDA_GRAPHS_GIB if spec.cuda_graphs else 0.0


def update_phase_gib(spec: MemorySpec) -> float:
    """What one trainer GPU holds at the update's peak: the trainer rows, and colocated what the
    sleeping engine keeps: its runtime and its CUDA graphs (module docstring)."""
    engine_gib = ENGINE_RUNTIME_GIB + engine_graphs_gib(spec) if spec.colocated else 0.0
    return sum(value for _, value, _ in trainer_rows(spec)) + engine_gib


def fitting_micro_batch(spec: MemorySpec, upper: int) -> int | None:
    """The largest `train.micro_batch_tokens`, a multiple of MICRO_BATCH_STEP at most `upper`,
    whose update phase fits `spec`'s GPU; None when none does (below the longest trajectory a
    smaller micro-batch holds no less: `largest_micro_batch`)."""
    for tokens in range(upper // MICRO_BATCH_STEP * MICRO_BATCH_STEP, 0, -MICRO_BATCH_STEP):
        if update_phase_gib(replace(spec, micro_batch_tokens=tokens)) <= spec.gpu_memory_gib:
            return tokens
    return None


def build_memory_plan(spec: MemorySpec) -> MemoryPlan:
    s, tp, gpu = spec.shape, spec.tp_size, spec.gpu_memory_gib
    trainer = trainer_rows(spec)
    budget = spec.gpu_memory_utilization * gpu
    weights = _gib(engine_weight_bytes(s, tp))
    engine_act = _gib(engine_activation_bytes(s, tp, spec.max_num_seqs, spec.max_num_batched_tokens))
    graphs = engine_graphs_gib(spec)
    kv = budget - weights - engine_act - graphs
    kv_tokens = max(0, int(kv * GIB // kv_bytes_per_token(s, tp)))
    engine = [   # (row, GiB, kept while the engine sleeps: module docstring)
        (f"engine weights bf16 (1/TP {tp})", weights, False),
        (f"engine KV cache ({kv_tokens:,} tokens per replica)", kv, False),
        (f"engine activations (profile run, {spec.max_num_batched_tokens} tokens)", engine_act, False),
    ] + ([("engine CUDA graphs (assumed)", graphs, True)] if spec.cuda_graphs else [])
    rows: list[MemoryRow] = []
    if spec.colocated:
        columns = ("rollout", "update")
        for name, value, freed in trainer:
            rows.append(MemoryRow(name, (None if freed else value, value)))   # freed: returned before the wake
        for name, value, kept in engine:
            rows.append(MemoryRow(name, (value, value if kept else None)))
        rows.append(MemoryRow("engine runtime (assumed)", (ENGINE_RUNTIME_GIB, ENGINE_RUNTIME_GIB)))
    else:
        columns = ("trainer GPU", "engine GPU")
        for name, value, _ in trainer:
            rows.append(MemoryRow(name, (value, None)))
        for name, value, _ in engine:
            rows.append(MemoryRow(name, (None, value)))
        rows.append(MemoryRow("engine runtime (assumed)", (None, ENGINE_RUNTIME_GIB)))
    totals = tuple(sum(r.gib[i] or 0.0 for r in rows) for i in range(len(columns)))
    problems = []
    resident = sum(value for _, value, freed in trainer if not freed) if spec.colocated else 0.0
    if kv <= 0:
        problems.append(f"engine: gpu_memory_utilization {spec.gpu_memory_utilization:g} x {gpu:g} GiB = "
                        f"{budget:.1f} GiB does not hold its weights ({weights:.1f} GiB) and activations "
                        f"({engine_act + graphs:.1f} GiB): "
                        + _engine_room(spec, weights + engine_act + graphs, resident))
    elif kv_tokens < spec.max_model_len:
        problems.append(f"engine: the KV cache holds {kv_tokens:,} tokens, less than one "
                        f"max_model_len={spec.max_model_len:,} sequence: "
                        + _engine_room(spec, weights + engine_act + graphs, resident))
    for i, (column, total) in enumerate(zip(columns, totals)):
        if total > gpu:
            where = f"the {column} phase" if spec.colocated else f"a {column}"
            problems.append(f"does not fit: {where} needs {total:.1f} GiB of {gpu:g} GiB per GPU, "
                            f"{total - gpu:.1f} GiB over: " + _what_to_change(spec, column, total - gpu))
    return MemoryPlan(spec=spec, columns=columns, rows=tuple(rows), totals=totals, kv_cache_gib=kv,
                      kv_tokens_per_replica=kv_tokens, problems=tuple(problems))


def _engine_room(spec: MemorySpec, fixed_gib: float, resident_gib: float) -> str:
    """What gives an engine room for one `max_model_len` sequence: the `gpu_memory_utilization` that
    holds it when the GPU has that much beside what stays on it through the rollout (the trainer's
    resident state when colocated, the engine runtime), else a larger TP (each GPU holds less of the
    weights and of each token's KV) or GPUs with more memory. Raising the fraction past what the GPU
    has would only move the shortfall into the rollout phase."""
    gpu = spec.gpu_memory_gib
    needed = (fixed_gib + spec.max_model_len * kv_bytes_per_token(spec.shape, spec.tp_size) / GIB) / gpu
    room = (gpu - resident_gib - ENGINE_RUNTIME_GIB) / gpu
    if needed <= room:
        return f"set engine.gpu_memory_utilization={math.ceil(needed * 100) / 100:.2f} (or leave it auto)"
    return (f"even all of the GPU's room ({room:.2f} of it) is too little: set engine.tensor_parallel_size="
            f"{2 * spec.tp_size}, or use GPUs with more memory")


def _what_to_change(spec: MemorySpec, column: str, over_gib: float) -> str:
    """The recipe field (and value) that brings this phase under the GPU's memory."""
    if column in ("rollout", "engine GPU"):
        fraction = int((spec.gpu_memory_utilization - over_gib / spec.gpu_memory_gib) * 100) / 100
        return f"set engine.gpu_memory_utilization={fraction:.2f} (or leave it auto)"
    tokens = fitting_micro_batch(spec, spec.micro_batch_tokens - 1)
    if tokens is None:
        return "more GPUs (trainer ranks shard the fp32 state) or a shorter rollout.max_response_tokens"
    return f"set train.micro_batch_tokens={tokens} (or more GPUs)"
