"""Where `rstar2 eval`, `eval all` and `prepare hard` put their vLLM replicas: one per group of TP
GPUs over every GPU this process sees, TP the smallest whose replica fits one GPU of the group.

A replica alone on its GPUs (no trainer beside it) gets `planned_utilization(gpu, 0)` of each
(rollout/engine_args.py: all but its runtime and the headroom). It must hold, per GPU
(`replica_gib`, with the memory plan's formulas, launch/memory_plan.py): the bf16 weights split
over TP, vLLM's profile-run activations at GPU_BATCH_TOKENS and the sampler of
UNPLANNED_MAX_NUM_SEQS sequences, its CUDA graphs, and the KV cache of MIN_KV_CONTEXTS full
contexts. TP is a divisor of the GPU count that divides the attention heads (vLLM refuses other
sizes: vllm/config/model.py `verify_with_parallel_config`); the smallest that fits gives the most
replicas, and data-parallel replicas need no communication between them. Requests spread over the
replicas through the load-balanced scheduler (rollout/scheduler.py), as RL's rollouts do.

The GPUs are those this process sees (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES restrict them;
hosts/gpu_visibility.py places each replica on its group); without a GPU one replica runs on the
default device, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from rstar2_cli.hosts.gpu_visibility import local_gpu_memory
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import Qwen3Shape
from rstar2_cli.models.checkpoint_config import checkpoint_config
from rstar2_cli.rollout.engine_args import GPU_BATCH_TOKENS, UNPLANNED_MAX_NUM_SEQS, planned_utilization

# Assumed, not measured: a replica whose KV cache holds fewer full contexts than this runs too few
# long samples at once to be worth its GPUs (vLLM itself refuses to start below one).
MIN_KV_CONTEXTS = 4


@dataclass(frozen=True)
class EvalEngines:
    """The replicas of one evaluation: `gpu_groups` holds each replica's node-local GPU ids (empty:
    one replica on the default device); `why` says in one line how TP was chosen."""

    tensor_parallel_size: int
    gpu_groups: tuple[tuple[int, ...], ...]
    why: str

    def settings(self) -> dict:
        """The EvalSettings fields that place the replicas."""
        return {"tensor_parallel_size": self.tensor_parallel_size,
                "gpu_groups": [list(g) for g in self.gpu_groups] or None}


def replica_gib(shape: Qwen3Shape, tp: int, max_model_len: int) -> float:
    """GiB one GPU of a TP-`tp` replica needs (module docstring)."""
    need = (mp.engine_weight_bytes(shape, tp)
            + mp.engine_activation_bytes(shape, tp, UNPLANNED_MAX_NUM_SEQS, GPU_BATCH_TOKENS)
            + MIN_KV_CONTEXTS * max_model_len * mp.kv_bytes_per_token(shape, tp))
    return need / mp.GIB + mp.ENGINE_CUDA_GRAPHS_GIB


def plan_eval_engines(shape: Qwen3Shape | None, *, gpus: int, gpu_gib: float | None, max_model_len: int,
                      tp: int | None = None) -> EvalEngines:
    """The replicas of a model of `shape` on `gpus` GPUs of `gpu_gib` GiB each (0: none) at context
    `max_model_len`; `tp` (the `--tp` option) fixes the tensor-parallel size. A model whose shape
    is not known (None) runs at TP 1 unless `tp` is given. ValueError, one line, when `tp` cannot
    be used or no group of GPUs holds the model."""
    if gpus < 1:
        if tp not in (None, 1):
            raise ValueError(f"--tp {tp}: no GPU is visible, so one replica runs on the CPU")
        return EvalEngines(1, (), "no GPU visible: one replica on the default device")
    if tp is not None:
        if tp > gpus:
            raise ValueError(f"--tp {tp}: more than the {gpus} GPUs this process sees")
        if gpus % tp:
            raise ValueError(f"--tp {tp} does not divide the {gpus} GPUs this process sees "
                             "(set CUDA_VISIBLE_DEVICES to a multiple of it)")
        if shape is not None and shape.heads % tp:
            raise ValueError(f"--tp {tp} does not divide the model's {shape.heads} attention heads (vLLM refuses it)")
        return _placed(tp, gpus, "--tp")
    if shape is None:
        return _placed(1, gpus, "TP 1 assumed: the checkpoint's config.json gives no size (--tp sets it)")
    engine_gib = planned_utilization(gpu_gib, 0.0) * gpu_gib
    sizes = [t for t in range(1, gpus + 1) if gpus % t == 0 and shape.heads % t == 0]
    for t in sizes:
        need = replica_gib(shape, t, max_model_len)
        if need <= engine_gib:
            return _placed(t, gpus, f"{need:.1f} GiB a GPU (bf16 weights, activations, KV of "
                                    f"{MIN_KV_CONTEXTS} x {max_model_len} tokens) within {engine_gib:.1f}")
    largest = sizes[-1]
    raise ValueError(f"the model does not fit {gpus} GPUs of {gpu_gib:.1f} GiB: a replica of TP {largest} needs "
                     f"{replica_gib(shape, largest, max_model_len):.1f} GiB a GPU, {engine_gib:.1f} are free "
                     f"(lower --max-model-len, or use larger GPUs)")


def _placed(tp: int, gpus: int, reason: str) -> EvalEngines:
    groups = tuple(tuple(range(i, i + tp)) for i in range(0, gpus, tp))
    return EvalEngines(tp, groups, f"{len(groups)} replicas x TP {tp} on {gpus} GPUs: {reason}")


def checkpoint_shape(model: str) -> Qwen3Shape | None:
    """The decoder sizes in `model`'s config.json (a folder, or a Hub id in the local cache);
    None when there is none or it lacks a size."""
    config = checkpoint_config(model)
    if config is None:
        return None
    try:
        return Qwen3Shape.from_hf_config(config)
    except (ValueError, KeyError, TypeError):      # a config without the decoder's sizes
        return None


def local_gpus() -> tuple[int, float | None]:
    """(GPUs this process sees, GiB of the first) — (0, None) without one."""
    card = local_gpu_memory()
    if card is None:
        return 0, None
    import torch  # lazy: torch may be absent (a login node); local_gpu_memory found it

    return torch.cuda.device_count(), card[0]


def eval_engines_for(model: str, max_model_len: int, tp: int | None = None) -> EvalEngines:
    """`plan_eval_engines` for the checkpoint `model` on this machine's visible GPUs."""
    gpus, gib = local_gpus()
    return plan_eval_engines(checkpoint_shape(model), gpus=gpus, gpu_gib=gib, max_model_len=max_model_len, tp=tp)
