"""Policy-update time and peak memory per RL step: packed rows under SDPA against the chosen layout.

Why: the update packs trajectories into micro-batches; under SDPA a packed `[1, T]` row makes
transformers build a dense block-diagonal `[1, 1, T, T]` mask and SDPA compute all T^2 blocks,
although each trajectory only attends to itself (rl/update/packing.py). This measures the real
`PolicyTrainer.update` (AdamW step included) on one synthetic RL batch, in both layouts:

  packed   today's path before the fix: packed rows, SDPA with the dense mask
  chosen   the layout `train.attn_implementation: auto` picks here (models/attention.py): on CPU or
           without flash-attn, SDPA over length-bucketed padded rows (causal kernel, no mask);
           with flash-attn on CUDA/ROCm, flash-attn varlen over packed rows

at micro-batch budgets of 1K, 8K and 16K tokens, on the quickstart's toy model (its RL batch:
32 prompts x 4 kept rollouts) and on a Qwen3-0.6B-shaped decoder at 2 layers. Each case runs in
its own process, so peak memory is that case's alone: on CPU the growth of peak RSS over the
update (ru_maxrss), on GPU `torch.cuda.max_memory_allocated`. Useful FLOPs count each
trajectory's own attention and the linear layers (benchmarks/gpu/smoke_model.py `training_flops`),
not the cross-trajectory blocks the dense mask discards.

    flock /tmp/rstar2-cpu.lock python benchmarks/timing/bench_update.py --json runs/bench_update.json

The Qwen3 shape keeps Qwen3-0.6B's decoder widths (hidden 1024, 16/8 heads of 128, MLP 3072)
with its vocabulary cut to `--qwen-vocab` (default 8,192): the LM head is the same work in both
layouts, and at 151,936 it would take most of a CPU step (`--qwen-vocab 151936` runs it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))   # smoke_model: Qwen3 configs and FLOP counts
sys.path.insert(0, str(ROOT / "benchmarks"))   # harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.launch.model_shape import Qwen3Shape  # noqa: E402
from rstar2_cli.quickstart.settings import QuickstartSettings  # noqa: E402
from rstar2_cli.rollout.trajectory import Trajectory  # noqa: E402

BUDGETS = (1024, 8192, 16384)
PATHS = ("packed", "chosen")
MODELS = ("toy", "qwen3-0.6b-2l")


def model_shape(name: str, qwen_vocab: int):
    if name == "toy":                     # the quickstart's model (QuickstartSettings defaults, models/tiny.py)
        q = QuickstartSettings(out_dir="unused")
        return Qwen3Shape(hidden=q.hidden_size, layers=q.num_layers, heads=q.num_heads, kv_heads=q.num_kv_heads,
                          head_dim=q.head_dim, intermediate=3 * q.hidden_size, vocab=q.vocab_size,
                          tie_embeddings=False)
    # Qwen3-0.6B's config.json widths, 2 of its 28 layers
    return Qwen3Shape(hidden=1024, layers=2, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=qwen_vocab,
                      tie_embeddings=True)


def synthetic_batch(name: str, vocab: int, seed: int = 0):
    """Trajectories shaped like the toy task's: prompts 60-100 tokens, responses 30-200 with a
    tool response (unscored) in most; the toy's RL batch is 128 of them (~20K tokens). The Qwen3
    shape gets 96 (~16K tokens: one 16K row)."""
    rng = random.Random(seed)
    n = 128 if name == "toy" else 96
    out, adv = [], []
    for i in range(n):
        p = [rng.randrange(vocab) for _ in range(rng.randint(60, 100))]
        r_len = rng.randint(30, 200)
        mask = [1] * r_len
        if r_len > 60 and rng.random() < 0.7:
            start = rng.randint(20, r_len - 30)
            mask[start:start + 20] = [0] * 20
        out.append(Trajectory(prompt_id=f"p{i // 4}", sample_index=i % 4, prompt_ids=p,
                              response_ids=[rng.randrange(vocab) for _ in range(r_len)], loss_mask=mask,
                              logprobs=[-rng.random() * 3 if m else 0.0 for m in mask], reward=float(i % 2)))
        adv.append(1.0 if i % 2 else -1.0)
    return out, adv


def run_case(model_name: str, budget: int, path: str, steps: int, warmup: int, qwen_vocab: int) -> dict:
    import torch

    # lazy: only the --case subprocess needs torch
    from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
    from rstar2_cli.rl.update.policy import PolicyTrainer  # lazy: only the --case subprocess needs torch
    from smoke_model import qwen3_config, training_flops  # lazy: only the --case subprocess needs torch

    shape = model_shape(model_name, qwen_vocab)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(qwen3_config(shape), dtype=torch.float32)
    batch, adv = synthetic_batch(model_name, shape.vocab)
    policy = PolicyTrainer(
        ModelConfig(path="unused", gradient_checkpointing=False),
        OptimConfig(lr=1e-5, warmup_steps=0),
        LossConfig(),
        micro_batch_tokens=budget,
        model=model,
        **({"attn_implementation": "sdpa", "layout": "packed"} if path == "packed" else {}),
    )
    rows = policy._rows(batch)
    cuda = policy.device.type == "cuda"
    for _ in range(warmup):
        policy.update(batch, adv)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = _rss_mib()
    times = []
    for _ in range(steps):
        with Stopwatch() as sw:
            policy.update(batch, adv)
            if cuda:
                torch.cuda.synchronize()
        times.append(sw.seconds)
    seconds = min(times)
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in batch]
    useful = training_flops(shape, lengths)
    computed_tokens = sum(r.input_ids.numel() for r in rows)
    return {"model": model_name, "budget": budget, "path": path, "attention": policy.attention.implementation,
            "layout": policy.layout, "micro_batches": len(rows),
            "shapes": sorted({tuple(r.input_ids.shape) for r in rows}, key=lambda s: -s[0] * s[1])[:4],
            "tokens": sum(lengths), "computed_tokens": computed_tokens,
            "seconds_per_step": seconds, "all_seconds": times,
            "peak_memory_mib": (torch.cuda.max_memory_allocated() / 2**20 if cuda
                                else max(0.0, _peak_rss_mib() - rss_before)),
            "memory_kind": "cuda max_memory_allocated" if cuda else "peak RSS growth over the update",
            "tokens_per_s": sum(lengths) / seconds, "useful_gflops_per_s": useful / seconds / 1e9,
            "useful_flops": useful}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # Linux: KiB


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"policy update per RL step ({result['device']}, load {result['loadavg_start']})")
    for col in ("model", "budget", "path", "micro-batches", "s / step", "x packed", "peak MiB", "tokens/s",
                "useful GFLOP/s", "computed / real tokens"):
        t.add_column(col, justify="left" if col in ("model", "path") else "right")
    for case in result["cases"]:
        if "error" in case:
            t.add_row(case["model"], str(case["budget"]), case["path"], "-", case["error"][:60], "", "", "", "", "")
            continue
        base = next((c for c in result["cases"] if c["model"] == case["model"] and c["budget"] == case["budget"]
                     and c["path"] == "packed" and "error" not in c), None)
        ratio = f"{case['seconds_per_step'] / base['seconds_per_step']:.3f}" if base else "-"
        t.add_row(
            case["model"],
            f"{case['budget'] // 1024}K",
            f"{case['path']} ({case['attention']}, {case['layout']})",
            str(case["micro_batches"]),
            f"{case['seconds_per_step']:.3f}",
            ratio,
            f"{case['peak_memory_mib']:.0f}",
            f"{case['tokens_per_s']:.0f}",
            f"{case['useful_gflops_per_s']:.2f}",
            f"{case['computed_tokens'] / case['tokens']:.2f}",
        )
    Console(width=max(150, Console().width)).print(t)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS))
    ap.add_argument("--toy-steps", type=int, default=3)
    ap.add_argument("--toy-warmup", type=int, default=1)
    ap.add_argument("--qwen-steps", type=int, default=1)
    ap.add_argument("--qwen-warmup", type=int, default=0)
    ap.add_argument("--qwen-vocab", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per case (default: torch's)")
    add_json_option(ap)
    ap.add_argument("--case", nargs=3, default=None, help=argparse.SUPPRESS)     # internal: MODEL BUDGET PATH
    args = ap.parse_args(argv)
    if args.case:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        name, budget, path = args.case[0], int(args.case[1]), args.case[2]
        toy = name == "toy"
        res = run_case(name, budget, path, args.toy_steps if toy else args.qwen_steps,
                       args.toy_warmup if toy else args.qwen_warmup, args.qwen_vocab)
        print("CASE " + json.dumps(res))
        return res

    import torch

    result = {
        "device": "cuda: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}",
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "qwen_vocab": args.qwen_vocab,
        "cases": [],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                   ("toy_steps", "toy_warmup", "qwen_steps", "qwen_warmup", "qwen_vocab")]
    if args.threads:
        passthrough.append(f"--threads={args.threads}")
    for name in args.models:
        for budget in args.budgets:
            for path in PATHS:
                proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--case", name, str(budget), path,
                                       *passthrough], env=env, capture_output=True, text=True)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")), None)
                if proc.returncode or line is None:
                    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                    case = {"model": name, "budget": budget, "path": path, "error": f"exit {proc.returncode}: {last}"}
                else:
                    case = json.loads(line[5:])
                result["cases"].append(case)
                print(json.dumps({k: case.get(k) for k in ("model", "budget", "path", "seconds_per_step",
                                                           "peak_memory_mib", "error")}), flush=True)
    result["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print_table(result)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
