"""curves.png from metrics.jsonl: training reward with held-out accuracy, response lengths,
tool-error ratios and per-step filtering."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Four panels from metrics.jsonl rows: reward and held-out accuracy, response lengths,
    tool-error ratios, and groups kept / steps skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eval_sets = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("eval/") and k.count("/") == 2})
    panels = [
        (
            "reward and held-out accuracy",
            [("rollout/reward_mean", "training reward")] + [(f"eval/{n}/accuracy", f"{n} avg@k") for n in eval_sets],
        ),
        (
            "response length (tokens)",
            [("rollout/response_length_mean", "training")] + [(f"eval/{n}/response_tokens_mean", n) for n in eval_sets],
        ),
        (
            "tool-error ratio",
            [
                ("rollout/tool_error_ratio", "all"),
                ("rollout/tool_error_ratio_positive", "positive"),
                ("roc_after/tool_error_ratio_positive", "positive, kept by RoC"),
            ],
        ),
        (
            "groups",
            [
                ("roc/groups_kept", "kept"),
                ("roc/groups_dropped", "dropped"),
                ("roc/infra_excluded", "faulted trajectories (sandbox, engine, grader)"),
                ("train/skipped_empty", "step skipped"),
            ],
        ),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (title, lines) in zip(axes.flat, panels):
        for key, label in lines:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
