"""The human side of an eval: one rich table, printed next to the JSON that holds everything."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def metrics_table(results: dict[str, Any]) -> Table:
    m = results["metrics"]
    n = m["samples_per_problem"]
    t = Table(title=f"{results['benchmark']}  ·  {results['model']}", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("problems", str(m["problems"]))
    failed = m.get("failed_samples", 0)
    if failed:
        reasons = ", ".join(f"{reason} {count}" for reason, count in m["failed_by_reason"].items())
        t.add_row("[red]failed samples (scored 0)[/red]",
                  f"[red]{failed} of {m['problems'] * n} ({reasons})[/red]")
    t.add_row(f"avg@{n} pass@1", f"{100 * m[f'avg@{n}']:.1f} % ± {100 * m[f'avg@{n}_std']:.1f}")
    for key in sorted((k for k in m if k.startswith(("pass@", "maj@"))), key=lambda k: (k[:3], int(k.split("@")[1]))):
        t.add_row(key, f"{100 * m[key]:.1f} %")
    for name in ("response_tokens", "turns", "tool_calls"):
        t.add_row(f"{name.replace('_', ' ')} (mean / median)", f"{m[name]['mean']:.1f} / {m[name]['median']:.1f}")
    t.add_row("tool-error rate", f"{100 * m['tool_error_rate']:.1f} %")
    if "tool_call_rate" in m:
        t.add_row("tool-call rate (samples with a call)", f"{100 * m['tool_call_rate']:.1f} %")
    for family in ("gpqa", "ifeval", "bfcl"):   # the families' own numbers (eval/gpqa.py, ifeval.py, bfcl.py)
        for key, value in m.get(family, {}).items():
            shown = ", ".join(value) or "none" if isinstance(value, list) else f"{100 * value:.1f} %"
            t.add_row(f"{family} {key.replace('_', ' ')}", shown)
    return t


def engines_line(summary: dict[str, Any]) -> str:
    """`engines: 8 replicas x TP 1 (GPUs 0 | 1 | ...)`, for the report."""
    n, tp, ids = summary["replicas"], summary["tensor_parallel_size"], summary["gpu_ids"]
    line = f"engines: {n} replica{'s' * (n != 1)}" + (f" x TP {tp}" if tp else "")
    return line + (f" (GPUs {' | '.join(','.join(map(str, g)) for g in ids)})" if ids else "")


def print_report(results: dict[str, Any], out_dir: Path, console: Console | None = None) -> None:
    console = console or Console()
    console.print(metrics_table(results))
    if "engines" in results:
        console.print(engines_line(results["engines"]))
    console.print(f"results: {out_dir / 'results.json'}   samples: {out_dir / 'trajectories.jsonl'}")
    failed = results["metrics"].get("failed_samples", 0)
    if failed:
        console.print(f"[red]{failed} sample(s) failed in the engine or sandbox, not by the model, and score 0: "
                      f"run the same command again to draw them again[/red]")
