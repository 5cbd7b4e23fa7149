"""The quickstart's report folder: report.json (the numbers), report.png (the curves), report.md.

Why these four curves: training reward and held-out accuracy show that RL works; the tool-error
ratio in positive trajectories is what RoC changes (paper Fig. 4); response length shows the
policy is not winning by degenerate short or runaway outputs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

PANELS = [("rollout/reward_mean", "training reward (mean)"),
          ("heldout", "held-out accuracy"),
          ("rollout/tool_error_ratio_positive", "tool-error ratio in positive trajectories"),
          ("rollout/response_length_mean", "response length (tokens)")]


def plot_curves(runs: Sequence[Any], path: Path) -> None:
    """One PNG, four panels, one line per run (RoC, and plain GRPO with --compare-grpo)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, PANELS):
        for run in runs:
            name = "GRPO-RoC" if run.label == "roc" else "GRPO"
            if key == "heldout":
                xs = [step for step, _ in run.heldout]
                ys = [100 * m["accuracy"] for _, m in run.heldout]
                ax.plot(xs, ys, marker="o", label=name)
                ax.set_ylim(0, 100)
                ax.set_ylabel("%")
            else:
                xs = [int(m["step"]) for m in run.steps]
                ys = [m.get(key, float("nan")) for m in run.steps]
                ax.plot(xs, ys, label=name)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown_summary(report: dict[str, Any]) -> str:
    pts = report["improvement_points"]
    lines = [
        "# rstar2 quickstart report", "",
        f"Toy task: `a*b+c` (3-digit a, 2-digit b and c; seed {report['seed']}, preset `{report['preset']}`); "
        f"a tiny Qwen3-architecture model trained from scratch: SFT on imperfect tool use, then GRPO-RoC.", "",
        "| | held-out accuracy |", "|---|---|",
        f"| after SFT | {100 * report['sft_accuracy']:.1f} % |",
        f"| after RL (GRPO-RoC) | {100 * report['final_accuracy']:.1f} % |",
        f"| change | {pts:+.1f} points |", "",
        f"Held-out: {report['heldout_problems']} problems x {report['heldout_samples']} samples. "
        f"Main pipeline wall time: {report['minutes']:.1f} min (whole run {report['total_minutes']:.1f} min).", "",
    ]
    if "grpo" in report:
        roc, grpo = report["roc"], report["grpo"]
        lines += [
            "## RoC vs plain GRPO (same SFT start, seed and steps)", "",
            "| | final held-out accuracy | tool-error ratio in positive trajectories "
            "(training rollouts, mean over the second half of RL) |",
            "|---|---|---|",
            f"| GRPO-RoC | {100 * roc['final_accuracy']:.1f} % | {roc['tool_error_ratio_positive']:.4f} |",
            f"| GRPO | {100 * grpo['final_accuracy']:.1f} % | {grpo['tool_error_ratio_positive']:.4f} |", "",
        ]
    lines += ["Curves: `report.png`. Numbers: `report.json`. Per-step metrics: `rl_*/metrics.jsonl`; "
              "held-out samples: `rl_*/heldout/step_*/trajectories.jsonl`.", ""]
    return "\n".join(lines)


def results_table(report: dict[str, Any]):
    from rich.table import Table

    t = Table(title=f"rstar2 quickstart (seed {report['seed']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("held-out accuracy after SFT", f"{100 * report['sft_accuracy']:.1f} %")
    t.add_row("held-out accuracy after RL", f"{100 * report['final_accuracy']:.1f} %")
    t.add_row("improvement", f"{report['improvement_points']:+.1f} points")
    t.add_row("minutes (main pipeline)", f"{report['minutes']:.1f}")
    for label in ("roc", "grpo"):
        if label in report:
            t.add_row(f"{label}: tool-error ratio in positives", f"{report[label]['tool_error_ratio_positive']:.4f}")
    return t


def write_report(out: Path, report: dict[str, Any], runs: Sequence[Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2))
    plot_curves(runs, out / "report.png")
    (out / "report.md").write_text(markdown_summary(report))
