"""Where the policy update's time goes, per layout: a torch.profiler breakdown of one RL step.

Why: docs/benchmarks.md states the causes of the update's cost as measured. This runs
`PolicyTrainer.update` once to warm up and once under `torch.profiler` on bench_update.py's
synthetic batch (the quickstart's toy model and RL batch, micro-batch budget 8,192) in each
layout, and splits the profiled step's wall time into: SDPA (forward and backward kernels),
transformers' mask building (`create_causal_mask`), the chunked log-prob head, and the rest
(linear layers, norms, the optimizer step).

    flock /tmp/rstar2-cpu.lock python benchmarks/timing/profile_update.py --json runs/profile_update.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))   # smoke_model: Qwen3 configs and FLOP counts
sys.path.insert(0, str(ROOT / "benchmarks"))   # harness

import rstar2_cli.rl.update.policy as policy_mod  # noqa: E402
from bench_update import model_shape, synthetic_batch  # noqa: E402
from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig  # noqa: E402
from rstar2_cli.rl.update.policy import PolicyTrainer  # noqa: E402
from smoke_model import qwen3_config  # noqa: E402

_PATCHED: list[bool] = []


def _label_once() -> None:
    """Wrap transformers' mask builder and the log-prob head in profiler labels (once per process)."""
    if _PATCHED:
        return
    from torch.profiler import record_function
    from transformers.models.qwen3 import modeling_qwen3

    def labelled(name, fn):
        def inner(*a, **kw):
            with record_function(name):
                return fn(*a, **kw)
        return inner

    modeling_qwen3.create_causal_mask = labelled("mask_building", modeling_qwen3.create_causal_mask)
    policy_mod.token_logprobs_with_loss = labelled("logprob_head", policy_mod.token_logprobs_with_loss)
    _PATCHED.append(True)


def _sdpa_us(events) -> float:
    """SDPA forward (the public op, which holds the kernel) plus its backward kernels, in us."""
    total = 0.0
    for e in events:
        if e.key == "aten::scaled_dot_product_attention" or (
                e.key.startswith("aten::") and "attention" in e.key and e.key.endswith("backward")):
            total += e.cpu_time_total
    return total


def profile_layout(layout: str, budget: int, model_name: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    _label_once()
    shape = model_shape(model_name, 8192)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config(shape), dtype=torch.float32)
    batch, adv = synthetic_batch(model_name, shape.vocab)
    policy = PolicyTrainer(
        ModelConfig(path="unused", gradient_checkpointing=False),
        OptimConfig(lr=1e-5, warmup_steps=0),
        LossConfig(),
        micro_batch_tokens=budget,
        model=model,
        attn_implementation="sdpa",
        layout=layout,
    )
    policy.update(batch, adv)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with Stopwatch() as sw:
            policy.update(batch, adv)
    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    us = lambda name: by_name[name].cpu_time_total if name in by_name else 0.0   # noqa: E731
    sdpa = _sdpa_us(events)
    mask, head = us("mask_building"), us("logprob_head")
    total = sw.seconds * 1e6
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return {"layout": layout, "budget": budget, "model": model_name, "step_seconds": wall,
            "share": {"sdpa": sdpa / total, "mask_building": mask / total, "logprob_head": head / total,
                      "rest": max(0.0, 1 - (sdpa + mask + head) / total)},
            "top_self_cpu_ops": [[e.key, round(e.self_cpu_time_total / 1e6, 3)] for e in top]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--model", choices=("toy", "qwen3-0.6b-2l"), default="toy")
    add_json_option(ap)
    args = ap.parse_args(argv)
    out = [profile_layout(layout, args.budget, args.model) for layout in ("packed", "padded")]

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"one policy update under torch.profiler ({args.model}, budget {args.budget}, sdpa)")
    for col in ("layout", "step s", "sdpa", "mask building", "log-prob head", "rest"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for r in out:
        sh = r["share"]
        t.add_row(r["layout"], f"{r['step_seconds']:.2f}", *(f"{100 * sh[k]:.0f} %" for k in
                                                            ("sdpa", "mask_building", "logprob_head", "rest")))
    Console(width=max(120, Console().width)).print(t)
    for r in out:
        print(r["layout"], "top self-CPU ops (s):", r["top_self_cpu_ops"])
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
