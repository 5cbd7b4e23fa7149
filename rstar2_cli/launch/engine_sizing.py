"""What a GPU launch sizes where the recipe says "auto", from the launch's memory plan: the vLLM
engines' fields (`size_engines`) and `train.micro_batch_tokens` (`size_micro_batch`); on CPU they
are fixed values (rollout/engine_args.py, config.CPU_MICRO_BATCH_TOKENS).

`rstar2 rl` sizes a GPU launch before it writes the resolved recipe, so every trainer process
builds its engines and micro-batches with the same numbers, which the dry run shows:

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
* `train.micro_batch_tokens` (after the engines, whose sizing does not depend on it): the largest
  multiple of 1024 whose update phase fits the GPU (`memory_plan.fitting_micro_batch`, which
  counts a trajectory longer than that as a micro-batch of its own), at most
  RELEASE_MICRO_BATCH_TOKENS; when none fits, MIN_MICRO_BATCH_TOKENS, and the plan says it does not fit
  (both in config.py, beside what auto is on CPU).

The constants and `engine_kwargs`, which turns an engine section into vLLM's arguments and sizes
what is still "auto" for an engine no plan sized, live with the engines (`rollout/engine_args.py`).
"""
from __future__ import annotations

import math

from rstar2_cli.config import MIN_MICRO_BATCH_TOKENS, RELEASE_MICRO_BATCH_TOKENS
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import shape_for_model
from rstar2_cli.rollout.engine_args import (GPU_BATCH_TOKENS, MAX_NUM_SEQS_CAP, default_max_model_len,
                                          planned_utilization)


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


def size_micro_batch(cfg, plan, gpu_gib: float):
    """`cfg` (RecipeConfig, engines sized) with an "auto" `train.micro_batch_tokens` sized for `plan`
    (a GPU launch) on `gpu_gib` GPUs; a number stays."""
    if cfg.train.micro_batch_tokens != "auto":
        return cfg
    trial = cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"micro_batch_tokens": RELEASE_MICRO_BATCH_TOKENS})})
    tokens = mp.fitting_micro_batch(memory_spec_for(trial, plan, gpu_gib, ""), RELEASE_MICRO_BATCH_TOKENS)
    return cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"micro_batch_tokens": tokens or MIN_MICRO_BATCH_TOKENS})})
