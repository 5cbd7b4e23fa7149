"""Prove the trainer side on one GPU before a cluster run: one line per check, and a JSON file.

    python benchmarks/gpu_trainer_proof.py                           # cuda:0, Qwen3-14B widths, 4 layers
    python benchmarks/gpu_trainer_proof.py --layers 8 --out runs/proof.json
    python benchmarks/gpu_trainer_proof.py --device cpu --layers 2 --widths small   # CI: CPU parts

Needs torch + transformers and this source tree, no vLLM and no network; meant to finish in
under 10 minutes on one H100/H200. The model is a random Qwen3 at Qwen3-14B's widths (hidden 5120,
40 query / 8 KV heads of 128, MLP 17408, vocabulary 151,936, untied head) with `--layers` decoder
layers, saved once as a bf16 HF checkpoint under `--work`. The checks, in order:

  sharded_load     rl/model_load.py's sharded build (meta device, FSDP2, this rank's safetensors
                   slices) holds exactly the tensors `from_pretrained` reads.
  chunked_head     under FSDP2 with bf16 compute (MixedPrecisionPolicy, fp32 reduce), the chunked
                   log-prob head (rl/logprobs.py) with the Clip-Higher loss (rl/loss.py) gives the
                   loss, log-probs and every parameter's gradient of the full-logits reference.
  packed_attention the policy's micro-batches (rl/attention.py picks flash-attn over packed rows
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
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import gpu_smoke  # noqa: E402
import smoke_model as sm  # noqa: E402
import trainer_proof_io as proof_io  # noqa: E402
from rstar2_cli.launch.model_shape import QWEN3_14B  # noqa: E402
from rstar2_cli.rl.attention import LAYOUT_OF  # noqa: E402

WIDTHS = {"14b": QWEN3_14B, "small": replace(sm.TINY, tie_embeddings=False)}
# per widths: tokens of the chunked-head check, micro-batch budget of the attention check
SIZES = {"14b": {"head_tokens": 4096, "attn_budget": 4096}, "small": {"head_tokens": 48, "attn_budget": 96}}
# trajectory lengths of the attention check, x budget: two groups of near lengths, so that SDPA's
# padded buckets (rows >= 80 % full, rl/packing.py MIN_FILL) and flash-attn's packed rows both hold several
ATTN_FRACTIONS = (0.3, 0.27, 0.24, 0.1, 0.09, 0.08)
# bf16: both heads round the same bf16 logits; the reference's head gradient is a bf16 matmul,
# the chunked one accumulates in fp32, hence a percent-level gradient tolerance
TOLERANCE = {torch.bfloat16: {"loss_rel": 1e-2, "logprob_abs": 5e-2, "grad_rel": 5e-2, "packed_mean": 2e-2},
             torch.float32: {"loss_rel": 1e-5, "logprob_abs": 1e-4, "grad_rel": 1e-4, "packed_mean": 1e-4}}
LEAK_MARGIN = 5.0      # a leak must move log-probs at least this many times the packing difference


Skipped = proof_io.Skipped


class CheckFailed(AssertionError):
    """A check's result is wrong; its figures still go to the report."""

    def __init__(self, message: str, figures: dict):
        super().__init__(message)
        self.figures = figures


class Context:
    """What the checks share: the settings, the saved checkpoint, and models a later check reuses."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.shape = replace(WIDTHS[args.widths], layers=args.layers)
        self.sizes = SIZES[args.widths]
        self.update_tokens = args.update_tokens or (32768 if args.widths == "14b" else 256)
        self.work = Path(tempfile.mkdtemp(prefix="rstar2_proof_", dir=args.work))
        self.checkpoint = self.work / "random_bf16"
        self.kept: dict = {}
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def build_random_checkpoint(ctx: Context) -> None:
    """A random Qwen3 of ctx.shape, saved as bf16 safetensors (as released checkpoints are)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with ctx.device:
        model = AutoModelForCausalLM.from_config(sm.qwen3_config(ctx.shape), dtype=torch.float32)
    count = sum(p.numel() for p in model.parameters())
    if count != ctx.shape.total_params():
        raise AssertionError(f"built {count} parameters, the shape says {ctx.shape.total_params()}")
    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    model.save_pretrained(ctx.checkpoint, state_dict=state)
    del model, state
    ctx.free()


def reference_model(ctx: Context, device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ctx.checkpoint, dtype=torch.float32,
                                                attn_implementation="sdpa").to(device)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_sharded_load(ctx: Context) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rstar2_cli.rl.model_load import DEFAULT_LOAD_METHOD, build_policy_model

    start = time.perf_counter()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded = build_policy_model(str(ctx.checkpoint), sharded=True, device=ctx.device, mp_policy=policy)
    ctx.sync()
    load_s = time.perf_counter() - start
    ctx.kept["fsdp"] = sharded          # the chunked-head check runs on it
    reference = reference_model(ctx, "cpu")
    ours = dict(sharded.state_dict())
    differing = [k for k, v in reference.state_dict().items() if not torch.equal(full(ours[k]).cpu(), v)]
    missing = sorted(set(reference.state_dict()) ^ set(ours))
    del reference, ours
    if differing or missing:
        raise AssertionError(f"{len(differing)} tensors differ from from_pretrained (first {differing[:3]}), "
                             f"names not in both: {missing[:3]}")
    return {"method": DEFAULT_LOAD_METHOD, "load_s": round(load_s, 2), "tensors_equal": True}


def check_chunked_head(ctx: Context) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rstar2_cli.rl.logprobs import final_hidden_states, head_weight, token_logprobs_with_loss
    from rstar2_cli.rl.loss import clip_higher_loss
    from rstar2_cli.rl.model_load import build_policy_model

    model = ctx.kept.pop("fsdp", None)
    if model is None:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = build_policy_model(str(ctx.checkpoint), sharded=True, device=ctx.device, mp_policy=policy)
    gen = torch.Generator().manual_seed(1)
    n = ctx.sizes["head_tokens"]
    ids = torch.randint(0, ctx.shape.vocab, (1, n + 1), generator=gen).to(ctx.device)
    pos = torch.arange(n + 1, device=ctx.device)[None]
    targets = ids[0, 1:]
    adv = (torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1).to(ctx.device)
    mask = torch.ones(n, device=ctx.device)

    def loss_of(logp, sl=slice(None)):
        return clip_higher_loss(logp, logp.detach(), adv[sl], mask[sl], float(n), 0.2, 0.28)

    def grads() -> dict[str, torch.Tensor]:
        out = {k: full(p.grad).float().cpu() for k, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return out

    hidden = final_hidden_states(model, ids, pos)[0, :-1]
    loss, logp, _ = token_logprobs_with_loss(hidden, head_weight(model), targets, 1024, loss_of)
    loss.backward()
    chunked = grads()
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, :-1].float()
    ref_logp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    ref_loss = loss_of(ref_logp)
    ref_loss.backward()
    ref_loss, ref_logp = ref_loss.detach(), ref_logp.detach()
    del logits
    worst, worst_name = 0.0, ""
    for name, g in grads().items():
        err = float((chunked[name] - g).norm() / g.norm().clamp_min(1e-30))
        if err > worst:
            worst, worst_name = err, name
    del model, chunked
    ctx.free()
    tol = TOLERANCE[torch.bfloat16]
    loss = loss.detach()
    figures = {"tokens": n, "loss": float(loss), "loss_rel_diff": abs(float(loss - ref_loss)) / abs(float(ref_loss)),
               "logprob_max_abs_diff": float((logp - ref_logp).abs().max()),
               "grad_max_rel_diff": worst, "grad_worst_param": worst_name}
    bad = [k for k, key in (("loss_rel_diff", "loss_rel"), ("logprob_max_abs_diff", "logprob_abs"),
                            ("grad_max_rel_diff", "grad_rel")) if figures[k] > tol[key]]
    if bad:
        raise CheckFailed(f"beyond the bf16 tolerance {tol}: {', '.join(bad)}", figures)
    return figures


def policy_for(ctx: Context, model=None, *, micro_batch_tokens: int, checkpointing: bool = False):
    from rstar2_cli.rl.dist import setup_distributed
    from rstar2_cli.rl.policy import PolicyTrainer

    model_cfg, optim_cfg, loss_cfg = gpu_smoke.policy_configs()
    model_cfg = (model_cfg.model_copy(update={"gradient_checkpointing": checkpointing})
                 if hasattr(model_cfg, "model_copy") else replace_ns(model_cfg, gradient_checkpointing=checkpointing))
    model = reference_model(ctx, ctx.device) if model is None else model
    return PolicyTrainer(model_cfg, optim_cfg, loss_cfg, micro_batch_tokens=micro_batch_tokens, model=model,
                         info=setup_distributed(), attn_implementation="auto")


def replace_ns(ns, **changes):
    from types import SimpleNamespace

    return SimpleNamespace(**{**vars(ns), **changes})


def check_packed_attention(ctx: Context) -> dict:
    from rstar2_cli.rollout.trajectory import Trajectory

    budget = ctx.sizes["attn_budget"]
    policy = policy_for(ctx, micro_batch_tokens=budget)
    ctx.kept["policy_model"] = policy.model
    lengths = [max(4, int(budget * f)) for f in ATTN_FRACTIONS]
    batch, _ = gpu_smoke.rollout_batch(lengths, ctx.shape.vocab, seed=2)
    rows = policy._rows(batch)
    together = policy.compute_logprobs(batch)
    alone = [policy.compute_logprobs([t])[0] for t in batch]
    first = batch[0]
    after_first = [Trajectory(prompt_id=t.prompt_id, sample_index=t.sample_index,
                              prompt_ids=first.prompt_ids + first.response_ids + t.prompt_ids,
                              response_ids=t.response_ids, loss_mask=t.loss_mask, logprobs=t.logprobs)
                   for t in batch[1:]]
    leaked = [policy.compute_logprobs([t])[0] for t in after_first]
    diff = torch.cat([(a - b).abs() for a, b in zip(together, alone)])
    leak = torch.cat([(a - b).abs() for a, b in zip(leaked, alone[1:])])
    figures = {"attn_implementation": policy.attention.implementation, "layout": policy.layout,
               "dtype": str(policy.dtype).removeprefix("torch."), "trajectories": len(batch),
               "micro_batches": len(rows), "max_per_micro_batch": max(len(r.spans) for r in rows),
               "packed_vs_alone_mean_abs": float(diff.mean()), "packed_vs_alone_max_abs": float(diff.max()),
               "leak_mean_abs": float(leak.mean())}
    del policy
    tol = TOLERANCE[torch.bfloat16 if ctx.cuda else torch.float32]["packed_mean"]
    if figures["max_per_micro_batch"] < 2:
        raise CheckFailed("no micro-batch holds two trajectories: nothing was packed", figures)
    if figures["packed_vs_alone_mean_abs"] > tol:
        raise CheckFailed(f"packed log-probs differ from each trajectory alone by more than {tol}", figures)
    if figures["leak_mean_abs"] < LEAK_MARGIN * figures["packed_vs_alone_mean_abs"]:
        raise CheckFailed(f"a cross-sequence leak would change log-probs by less than {LEAK_MARGIN}x the "
                          "packing difference: the check cannot tell them apart", figures)
    assert LAYOUT_OF[figures["attn_implementation"]] == figures["layout"]
    return figures


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


def run_update(ctx: Context) -> dict:
    """One `update_tokens` micro-batch per step (4 trajectories of a quarter each), timed and
    with the peak memory of the steady state (AdamW moments allocated)."""
    model = ctx.kept.pop("policy_model", None)
    policy = policy_for(ctx, model, micro_batch_tokens=ctx.update_tokens, checkpointing=ctx.args.checkpointing)
    lengths = [ctx.update_tokens // 4] * 4
    batch, adv = gpu_smoke.rollout_batch(lengths, ctx.shape.vocab, seed=3)
    assert len(policy._rows(batch)) == 1, "the update must be one micro-batch"
    ctx.free()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    stats = []
    seconds = gpu_smoke.measure(lambda: stats.append(policy.update(batch, adv)), ctx.args.steps, 1, ctx.sync)
    result = {"policy": policy, "lengths": lengths, "seconds": seconds, "loss": stats[-1]["loss"],
              "grad_norm": stats[-1]["grad_norm"], "peak": sm.peak_memory_gib()}
    ctx.kept["update"] = result
    return result


def check_update_memory(ctx: Context) -> dict:
    if not ctx.cuda:
        raise Skipped("needs CUDA")
    run = ctx.kept.get("update") or run_update(ctx)
    planned, rows = planned_trainer_gib(ctx, ctx.args.checkpointing, run["policy"].logprob_chunk_tokens)
    figures = {"tokens": ctx.update_tokens, "gradient_checkpointing": ctx.args.checkpointing,
               "peak_allocated_gib": run["peak"]["allocated"], "peak_reserved_gib": run["peak"]["reserved"],
               "planned_gib": round(planned, 2), "measured_over_planned": round(run["peak"]["reserved"] / planned, 3),
               "plan_rows": rows}
    if run["peak"]["reserved"] > planned:
        raise CheckFailed(f"measured {run['peak']['reserved']} GiB > planned {planned:.2f} GiB", figures)
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


def random_model(ctx: Context):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    with ctx.device:
        return AutoModelForCausalLM.from_config(sm.qwen3_config(ctx.shape), dtype=torch.float32)


def check_dcp(ctx: Context) -> dict:
    """The updated policy is handed over in a dict the callee empties, so that it is freed before
    the fresh policy is built (both would not fit one 80 GB GPU at 14B widths)."""
    holder = ctx.kept.pop("update", None) or run_update(ctx)
    ctx.kept.pop("update", None)
    proof_io.remove_tree(ctx.checkpoint)     # its disk space goes to the DCP checkpoint
    make = lambda: policy_for(ctx, random_model(ctx), micro_batch_tokens=ctx.update_tokens)   # noqa: E731
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
    ap.add_argument("--work", default=None, help="folder for the checkpoints (the 14b DCP check writes ~50 GB)")
    ap.add_argument("--only", nargs="+", choices=CHECK_NAMES, default=None, help="run only these checks")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_trainer_proof.json"))
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ctx = Context(args)
    own_group = proof_io.one_rank_group(ctx.device)
    report = {"device": sm.detect_peak_tflops(args.peak_tflops)[0], "torch": torch.__version__,
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
