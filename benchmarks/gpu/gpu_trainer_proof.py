"""Prove the trainer side on one GPU before a cluster run: one line per check, and a JSON file.

    python benchmarks/gpu/gpu_trainer_proof.py                    # cuda:0, Qwen3-14B widths, sized to the card
    python benchmarks/gpu/gpu_trainer_proof.py --out runs/proof.json --work /dev/shm
    python benchmarks/gpu/gpu_trainer_proof.py --device cpu --widths small   # CI: the CPU parts

Needs torch and transformers and this source tree, nothing else: no vLLM, no pydantic, no network
(it runs on the lent GPU image as it is: benchmarks/gpu/gpu_image.py). Meant to finish in under 8
minutes on one H100. The model is a random Qwen3 at Qwen3-14B's widths (hidden 5120, 40 query / 8
KV heads of 128, MLP 17408, vocabulary 151,936, untied head) with as many decoder layers as let the
update's memory plan fit the card (trainer_proof_memory.py `choose_size`), saved once as a bf16 HF
checkpoint under `--work`. Every policy is built as `rstar2 rl` builds it on GPU: rl/update/policy.py with
FSDP2 (`fully_shard` per decoder layer, then the root) over a process group, here of one rank.
The checks, in order:

  sharded_load     rl/update/model_load.py's sharded build holds exactly the parameters and buffers
                   (rotary inv_freq: recomputed, not in the checkpoint) of `from_pretrained`,
                   compared on every rank, and one forward pass gives its logits.
  chunked_head     the chunked log-prob head (rl/update/logprobs.py) with the Clip-Higher loss (rl/update/loss.py)
                   under FSDP2 bf16 gives the loss, log-probs and every gradient of the full-logits
                   reference, with old log-probs away from the current ones (both clip bounds act).
  packed_attention the policy's micro-batches score each trajectory as if it ran alone, well inside
                   what a cross-sequence leak would change.
  update_memory    the device-level peak of the FSDP2 update of one micro-batch is within
                   launch/memory_plan.py's trainer total and not more than 15 % under it.
  update_speed     tokens/s and MFU of that update (FLOPs: smoke_model.py).
  dcp_checkpoint   rl/update/checkpoint.py: DCP save (weights consolidated into HF safetensors, AdamW
                   shards), then a fresh policy loads it: weights, AdamW moments and the LR
                   schedule equal the saved ones bit for bit.
  engine_headroom  after continue_optimizer (get_optimizer_state_dict initialises AdamW) and the
                   trainer's cache release, the GPU has the free memory a colocated engine needs.
  spawn_env        an engine process spawned by a torchrun worker does not inherit
                   TORCHELASTIC_USE_AGENT_STORE (trainer_proof_io.py).
  cuda_ipc         a CUDA buffer exported with torch's reduce_tensor and rebuilt in a spawned
                   process (what vLLM's ipc weight transfer does) is the same memory both ways.

Without CUDA the GPU-only measurements say "skipped: needs CUDA" after building their arguments
(the memory plan, the policy, continue_optimizer); the rest run at the given sizes. Every check
gathers its figures and a verdict function decides (tests/benchmarks show each can fail).
Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

import torch  # noqa: E402

import smoke_model as sm  # noqa: E402
from harness import Stopwatch, write_json  # noqa: E402
import trainer_proof_io as proof_io  # noqa: E402
import trainer_proof_memory as proof_memory  # noqa: E402
from trainer_proof_model import (SIZES, WIDTHS, Context, Skipped, build_random_checkpoint, card_gib,  # noqa: E402
                                 first_line, one_rank_group, policy_for, random_model)
from trainer_proof_numerics import check_chunked_head, check_packed_attention, check_sharded_load  # noqa: E402
from rstar2_cli.rl.update.checkpoint import is_checkpoint  # noqa: E402

# the cards the JSON shows the proof's sizing for, in GiB as torch reports them (H100 80GB, H200)
SIZING_CARDS = (79.1, 139.8)


def check_dcp(ctx: Context) -> dict:
    """The updated policy is handed over in a dict the callee empties, so that it is freed before
    the fresh policy is built (both would not fit one 80 GB GPU at 14B widths)."""
    holder = ctx.kept.pop("update", None) or proof_memory.run_update(ctx, tokens=min(ctx.update_tokens, 4096))
    proof_io.remove_tree(ctx.checkpoint)     # its disk space goes to the DCP checkpoint
    make = lambda: policy_for(ctx, random_model(ctx, seed=1), micro_batch_tokens=ctx.update_tokens)   # noqa: E731
    target = proof_io.dcp_paths(ctx.work / "dcp")["target"]
    try:
        return proof_io.dcp_round_trip(holder, make, ctx.work / "dcp", ctx.free)
    finally:
        if is_checkpoint(target):
            ctx.kept["dcp_folder"] = target


CHECKS = (("sharded_load", check_sharded_load), ("chunked_head", check_chunked_head),
          ("packed_attention", check_packed_attention), ("update_memory", proof_memory.check_update_memory),
          ("update_speed", proof_memory.check_update_speed), ("dcp_checkpoint", check_dcp),
          ("engine_headroom", proof_memory.check_engine_headroom),
          ("spawn_env", lambda ctx: proof_io.spawn_env_check()),
          ("cuda_ipc", lambda ctx: proof_io.cuda_ipc_round_trip(ctx.args.ipc_gib, ctx.cuda)))
CHECK_NAMES = tuple(name for name, _ in CHECKS)


def run_check(name: str, fn, ctx: Context) -> dict:
    sw = Stopwatch()
    entry: dict = {}
    try:
        entry.update(fn(ctx))
        entry["status"] = "pass"
    except Skipped as e:
        entry.update(e.figures, status=f"skipped: {e}")
    except Exception as e:   # one line for the table, the check's figures kept
        entry.update(getattr(e, "figures", {}))
        entry.update(status="fail", error=first_line(e))
    entry["seconds"] = round(sw.elapsed(), 2)
    ctx.free()
    shown = entry.get("error") or ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in entry.items() if k not in ("status", "seconds", "plan_rows"))
    print(f"{name:<17} {entry['status'] if entry['status'] in ('pass', 'fail') else 'skip':<5} {shown}"
          + ("" if entry["status"] in ("pass", "fail") else f" ({entry['status']})"), flush=True)
    return entry


def sizing_report(args, ctx: Context, how: str) -> dict:
    """How this run was sized, and what the sizing picks at Qwen3-14B widths on SIZING_CARDS."""
    cards = {}
    for gib in SIZING_CARDS:
        try:
            cards[f"{gib:g} GiB"] = proof_memory.fit_update(WIDTHS["14b"], gib, args.checkpointing)
        except ValueError as e:
            cards[f"{gib:g} GiB"] = str(e)
    return {"layers": ctx.shape.layers, "update_tokens": ctx.update_tokens, "how": how,
            "card_gib": None if ctx.card_gib is None else round(ctx.card_gib, 2), "14b_on_cards": cards}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers (default: on a GPU, sized so the update's plan fits the card)")
    ap.add_argument("--widths", choices=sorted(WIDTHS), default="14b", help="14b, or small (CI on CPU)")
    ap.add_argument("--update-tokens", type=int, default=None,
                    help="tokens of the update micro-batch (default: on a GPU, sized with --layers)")
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false",
                    help="update without gradient checkpointing (the recipes use it)")
    ap.add_argument("--plan-gpu-gib", type=float, default=SIZING_CARDS[0],
                    help="without a GPU: the card the update's plan is made for (GiB as torch reports it)")
    ap.add_argument("--steps", type=int, default=2, help="timed updates after one warm-up")
    ap.add_argument("--ipc-gib", type=float, default=1.5, help="size of the CUDA IPC buffer")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per device (MFU)")
    ap.add_argument("--work", default=None,
                    help="folder for the checkpoints (default: the temp folder; 14b widths, 2 layers: ~27 GB at "
                         "the DCP check's peak)")
    ap.add_argument("--only", nargs="+", choices=CHECK_NAMES, default=None, help="run only these checks")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_trainer_proof.json"))
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = torch.device(args.device)
    layers, tokens, how = proof_memory.choose_size(args, WIDTHS[args.widths], SIZES[args.widths], card_gib(device))
    ctx = Context(args, layers, tokens)
    total = Stopwatch()
    own_group = one_rank_group(ctx.device)
    report = {"device": sm.detect_peak_tflops(args.peak_tflops)[0] if ctx.cuda else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "python": platform.python_version(),
              "host": platform.node(), "load_avg": os.getloadavg(), "shape": asdict(ctx.shape),
              "sizing": sizing_report(args, ctx, how), "args": vars(args) | {"out": str(args.out)},
              "work": str(ctx.work), "checks": {}}
    print(f"{'sizing':<17} {layers} layers, {tokens}-token update ({how})", flush=True)
    try:
        build_random_checkpoint(ctx)
        report["checkpoint_s"] = round(total.elapsed(), 2)
        for name, fn in CHECKS:
            if args.only is None or name in args.only:
                report["checks"][name] = run_check(name, fn, ctx)
            else:
                report["checks"][name] = {"status": "skipped: not in --only"}
    finally:
        proof_io.remove_tree(ctx.work)
        if own_group:
            torch.distributed.destroy_process_group()
    report["total_s"] = round(total.elapsed(), 2)
    write_json(args.out, report, indent=2)
    failed = [k for k, v in report["checks"].items() if v["status"] == "fail"]
    print(f"{len(failed)} failed of {len(CHECKS)} ({', '.join(failed) or 'none'}); {report['total_s']} s; "
          f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
