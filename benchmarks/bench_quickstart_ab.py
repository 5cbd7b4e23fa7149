"""The quickstart's main pipeline from two source trees, same seed, one invocation: minutes and accuracy.

Why: a change that claims to speed the quickstart up is checked end to end, on the same machine
and the same load, against the tree it changes. A is a `git worktree` of `--base` (a commit),
B is this tree. Each runs `rstar2 quickstart --seed S` in its own process with its own tree on
PYTHONPATH, one after the other (A first, then B, seed after seed); the figures are the
pipeline's own (report.json: `minutes` of the main pipeline, the phase timings, held-out accuracy
after SFT and after RL). Over several seeds the speed-up is also pooled (A's minutes summed over
B's), and the held-out difference is given per seed.

    flock /tmp/rstar2-cpu.lock python benchmarks/bench_quickstart_ab.py --base 447a5b7 --seeds 0,1,2 \\
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


def summarise(per_seed: list[dict]) -> dict:
    """Pooled speed-up (sum of A's minutes over B's) and the held-out differences, over the seeds."""
    a_min = sum(r["a"]["minutes"] for r in per_seed)
    b_min = sum(r["b"]["minutes"] for r in per_seed)
    gaps = [r["final_accuracy_points_b_minus_a"] for r in per_seed]
    return {"seeds": [r["seed"] for r in per_seed], "speedup_pooled": a_min / b_min if b_min else 0.0,
            "speedup_per_seed": [r["speedup_main_pipeline"] for r in per_seed],
            "final_accuracy_points_b_minus_a": gaps, "max_abs_accuracy_gap_points": max(abs(g) for g in gaps)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="447a5b7", help="commit of tree A")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, A then B for each")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="folder for the A worktree and both runs (default: a temp dir)")
    ap.add_argument("extra", nargs="*", help="further `rstar2 quickstart` options for both runs (after --)")
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: expected comma-separated integers")
    work = args.work or Path(tempfile.mkdtemp(prefix="quickstart_ab_"))
    work.mkdir(parents=True, exist_ok=True)
    tree_a = work / "tree_a"
    if not tree_a.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree_a), args.base], check=True,
                       capture_output=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    per_seed = []
    try:
        for seed in seeds:
            a = run_tree(tree_a, work / f"seed_{seed}" / "run_a", seed, args.extra)
            b = run_tree(ROOT, work / f"seed_{seed}" / "run_b", seed, args.extra)
            per_seed.append({"seed": seed, "a": {**a, "commit": args.base}, "b": {**b, "commit": head + " (working tree)"},
                             "speedup_main_pipeline": a["minutes"] / b["minutes"],
                             "final_accuracy_points_b_minus_a": 100 * (b["final_accuracy"] - a["final_accuracy"])})
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree_a)], capture_output=True)
    result = {**summarise(per_seed), "per_seed": per_seed}

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"quickstart main pipeline: A = {args.base}, B = {head}")
    for col in ("seed", "tree", "minutes", "phases (s)", "held-out after SFT", "after RL", "load at start"):
        t.add_column(col, justify="left" if col == "tree" else "right")
    for r in per_seed:
        for name in ("a", "b"):
            x = r[name]
            phases = ", ".join(f"{k} {v:.0f}" for k, v in (x["timings"] or {}).items())
            t.add_row(str(r["seed"]), name.upper(), f"{x['minutes']:.2f}", phases, f"{100 * x['sft_accuracy']:.1f} %",
                      f"{100 * x['final_accuracy']:.1f} %", " ".join(f"{v:.2f}" for v in x["loadavg_start"]))
    Console(width=max(140, Console().width)).print(t)
    print(f"speed-up (A minutes / B minutes): pooled {result['speedup_pooled']:.2f}x, per seed "
          + ", ".join(f"{v:.2f}x" for v in result["speedup_per_seed"])
          + "; held-out after RL, B - A: " + ", ".join(f"{g:+.1f}" for g in result["final_accuracy_points_b_minus_a"])
          + " points")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
