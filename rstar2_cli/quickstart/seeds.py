"""`rstar2 quickstart --seeds 0,1,2`: the quickstart on several seeds, and what holds on all of them.

Why: one seed of a tiny-model RL run is an anecdote (the toy's SFT start, held-out set and
initialisation all change with the seed). Each seed runs the whole pipeline into `seed_<n>/`, with
its own report; the folder's report.json / report.md / report.png then give mean ± spread (the
sample standard deviation, and the min..max range) of each quantity, and whether each of RoC's
checks (`report.roc_advantage`) holds on every seed.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from rstar2_cli.quickstart.report import roc_advantage, running_mean, save_figure
from rstar2_cli.quickstart.settings import QuickstartSettings

# (report path, label): the quantities summarised over seeds; `roc.x` is report["roc"]["x"].
QUANTITIES: list[tuple[str, str]] = [
    ("sft_accuracy", "held-out accuracy after SFT"),
    ("roc.final_accuracy", "GRPO-RoC final held-out accuracy"),
    ("grpo.final_accuracy", "GRPO final held-out accuracy"),
    ("improvement_points", "RoC's gain over SFT (points)"),
    ("roc.tool_error_ratio_positive", "GRPO-RoC tool-error ratio in positives (2nd half of RL)"),
    ("grpo.tool_error_ratio_positive", "GRPO tool-error ratio in positives (2nd half of RL)"),
    ("roc.heldout_tool_error_ratio_positive", "GRPO-RoC tool-error ratio in positives (final held-out)"),
    ("grpo.heldout_tool_error_ratio_positive", "GRPO tool-error ratio in positives (final held-out)"),
    ("minutes", "main pipeline minutes (prepare + SFT + RoC)"),
]


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; a clear error for anything else."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: {text!r} is not a comma-separated list of integers (e.g. 0,1,2)") from None
    if not seeds:
        raise ValueError("--seeds: give at least one seed (e.g. 0,1,2)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: {text!r} repeats a seed")
    return seeds


def lookup(report: dict[str, Any], path: str) -> float | None:
    node: Any = report
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def seed_spread(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± spread per quantity, and each RoC check per seed and on all seeds."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in reports], "quantities": {}}
    for path, _ in QUANTITIES:
        values = [v for r in reports if (v := lookup(r, path)) is not None]
        if values:
            out["quantities"][path] = {**spread(values), "per_seed": values}
    if all("grpo" in r for r in reports):
        checks = {r["seed"]: roc_advantage(r) for r in reports}
        names = list(next(iter(checks.values())))
        out["checks"] = {name: {"per_seed": {str(s): c[name] for s, c in checks.items()},
                                "every_seed": all(c[name] for c in checks.values())} for name in names}
        out["roc_advantage_holds_on_every_seed"] = all(v["every_seed"] for v in out["checks"].values())
    return out


def run_seeds(base: QuickstartSettings, seeds: Sequence[int],
              run_one: Callable[[QuickstartSettings], dict[str, Any]]) -> dict[str, Any]:
    """`run_one` (the quickstart: pipeline.run_quickstart) per seed into `<out>/seed_<n>/`, then the
    summary report in `<out>`.

    A seed whose folder already holds a report made with the same settings is not rerun (an
    interrupted sweep resumes where it stopped)."""
    base.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for seed in seeds:
        s = base.model_copy(update={"seed": seed, "out_dir": str(base.out / f"seed_{seed}")})
        done, used = s.out / "report.json", s.out / "settings.json"
        if done.exists() and used.exists() and json.loads(used.read_text()) == json.loads(s.model_dump_json()):
            reports.append(json.loads(done.read_text()))
        else:
            reports.append(run_one(s))
    summary = {**seed_spread(reports), "reports": {str(seed): f"seed_{seed}" for seed in seeds}}
    write_seeds_report(base.out, summary, reports)
    return summary


def _fmt(path: str, q: dict[str, float]) -> str:
    if "accuracy" in path:
        return f"{100 * q['mean']:.1f} ± {100 * q['std']:.1f} % ({100 * q['min']:.1f}..{100 * q['max']:.1f})"
    if "ratio" in path:
        return f"{q['mean']:.4f} ± {q['std']:.4f} ({q['min']:.4f}..{q['max']:.4f})"
    return f"{q['mean']:.1f} ± {q['std']:.1f} ({q['min']:.1f}..{q['max']:.1f})"


def markdown_seeds(summary: dict[str, Any]) -> str:
    seeds = summary["seeds"]
    lines = ["# rstar2 quickstart over seeds " + ", ".join(map(str, seeds)), "",
             f"Mean ± sample standard deviation (min..max) over {len(seeds)} seeds; each seed's own "
             "report is in `seed_<n>/report.md`.", "",
             "| quantity | mean ± std (min..max) | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|---|" + "---|" * len(seeds)]
    for path, label in QUANTITIES:
        q = summary["quantities"].get(path)
        if q:
            cells = [_fmt(path, {"mean": v, "std": 0.0, "min": v, "max": v}).split(" ±")[0] for v in q["per_seed"]]
            lines.append(f"| {label} | {_fmt(path, q)} | " + " | ".join(cells) + " |")
    if "checks" in summary:
        lines += ["", "| RoC check | every seed | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "|---|---|" + "---|" * len(seeds)]
        for name, c in summary["checks"].items():
            lines.append(f"| {name} | {'yes' if c['every_seed'] else 'NO'} | "
                         + " | ".join("yes" if c["per_seed"][str(s)] else "no" for s in seeds) + " |")
        verdict = (
            "holds on every seed" if summary["roc_advantage_holds_on_every_seed"] else "does NOT hold on every seed"
        )
        lines += ["", f"**RoC's advantage {verdict}.**"]
    lines += ["", "Curves: `report.png` (mean over seeds, band = min..max).", ""]
    return "\n".join(lines)


def seeds_figure(reports: Sequence[dict[str, Any]]):
    """(figure, axes) of Fig. 4 over seeds: the tool-error ratio in positives and held-out
    accuracy, both methods, mean with a min..max band; limits set once every series is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_err, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, name in (("roc", "GRPO-RoC"), ("grpo", "GRPO")):
        runs = [r[label] for r in reports if label in r]
        if not runs:
            continue
        n = min(len(r["tool_error_ratio_positive_curve"]) for r in runs)
        ys = np.array([running_mean([100 * v for v in r["tool_error_ratio_positive_curve"][:n]]) for r in runs])
        xs = np.arange(1, n + 1)
        line, = ax_err.plot(xs, ys.mean(0), lw=2, label=f"{name} (mean of {len(runs)} seeds)")
        ax_err.fill_between(xs, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
        m = min(len(r["heldout_accuracy_curve"]) for r in runs)
        steps = [p[0] for p in runs[0]["heldout_accuracy_curve"][:m]]
        acc = np.array([[100 * p[1] for p in r["heldout_accuracy_curve"][:m]] for r in runs])
        line, = ax_acc.plot(steps, acc.mean(0), marker="o", label=name)
        ax_acc.fill_between(steps, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.2)
    ax_err.set_title("tool-error ratio in positive trajectories (Fig. 4)")
    ax_err.set_ylabel("%")
    ax_err.set_ylim(bottom=0)
    ax_acc.set_title("held-out accuracy")
    ax_acc.set_ylabel("%")
    ax_acc.set_ylim(0, 100)
    return fig, [ax_err, ax_acc]


def plot_seeds(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """`seeds_figure` written to `path` as one PNG."""
    fig, axes = seeds_figure(reports)
    save_figure(fig, axes, path)


def seeds_table(summary: dict[str, Any]):
    from rich.table import Table

    t = Table(title=f"rstar2 quickstart over seeds {', '.join(map(str, summary['seeds']))}")
    t.add_column("quantity")
    t.add_column("mean ± std (min..max)", justify="right")
    for path, label in QUANTITIES:
        if path in summary["quantities"]:
            t.add_row(label, _fmt(path, summary["quantities"][path]))
    for name, c in summary.get("checks", {}).items():
        t.add_row(f"{name}, every seed", "yes" if c["every_seed"] else "NO")
    return t


def write_seeds_report(out: Path, summary: dict[str, Any], reports: Sequence[dict[str, Any]]) -> None:
    (out / "report.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(markdown_seeds(summary))
    plot_seeds(reports, out / "report.png")
