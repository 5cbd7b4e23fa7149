"""The quickstart's main pipeline from two source trees, same seed, one invocation: minutes and accuracy.

Why: a change that claims to speed the quickstart up is checked end to end, on the same machine
and the same load, against the tree it changes. A is a `git worktree` of `--base` (a commit),
B is this tree. Each runs `rstar2 quickstart --seed S` in its own process with its own tree on
PYTHONPATH, one after the other (A first); the figures are the pipeline's own (report.json:
`minutes` of the main pipeline, the phase timings, held-out accuracy after SFT and after RL).

    flock /tmp/rstar2-cpu.lock python benchmarks/bench_quickstart_ab.py --base 447a5b7 --seed 0 \\
        --json runs/quickstart_ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tree(tree: Path, out: Path, seed: int, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rstar2_cli.cli", "quickstart", "--seed", str(seed), "--out", str(out),
                           *extra], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"quickstart in {tree} failed (exit {proc.returncode}):\n{tail}")
    report = json.loads((out / "report.json").read_text())
    return {"tree": str(tree), "wall_seconds": wall, "loadavg_start": load, "loadavg_end": os.getloadavg(),
            "minutes": report["minutes"], "timings": report.get("timings_seconds"),
            "sft_accuracy": report["sft_accuracy"], "final_accuracy": report["final_accuracy"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="447a5b7", help="commit of tree A")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="folder for the A worktree and both runs (default: a temp dir)")
    ap.add_argument("extra", nargs="*", help="further `rstar2 quickstart` options for both runs (after --)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="quickstart_ab_"))
    work.mkdir(parents=True, exist_ok=True)
    tree_a = work / "tree_a"
    if not tree_a.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree_a), args.base], check=True,
                       capture_output=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    try:
        a = run_tree(tree_a, work / "run_a", args.seed, args.extra)
        b = run_tree(ROOT, work / "run_b", args.seed, args.extra)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree_a)], capture_output=True)
    result = {"seed": args.seed, "a": {**a, "commit": args.base}, "b": {**b, "commit": head + " (working tree)"},
              "speedup_main_pipeline": a["minutes"] / b["minutes"],
              "final_accuracy_points_b_minus_a": 100 * (b["final_accuracy"] - a["final_accuracy"])}

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"quickstart main pipeline, seed {args.seed}: A = {args.base}, B = {head}")
    for col in ("tree", "minutes", "phases (s)", "held-out after SFT", "after RL", "load at start"):
        t.add_column(col, justify="left" if col == "tree" else "right")
    for name, r in (("A", a), ("B", b)):
        phases = ", ".join(f"{k} {v:.0f}" for k, v in (r["timings"] or {}).items())
        t.add_row(name, f"{r['minutes']:.2f}", phases, f"{100 * r['sft_accuracy']:.1f} %",
                  f"{100 * r['final_accuracy']:.1f} %", " ".join(f"{x:.2f}" for x in r["loadavg_start"]))
    Console(width=max(140, Console().width)).print(t)
    print(f"speed-up (A minutes / B minutes): {result['speedup_main_pipeline']:.2f}x; "
          f"held-out after RL, B - A: {result['final_accuracy_points_b_minus_a']:+.1f} points")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
