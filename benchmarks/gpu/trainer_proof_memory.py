"""The memory and speed checks of benchmarks/gpu/gpu_trainer_proof.py: the size of the proof's
model, the 1-rank FSDP2 update against launch/memory_plan.py, its tokens/s and MFU, and the
engines' start-up headroom after the optimizer state is continued.

Sizing: the plan must fit the card, or "measured <= planned" could not fail (the run would go out
of memory first). `choose_size` reads the card's memory and takes, among UPDATE_TOKENS x LAYERS
(most tokens first, then most layers), the first shape whose planned trainer total is at most
PLAN_SHARE of it: a measured peak up to 1 / PLAN_SHARE of the plan still fits, so an overshoot is
reported as a failed check, not an out-of-memory.

Device-level peak of the update: torch.cuda.max_memory_reserved() over the warm-up and timed
updates, plus what the device holds outside torch's caching allocator (CUDA context, NCCL, cuBLAS
handles), measured after the updates as (total - free) from torch.cuda.mem_get_info minus
torch.cuda.memory_reserved(). The plan's trainer total counts the same (its "trainer runtime" row
is the non-torch part). The check passes when that peak is within the plan and not more than
PLAN_BAND under it.

Engine headroom: `rstar2 rl` continuing a stage or resuming calls rl/update/checkpoint.py's
continue_optimizer, whose get_optimizer_state_dict initialises AdamW by a zero-gradient step
(torch/distributed/checkpoint/state_dict.py `_init_optim_state`): full-size gradients and the
foreach step's temporaries, freed into torch's cache. vLLM then refuses to start unless
gpu_memory_utilization x total is free (vllm/v1/worker/utils.py `request_memory`). The check runs
that path on the 1-rank FSDP2 policy, releases the cache as the trainer does before engines start
(rollout/weight_sync/colocated.py `release_trainer_cache`) and compares the free memory with the
fraction launch/engine_sizing.py would set for a colocated engine on this card.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

import gpu_smoke
import smoke_model as sm
from trainer_proof_model import CHUNK_TOKENS, GIB, CheckFailed, Context, Skipped, first_line, policy_for, rows_of
from rstar2_cli.launch.gpu_card import resolve_gpu_memory
from rstar2_cli.launch.memory_plan import MemorySpec, build_memory_plan, trainer_resident_gib
from rstar2_cli.rl.update.checkpoint import continue_optimizer, save_checkpoint
from rstar2_cli.rollout.engine_args import GPU_BATCH_TOKENS, UNPLANNED_MAX_NUM_SEQS, planned_utilization
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache

UPDATE_TOKENS = (32768, 24576, 16384, 8192)   # the stage recipes' micro-batch is 32K tokens at most
LAYERS = (4, 3, 2)                # two or more: FSDP2 prefetches the next layer while one computes
PLAN_SHARE = 0.9
PLAN_BAND = 0.15                  # a peak more than this fraction under the plan fails: the plan overstates
TRAJECTORIES = 4                  # of the update micro-batch, each a quarter of its tokens


# ---------------------------------------------------------------- the plan


def memory_spec(shape, *, tokens: int, longest: int, gpu_gib: float, checkpointing: bool):
    """launch/memory_plan.py's inputs for one FSDP2 trainer rank alone on a `gpu_gib` GPU, updating
    `tokens`-token micro-batches whose longest sequence is `longest`. The engine fields (unused on a
    trainer GPU) are the defaults of an engine alone on its GPU (rollout/engine_args.py)."""
    return MemorySpec(shape=shape, shape_source="gpu_trainer_proof (random weights)", trainer_ranks=1,
                      colocated=False, tp_size=1, gpu_memory_gib=gpu_gib, gpu_name="custom",
                      gpu_memory_utilization=planned_utilization(gpu_gib, 0.0), micro_batch_tokens=tokens,
                      logprob_chunk_tokens=CHUNK_TOKENS, gradient_checkpointing=checkpointing,
                      max_model_len=longest, max_num_seqs=UNPLANNED_MAX_NUM_SEQS,
                      max_num_batched_tokens=GPU_BATCH_TOKENS, cuda_graphs=True)


def planned_trainer(spec) -> tuple[float, list]:
    """(the plan's trainer-GPU total in GiB, its rows) for `spec`."""
    plan = build_memory_plan(spec)
    if plan.columns[0] != "trainer GPU":
        raise AssertionError(f"expected a trainer-GPU column first, got {plan.columns}")
    rows = [(r.name, round(r.gib[0], 2)) for r in plan.rows if r.gib[0] is not None]
    return plan.totals[0], rows


def plan_for(shape, tokens: int, gpu_gib: float, checkpointing: bool) -> tuple[float, list]:
    return planned_trainer(memory_spec(shape, tokens=tokens, longest=tokens // TRAJECTORIES, gpu_gib=gpu_gib,
                                       checkpointing=checkpointing))


def fit_update(widths, gpu_gib: float, checkpointing: bool) -> dict:
    """The first (tokens, layers) of UPDATE_TOKENS x LAYERS whose plan is at most PLAN_SHARE of
    `gpu_gib` (module docstring); raises ValueError when none is."""
    for tokens in UPDATE_TOKENS:
        for layers in LAYERS:
            planned, _ = plan_for(replace(widths, layers=layers), tokens, gpu_gib, checkpointing)
            if planned <= PLAN_SHARE * gpu_gib:
                return {"layers": layers, "update_tokens": tokens, "planned_gib": round(planned, 2),
                        "card_gib": round(gpu_gib, 2)}
    raise ValueError(f"no proof shape's plan fits {PLAN_SHARE:g} x {gpu_gib:.1f} GiB (tried {UPDATE_TOKENS} "
                     f"tokens x {LAYERS} layers)")


def choose_size(args, widths, sizes: dict, gpu_gib: float | None) -> tuple[int, int, str]:
    """(layers, update tokens, how they were chosen): `--layers` / `--update-tokens` where given,
    the rest by `fit_update` on a GPU, else the widths' CPU sizes."""
    if gpu_gib is None or (args.layers and args.update_tokens):
        how = "given" if args.layers and args.update_tokens else "CPU sizes"
        return args.layers or sizes["layers"], args.update_tokens or sizes["update_tokens"], how
    fit = fit_update(widths, gpu_gib, args.checkpointing)
    return args.layers or fit["layers"], args.update_tokens or fit["update_tokens"], "fitted to the card"


# ---------------------------------------------------------------- the update


def device_peak_gib() -> dict:
    """The update's device-level peak (module docstring), from the counters as they stand."""
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    non_torch = total - free - reserved
    return {"peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 2),
            "non_torch_gib": round(non_torch / GIB, 2),
            "device_peak_gib": round((torch.cuda.max_memory_reserved() + non_torch) / GIB, 2)}


def run_update(ctx: Context, tokens: int | None = None) -> dict:
    """Updates of one `tokens`-token micro-batch (default `update_tokens`; TRAJECTORIES trajectories
    of equal length) on a policy built from the checkpoint as `rstar2 rl` builds it (FSDP2, 1 rank),
    timed, with the device-level peak. The full-size run is kept for the next checks; a failure of
    it is remembered, not repeated."""
    full_size = tokens is None
    tokens = ctx.update_tokens if full_size else tokens
    if full_size and "update_error" in ctx.kept:
        raise AssertionError(f"the {tokens}-token update failed: {ctx.kept['update_error']}")
    ctx.free()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        policy = policy_for(ctx, micro_batch_tokens=tokens, checkpointing=ctx.args.checkpointing)
        lengths = [tokens // TRAJECTORIES] * TRAJECTORIES
        batch, adv = gpu_smoke.rollout_batch(lengths, ctx.shape.vocab, seed=3)
        assert len(rows_of(policy, batch)) == 1, "the update must be one micro-batch"
        stats = []
        seconds = gpu_smoke.measure(lambda: stats.append(policy.update(batch, adv)), ctx.args.steps, 1, ctx.sync)
    except Exception as e:
        if full_size:
            ctx.kept["update_error"] = first_line(e)
        raise
    result = {"policy": policy, "lengths": lengths, "seconds": seconds, "loss": stats[-1]["loss"],
              "grad_norm": stats[-1]["grad_norm"], "sharded": policy.sharded,
              "peak": device_peak_gib() if ctx.cuda else None}
    if full_size:
        ctx.kept["update"] = result
    return result


def memory_verdict(figures: dict) -> None:
    planned, peak, card = figures["planned_gib"], figures["device_peak_gib"], figures["card_gib"]
    if planned > card:
        raise CheckFailed(f"the plan ({planned:.2f} GiB) exceeds the card ({card:.2f} GiB): measured <= planned "
                          "cannot fail; leave --layers / --update-tokens to the sizing", figures)
    if peak > planned:
        raise CheckFailed(f"measured {peak:.2f} GiB > planned {planned:.2f} GiB", figures)
    if peak < (1 - PLAN_BAND) * planned:
        raise CheckFailed(f"measured {peak:.2f} GiB is more than {PLAN_BAND:.0%} under planned {planned:.2f} GiB: "
                          "the plan overstates the update", figures)


def check_update_memory(ctx: Context) -> dict:
    gpu_gib = ctx.card_gib or ctx.args.plan_gpu_gib
    planned, rows = plan_for(ctx.shape, ctx.update_tokens, gpu_gib, ctx.args.checkpointing)
    figures = {"layers": ctx.shape.layers, "tokens": ctx.update_tokens, "trajectories": TRAJECTORIES,
               "gradient_checkpointing": ctx.args.checkpointing, "card_gib": round(gpu_gib, 2),
               "planned_gib": round(planned, 2), "plan_rows": rows}
    if not ctx.cuda:
        raise Skipped(f"needs CUDA (the plan for a {gpu_gib:g} GiB card is in the JSON)", figures)
    try:
        run = ctx.kept.get("update") or run_update(ctx)
    except Exception as e:
        raise CheckFailed(first_line(e), figures) from e
    figures.update(run["peak"], sharded=run["sharded"])
    figures["measured_over_planned"] = round(figures["device_peak_gib"] / planned, 3)
    memory_verdict(figures)
    return figures


def speed_verdict(figures: dict) -> None:
    if not (math.isfinite(figures["loss"]) and math.isfinite(figures["grad_norm"])):
        raise CheckFailed("non-finite loss or gradient norm", figures)
    if not figures["tokens_per_s"] > 0:
        raise CheckFailed("no tokens/s measured", figures)


def check_update_speed(ctx: Context) -> dict:
    """tokens/s and MFU of the update (FLOPs: benchmarks/gpu/smoke_model.py; the gradient-checkpointing
    recompute is not counted as model FLOPs, and the old log-probs come from the update's own forward)."""
    run = ctx.kept.get("update") or run_update(ctx)
    name, peak = sm.detect_peak_tflops(ctx.args.peak_tflops)
    flops = sm.training_flops(ctx.shape, run["lengths"])
    figures = {"device": name, "layers": ctx.shape.layers, "tokens_per_update": sum(run["lengths"]),
               "seconds_per_update": round(run["seconds"], 3),
               "tokens_per_s": round(sum(run["lengths"]) / run["seconds"], 1), "model_flops": flops,
               "mfu": None if peak is None else round(sm.mfu(flops, run["seconds"], peak), 4),
               "loss": run["loss"], "grad_norm": run["grad_norm"]}
    speed_verdict(figures)
    return figures


# ---------------------------------------------------------------- engine headroom


class DeviceMemory:
    """The GPU's free memory and the trainer's release of its cache, as the headroom check reads
    and calls them (a test gives it a fake on CPU)."""

    def __init__(self, device: torch.device):
        self.device = device

    def available(self) -> bool:
        return self.device.type == "cuda"

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)

    @staticmethod
    def card_gib() -> float:
        """The card's memory as the launch reads it (launch/gpu_card.py `resolve_gpu_memory`)."""
        return resolve_gpu_memory(None)[0]

    @staticmethod
    def release() -> None:
        release_trainer_cache()


def engine_utilization(shape, gpu_gib: float) -> float:
    """The gpu_memory_utilization `rstar2 rl` sets for a colocated engine on a `gpu_gib` card
    beside one trainer rank of `shape` (launch/engine_sizing.py `size_engines`)."""
    return planned_utilization(gpu_gib, trainer_resident_gib(shape, 1))


def headroom_verdict(figures: dict) -> None:
    if figures["free_after_release_gib"] < figures["engine_needs_gib"]:
        raise CheckFailed(f"{figures['free_after_release_gib']:.2f} GiB free after the release, the engine needs "
                          f"{figures['engine_needs_gib']:.2f} GiB (gpu_memory_utilization "
                          f"{figures['gpu_memory_utilization']} x total)", figures)


def optimizer_checkpoint(ctx: Context):
    """A checkpoint folder with AdamW state: the DCP check's, else one saved here after a small update."""
    if ctx.kept.get("dcp_folder") is not None:
        return ctx.kept["dcp_folder"]
    run = run_update(ctx, tokens=min(ctx.update_tokens, 1024))
    folder = save_checkpoint(ctx.work / "headroom" / "step_000001", run.pop("policy"), step=1)
    ctx.free()
    return folder


def check_engine_headroom(ctx: Context, memory: DeviceMemory | None = None) -> dict:
    memory = memory or DeviceMemory(ctx.device)
    folder = optimizer_checkpoint(ctx)
    # as a stage that continues the previous one: its weights from the folder (model.path), then its AdamW state
    policy = policy_for(ctx, path=folder, micro_batch_tokens=ctx.update_tokens)
    if policy.optimizer.state:
        raise AssertionError("a fresh policy has AdamW state already: nothing would be initialised")
    position = continue_optimizer(folder, policy)
    figures = {"path": "rl/update/checkpoint.py continue_optimizer", "adamw_entries": len(policy.optimizer.state),
               "schedule_position": position}
    if not memory.available():
        raise Skipped("needs CUDA (continue_optimizer ran on the 1-rank FSDP2 policy)", figures)
    gib = lambda b: round(b / GIB, 2)   # noqa: E731
    free_before, total = memory.mem_get_info()
    memory.release()
    free_after, _ = memory.mem_get_info()
    utilization = engine_utilization(ctx.shape, memory.card_gib())
    figures.update(free_before_release_gib=gib(free_before), free_after_release_gib=gib(free_after),
                   total_gib=gib(total), gpu_memory_utilization=utilization,
                   engine_needs_gib=gib(utilization * total))
    del policy
    headroom_verdict(figures)
    return figures
