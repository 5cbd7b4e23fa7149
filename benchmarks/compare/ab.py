"""A/B two source trees on the same machine in one invocation: the quickstart, or the sandbox.

Why: the machine is shared, and its load can change several-fold within a minute, so figures from
two runs minutes apart say little about a change. Here A (the baseline) and B (the change) run in
the same invocation, each in its own processes with its own tree on PYTHONPATH. A tree is a
checkout folder or a commit (checked out as a temporary `git worktree`, removed at the end).

`quickstart`: `rstar2 quickstart --seed S` from each tree, one after the other (A first, then B,
seed after seed); the figures are the pipeline's own (report.json: `minutes` of the main pipeline,
the phase timings, held-out accuracy after SFT and after RL). Over several seeds the speed-up is
pooled (A's minutes summed over B's), and the held-out difference is given per seed.

`sandbox`: each tree gets an embedded pool (in a runner process importing that tree's `sandbox`)
and a `serve-sandbox` server, all live at once; every round runs every row of both, in turn, and
the report sums the rounds (benchmarks/compare/sandbox_ab.py has the rows).

    flock /tmp/rstar2-cpu.lock python benchmarks/compare/ab.py quickstart --a 447a5b7 --seeds 0,1,2 \\
        --json runs/quickstart_ab.json
    python benchmarks/compare/ab.py sandbox --a /work/main --b . [--calls 600] [--rounds 3] \\
        [--b-server '{"own_thread": false}']
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))   # harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402


@contextlib.contextmanager
def checkout(ref: str, work: Path) -> Iterator[Path]:
    """`ref` as a source tree: a folder as it is, else a commit checked out as a temporary worktree."""
    if Path(ref).is_dir():
        yield Path(ref).resolve()
        return
    tree = work / f"tree_{ref}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def describe(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return f"{head or tree} ({tree})"


def run_quickstart(tree: Path, out: Path, seed: int, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()
    with Stopwatch() as sw:
        proc = subprocess.run([sys.executable, "-m", "rstar2_cli.cli", "quickstart", "--seed", str(seed),
                               "--out", str(out), *extra], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"quickstart in {tree} failed (exit {proc.returncode}):\n{tail}")
    report = json.loads((out / "report.json").read_text())
    return {"tree": str(tree), "wall_seconds": sw.seconds, "loadavg_start": load, "loadavg_end": os.getloadavg(),
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


def quickstart_ab(tree_a: Path, tree_b: Path, seeds: list[int], work: Path, extra: list[str]) -> dict:
    per_seed = []
    for seed in seeds:
        a = run_quickstart(tree_a, work / f"seed_{seed}" / "run_a", seed, extra)
        b = run_quickstart(tree_b, work / f"seed_{seed}" / "run_b", seed, extra)
        per_seed.append({"seed": seed, "a": a, "b": b, "speedup_main_pipeline": a["minutes"] / b["minutes"],
                         "final_accuracy_points_b_minus_a": 100 * (b["final_accuracy"] - a["final_accuracy"])})
    return {**summarise(per_seed), "per_seed": per_seed}


def print_quickstart(result: dict, a: str, b: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"quickstart main pipeline: A = {a}, B = {b}")
    for col in ("seed", "tree", "minutes", "phases (s)", "held-out after SFT", "after RL", "load at start"):
        t.add_column(col, justify="left" if col == "tree" else "right")
    for r in result["per_seed"]:
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name, text in (("quickstart", "the quickstart's main pipeline: minutes and held-out accuracy"),
                       ("sandbox", "the sandbox's rows (embedded, HTTP, the release's client) in interleaved rounds")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--a", required=True, help="tree A (the baseline): a checkout folder or a commit")
        p.add_argument("--b", default=str(ROOT), help="tree B (the change): a folder or a commit (default: this tree)")
        p.add_argument("--work", type=Path, default=None, help="folder for worktrees and runs (default: a temp dir)")
        add_json_option(p)
    q = sub.choices["quickstart"]
    q.add_argument("--seeds", default="0", help="comma-separated seeds, A then B for each")
    q.add_argument("extra", nargs="*", help="further `rstar2 quickstart` options for both runs (after --)")
    s = sub.choices["sandbox"]
    s.add_argument("--calls", type=int, default=600)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--workloads", default="trivial,sympy")
    s.add_argument("--port", type=int, default=18200)
    s.add_argument("--a-server", default="{}", help='JSON Sandbox kwargs of A\'s server, e.g. {"own_thread": false}')
    s.add_argument("--b-server", default="{}", help="JSON Sandbox kwargs of B's server")
    args = ap.parse_args(argv)
    if args.what == "quickstart":
        try:
            args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            q.error(f"--seeds {args.seeds!r}: expected comma-separated integers")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"{args.what}_ab_"))
    work.mkdir(parents=True, exist_ok=True)
    with checkout(args.a, work) as tree_a, checkout(args.b, work) as tree_b:
        a, b = describe(tree_a), describe(tree_b)
        if args.what == "quickstart":
            result = quickstart_ab(tree_a, tree_b, args.seeds, work, args.extra)
            print_quickstart(result, a, b)
        else:
            import asyncio

            # lazy: the sandbox mode's clients; the quickstart mode imports no code of this checkout
            from sandbox_ab import print_sandbox, sandbox_ab

            result = asyncio.run(sandbox_ab(tree_a, tree_b, args))
            print_sandbox(result, a, b)
    result = {"a": a, "b": b, **result}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
