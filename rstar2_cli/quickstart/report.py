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


def running_mean(ys: Sequence[float], window: int = 4) -> list[float]:
    """Trailing mean over `window` points: one RL step's ratio is noisy (a few dozen positives)."""
    return [sum(ys[max(0, i - window + 1): i + 1]) / len(ys[max(0, i - window + 1): i + 1]) for i in range(len(ys))]


def curves_figure(runs: Sequence[Any]):
    """(figure, axes) of four panels, one line per run (RoC, and plain GRPO with --compare-grpo).

    Each panel's limits are set once all runs are drawn: a limit set earlier would stop the
    autoscaling, and a later run's curve (GRPO's higher tool-error ratio) would leave the chart."""
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
            elif key == "rollout/tool_error_ratio_positive":   # Fig. 4: both methods on one axis
                xs = [int(m["step"]) for m in run.steps]
                ys = [100 * m.get(key, 0.0) for m in run.steps]
                line, = ax.plot(xs, ys, alpha=0.3, lw=1)
                ax.plot(xs, running_mean(ys), color=line.get_color(), lw=2, label=f"{name} (running mean)")
            else:
                xs = [int(m["step"]) for m in run.steps]
                ys = [m.get(key, float("nan")) for m in run.steps]
                ax.plot(xs, ys, label=name)
        if key == "heldout":
            ax.set_ylim(0, 100)
        elif key == "rollout/tool_error_ratio_positive":
            ax.set_ylim(bottom=0)      # the top stays where autoscaling over every run put it
        if key in ("heldout", "rollout/tool_error_ratio_positive"):
            ax.set_ylabel("%")
        ax.set_title(title)
    return fig, list(axes.flat)


def plot_curves(runs: Sequence[Any], path: Path) -> None:
    """`curves_figure` written to `path` as one PNG."""
    fig, axes = curves_figure(runs)
    save_figure(fig, axes, path)


def save_figure(fig, axes, path: Path) -> None:
    """The common finish of the report figures: RL-step x axis, grid, legend; PNG written, closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
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
        f"Main pipeline wall time: {report['minutes']:.1f} min (whole run {report['total_minutes']:.1f} min). "
        f"Code: {report.get('commit', 'unknown')}.", "",
    ]
    if "grpo" in report:
        roc, grpo = report["roc"], report["grpo"]
        lines += [
            "## RoC vs plain GRPO (same SFT start, seed and steps)", "",
            "Tool-error ratio in positive trajectories = failed calls / calls over the trajectories "
            "that ended right (paper Fig. 4); training: over all of a step's rollouts, held-out: the "
            "final model's held-out samples.", "",
            "| | final held-out accuracy | tool-error ratio in positives, training (mean over 2nd half "
            "of RL) | same, whole run | same, final held-out |",
            "|---|---|---|---|---|",
            *(f"| {name} | {100 * r['final_accuracy']:.1f} % | {r['tool_error_ratio_positive']:.4f} | "
              f"{r['tool_error_ratio_positive_all_steps']:.4f} | {r['heldout_tool_error_ratio_positive']:.4f} |"
              for name, r in (("GRPO-RoC", roc), ("GRPO", grpo))), "",
            *verdict_lines(report), "",
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
            r = report[label]
            t.add_row(f"{label}: final held-out accuracy", f"{100 * r['final_accuracy']:.1f} %")
            t.add_row(
                f"{label}: tool-error ratio in positives (2nd half of RL)", f"{r['tool_error_ratio_positive']:.4f}"
            )
            t.add_row(f"{label}: tool-error ratio in positives (final held-out)",
                      f"{r['heldout_tool_error_ratio_positive']:.4f}")
    if "grpo" in report:
        for name, ok in roc_advantage(report).items():
            t.add_row(name, "yes" if ok else "NO")
    return t


# What --compare-grpo checks (the paper's Fig. 4 claim, in miniature): the name, then the test.
GRPO_KEEPS_ERRORS = 0.05     # GRPO's ratio in positives, mean over the second half of RL, at least
ROC_ERROR_FACTOR = 0.5       # RoC's at most this times GRPO's
ACCURACY_SLACK = 0.05        # RoC's final held-out accuracy at most this far below GRPO's


def roc_advantage(report: dict[str, Any]) -> dict[str, bool]:
    """The Fig. 4 checks for one seed's report (with --compare-grpo)."""
    roc, grpo = report["roc"], report["grpo"]
    return {
        f"GRPO keeps errors in positives (>= {GRPO_KEEPS_ERRORS})":
            grpo["tool_error_ratio_positive"] >= GRPO_KEEPS_ERRORS,
        f"RoC's ratio <= {ROC_ERROR_FACTOR}x GRPO's":   # no errors under GRPO: nothing for RoC to show
            0 < grpo["tool_error_ratio_positive"]
            and roc["tool_error_ratio_positive"] <= ROC_ERROR_FACTOR * grpo["tool_error_ratio_positive"],
        f"RoC's accuracy within {100 * ACCURACY_SLACK:.0f} points of GRPO's or better":
            roc["final_accuracy"] >= grpo["final_accuracy"] - ACCURACY_SLACK - 1e-9,
    }


def verdict_lines(report: dict[str, Any]) -> list[str]:
    return [f"- {name}: **{'yes' if ok else 'no'}**" for name, ok in roc_advantage(report).items()]


def write_report(out: Path, report: dict[str, Any], runs: Sequence[Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2))
    plot_curves(runs, out / "report.png")
    (out / "report.md").write_text(markdown_summary(report))
