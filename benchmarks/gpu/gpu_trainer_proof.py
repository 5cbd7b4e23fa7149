"""Prove the trainer side on one GPU before a cluster run: one line per check, and a JSON file.

    python benchmarks/gpu/gpu_trainer_proof.py                           # cuda:0, Qwen3-14B widths, 4 layers
    python benchmarks/gpu/gpu_trainer_proof.py --layers 8 --out runs/proof.json
    python benchmarks/gpu/gpu_trainer_proof.py --device cpu --layers 2 --widths small   # CI: CPU parts

Needs torch + transformers and this source tree, no vLLM and no network; meant to finish in
under 10 minutes on one H100/H200. The model is a random Qwen3 at Qwen3-14B's widths (hidden 5120,
40 query / 8 KV heads of 128, MLP 17408, vocabulary 151,936, untied head) with `--layers` decoder
layers, saved once as a bf16 HF checkpoint under `--work`. The checks, in order:

  sharded_load     rl/model_load.py's sharded build (meta device, FSDP2, this rank's safetensors
                   slices) holds exactly the tensors `from_pretrained` reads.
  chunked_head     under FSDP2 with bf16 compute (MixedPrecisionPolicy, fp32 reduce), the chunked
                   log-prob head (rl/logprobs.py) with the Clip-Higher loss (rl/loss.py) gives the
                   loss, log-probs and every parameter's gradient of the full-logits reference.
  packed_attention the policy's micro-batches (models/attention.py picks flash-attn over packed rows
                   where flash-attn is installed, else SDPA over padded rows; rl/packing.py) score
                   each trajectory as if it ran alone, well inside what a cross-sequence leak
                   would change (the same trajectory scored after another one).
  update_memory    peak GPU memory of one `--update-tokens` (32K) micro-batch update
                   (rl/policy.py, one process: unsharded, autocast bf16, AdamW fp32) against
                   launch/memory_plan.py's trainer total for the same shape and settings.
  update_speed     tokens/s and MFU of that update (FLOP convention: benchmarks/smoke_model.py;
                   gradient-checkpointing recompute is not counted as model FLOPs).
  dcp_checkpoint   rl/checkpoint.py: DCP save (weights consolidated into HF safetensors, AdamW
                   shards), then a fresh policy loads it: weights, AdamW moments and the LR
                   schedule equal the saved ones bit for bit.
  spawn_env        an engine process spawned by a torchrun worker (TORCHELASTIC_USE_AGENT_STORE
                   set) does not inherit the variable (trainer_proof_io.py).
  cuda_ipc         a 1.5 GiB CUDA buffer exported with torch's reduce_tensor and rebuilt in a spawned
                   process (what vLLM's ipc weight transfer does) is the same memory both ways.

Without CUDA the GPU-only checks say "skipped: needs CUDA"; the others run at the given sizes.
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import gpu_smoke  # noqa: E402
import smoke_model as sm  # noqa: E402
import trainer_proof_io as proof_io  # noqa: E402
from trainer_proof_io import Skipped  # noqa: E402
from trainer_proof_model import (CHUNK_TOKENS, WIDTHS, CheckFailed, Context,  # noqa: E402
                                 build_random_checkpoint, check_chunked_head, check_packed_attention,
                                 check_sharded_load, policy_for, random_model, rows_of)


def planned_trainer_gib(ctx: Context, checkpointing: bool, chunk_tokens: int) -> tuple[float, list]:
    """launch/memory_plan.py's trainer total (GiB) for one unsharded rank of ctx.shape."""
    from rstar2_cli.launch.memory_plan import MemorySpec, build_memory_plan

    total_gib = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30 if ctx.cuda else 0.0
    spec = MemorySpec(shape=ctx.shape, shape_source="gpu_trainer_proof", trainer_ranks=1, colocated=False,
                      tp_size=1, gpu_memory_gib=total_gib, gpu_name="custom", gpu_memory_utilization=0.9,
                      micro_batch_tokens=ctx.update_tokens, logprob_chunk_tokens=chunk_tokens,
                      gradient_checkpointing=checkpointing, max_model_len=ctx.update_tokens, max_num_seqs=256)
    plan = build_memory_plan(spec)
    rows = [(r.name, round(r.gib[0], 2)) for r in plan.rows if r.gib[0] is not None]
    return plan.totals[0], rows


def run_update(ctx: Context, tokens: int | None = None) -> dict:
    """Updates of one `tokens`-token micro-batch (default `update_tokens`; 4 trajectories of a
    quarter each), timed, with the peak memory of the steady state (AdamW moments allocated). The
    full-size run is kept for the next check; a failure of it is remembered, not repeated."""
    full_size = tokens is None
    tokens = ctx.update_tokens if full_size else tokens
    if full_size and "update_error" in ctx.kept:
        raise AssertionError(f"the {tokens}-token update failed: {ctx.kept['update_error']}")
    policy = policy_for(ctx, ctx.kept.pop("policy_model", None), micro_batch_tokens=tokens,
                        checkpointing=ctx.args.checkpointing)
    lengths = [tokens // 4] * 4
    batch, adv = gpu_smoke.rollout_batch(lengths, ctx.shape.vocab, seed=3)
    assert len(rows_of(policy, batch)) == 1, "the update must be one micro-batch"
    ctx.free()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    stats = []
    try:
        seconds = gpu_smoke.measure(lambda: stats.append(policy.update(batch, adv)), ctx.args.steps, 1, ctx.sync)
    except Exception as e:
        if full_size:
            ctx.kept["update_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    result = {"policy": policy, "lengths": lengths, "seconds": seconds, "loss": stats[-1]["loss"],
              "grad_norm": stats[-1]["grad_norm"], "peak": sm.peak_memory_gib()}
    if full_size:
        ctx.kept["update"] = result
    return result


def check_update_memory(ctx: Context) -> dict:
    if not ctx.cuda:
        raise Skipped("needs CUDA")
    planned, rows = planned_trainer_gib(ctx, ctx.args.checkpointing, CHUNK_TOKENS)
    figures = {"tokens": ctx.update_tokens, "gradient_checkpointing": ctx.args.checkpointing,
               "planned_gib": round(planned, 2), "plan_rows": rows}
    try:
        run = ctx.kept.get("update") or run_update(ctx)
    except Exception as e:
        raise CheckFailed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", figures) from e
    peak = run["peak"]["reserved"]
    figures.update(peak_allocated_gib=run["peak"]["allocated"], peak_reserved_gib=peak,
                   measured_over_planned=round(peak / planned, 3))
    if peak > planned:
        raise CheckFailed(f"measured {peak} GiB > planned {planned:.2f} GiB", figures)
    return figures


def check_update_speed(ctx: Context) -> dict:
    run = ctx.kept.get("update") or run_update(ctx)
    name, peak = sm.detect_peak_tflops(ctx.args.peak_tflops)
    flops = sm.training_flops(ctx.shape, run["lengths"])
    figures = {"device": name, "tokens_per_update": sum(run["lengths"]), "seconds_per_update": round(run["seconds"], 3),
               "tokens_per_s": round(sum(run["lengths"]) / run["seconds"], 1), "model_flops": flops,
               "mfu": None if peak is None else round(sm.mfu(flops, run["seconds"], peak), 4),
               "loss": run["loss"], "grad_norm": run["grad_norm"]}
    if not (math.isfinite(run["loss"]) and math.isfinite(run["grad_norm"])):
        raise CheckFailed("non-finite loss or gradient norm", figures)
    return figures


def check_dcp(ctx: Context) -> dict:
    """The updated policy is handed over in a dict the callee empties, so that it is freed before
    the fresh policy is built (both would not fit one 80 GB GPU at 14B widths)."""
    holder = ctx.kept.pop("update", None) or run_update(ctx, tokens=min(ctx.update_tokens, 4096))
    proof_io.remove_tree(ctx.checkpoint)     # its disk space goes to the DCP checkpoint
    make = lambda: policy_for(ctx, random_model(ctx, seed=1), micro_batch_tokens=ctx.update_tokens)   # noqa: E731
    return proof_io.dcp_round_trip(holder, make, ctx.work / "dcp", ctx.free)


CHECKS = (("sharded_load", check_sharded_load), ("chunked_head", check_chunked_head),
          ("packed_attention", check_packed_attention), ("update_memory", check_update_memory),
          ("update_speed", check_update_speed), ("dcp_checkpoint", check_dcp),
          ("spawn_env", lambda ctx: proof_io.spawn_env_check()),
          ("cuda_ipc", lambda ctx: proof_io.cuda_ipc_round_trip(ctx.args.ipc_gib, ctx.cuda)))
CHECK_NAMES = tuple(name for name, _ in CHECKS)


def run_check(name: str, fn, ctx: Context) -> dict:
    start = time.perf_counter()
    entry: dict = {}
    try:
        entry.update(fn(ctx))
        entry["status"] = "pass"
    except Skipped as e:
        entry["status"] = f"skipped: {e}"
    except Exception as e:   # one line for the table, the check's figures kept
        entry.update(getattr(e, "figures", {}))
        entry.update(status="fail", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    entry["seconds"] = round(time.perf_counter() - start, 2)
    ctx.free()
    shown = entry.get("error") or ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in entry.items() if k not in ("status", "seconds", "plan_rows"))
    print(f"{name:<17} {entry['status'] if entry['status'] in ('pass', 'fail') else 'skip':<5} {shown}"
          + ("" if entry["status"] in ("pass", "fail") else f" ({entry['status']})"), flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (4-8 for the 14B-width proof)")
    ap.add_argument("--widths", choices=sorted(WIDTHS), default="14b", help="14b, or small (CI on CPU)")
    ap.add_argument("--update-tokens", type=int, default=None, help="tokens of the update micro-batch (14b: 32768)")
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false",
                    help="update without gradient checkpointing (the recipes use it)")
    ap.add_argument("--steps", type=int, default=2, help="timed updates after one warm-up")
    ap.add_argument("--ipc-gib", type=float, default=1.5, help="size of the CUDA IPC buffer")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per device (MFU)")
    ap.add_argument("--work", default=None, help="folder for the checkpoints (14b widths, 4 layers: ~35 GB at the DCP check's peak)")
    ap.add_argument("--only", nargs="+", choices=CHECK_NAMES, default=None, help="run only these checks")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_trainer_proof.json"))
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ctx = Context(args)
    own_group = proof_io.one_rank_group(ctx.device)
    report = {"device": sm.detect_peak_tflops(args.peak_tflops)[0] if ctx.cuda else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "host": platform.node(),
              "load_avg": os.getloadavg(), "shape": asdict(ctx.shape), "args": vars(args) | {"out": str(args.out)},
              "work": str(ctx.work), "checks": {}}
    try:
        start = time.perf_counter()
        build_random_checkpoint(ctx)
        report["checkpoint_s"] = round(time.perf_counter() - start, 2)
        for name, fn in CHECKS:
            if args.only is None or name in args.only:
                report["checks"][name] = run_check(name, fn, ctx)
            else:
                report["checks"][name] = {"status": "skipped: not in --only"}
    finally:
        proof_io.remove_tree(ctx.work)
        if own_group:
            torch.distributed.destroy_process_group()
    report["total_s"] = round(time.perf_counter() - start, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    failed = [k for k, v in report["checks"].items() if v["status"] == "fail"]
    print(f"{len(failed)} failed of {len(CHECKS)} ({', '.join(failed) or 'none'}); wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
