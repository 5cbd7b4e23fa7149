"""Read an RL run folder or an eval output folder into one plain dict for the trajectory page.

An RL run folder holds `metrics.jsonl` (one JSON object per step, rl/logs/writer.py `MetricsWriter`),
`resolved_recipe.yaml` and `rollouts/step_NNNNNN.jsonl.gz` (or `step_NNNNNN.node<k>.jsonl.gz`, one
file per rollout node), one trajectory per line with its turns, grade, RoC decision and advantage.
An eval folder holds `results.json` and `trajectories.jsonl` (eval/runner.py `RESULTS_FILE`,
`TRAJ_FILE`, rows from `sample_record`); `rstar2 eval all` writes one such folder per benchmark
under `A/` (and `B/` with --compare). Eval rows carry the response text only: `eval_rows.py` cuts
it into turns.

Both become {"kind", "source", "metrics", "recipe", "sections", "total", "shown", "skipped",
"on_demand"}: one section per RL step or per benchmark, each with its trajectories in the RL
rollout schema. At most `max_trajectories` are kept, shared evenly over the sections (`allocate`);
the page says how many of how many it shows. With `on_demand` (what `--serve` reads for an RL
run) no rollout file is opened: each step's section holds no trajectory and no count, only the
`url` its trajectories come from (`step/NNNNNN.json`, answered by serve.py from `read_step`).
Bad input raises `InspectError` with one line naming the file (and line).
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, Iterator

from rstar2_cli.config import RESOLVED_RECIPE
from rstar2_cli.inspector.eval_rows import eval_trajectory

METRICS_FILE, RECIPE_FILE, ROLLOUTS_DIR = "metrics.jsonl", RESOLVED_RECIPE, "rollouts"
RESULTS_FILE, TRAJ_FILE = "results.json", "trajectories.jsonl"     # eval/runner.py's names
STEP_FILE = re.compile(r"^step_(\d+)(?:\.node(\d+))?\.jsonl\.gz$")
EVAL_DEPTH = 3               # eval all: OUT/A/<bench>/results.json sits two folders down


class InspectError(ValueError):
    """Input the inspector cannot read: the message is one line naming the file."""


def read_folder(path: str | Path, max_trajectories: int = 2000, on_demand: bool = False) -> dict[str, Any]:
    """The page's data for an RL run folder or an eval folder (see the module docstring);
    `on_demand` applies to RL runs (an eval folder is read and sampled either way)."""
    root = Path(path)
    if not root.exists():
        raise InspectError(f"{root}: no such folder")
    if not root.is_dir():
        raise InspectError(f"{root}: not a folder (give an RL run folder or an eval output folder)")
    if max_trajectories < 0:
        raise InspectError(f"--max-trajectories {max_trajectories}: must be 0 or more")
    if is_rl_run(root):
        return read_rl_steps(root) if on_demand else read_rl_run(root, max_trajectories)
    if eval_folders(root):
        return read_eval(root, max_trajectories)
    raise InspectError(f"{root}: neither an RL run folder ({METRICS_FILE}, {ROLLOUTS_DIR}/) nor an eval folder "
                       f"({RESULTS_FILE}, {TRAJ_FILE})")


def rl_runs_under(root: Path, depth: int = 2) -> list[Path]:
    """The RL run folders in `root`'s subfolders, `depth` levels down at most (a quickstart folder:
    rl_roc/ and rl_grpo/, or seed_<n>/rl_roc/ with --seeds), when `root` is neither a run nor an eval."""
    if is_rl_run(root) or eval_folders(root):
        return []
    found: list[Path] = []
    for level in range(1, depth + 1):
        found += [d for d in sorted(root.glob("/".join(["*"] * level))) if d.is_dir() and is_rl_run(d)
                  and not any(run in d.parents for run in found)]
    return found


def is_rl_run(root: Path) -> bool:
    return (root / METRICS_FILE).is_file() or (root / ROLLOUTS_DIR).is_dir()


def eval_folders(root: Path) -> list[Path]:
    """The folders at or under `root` (at most EVAL_DEPTH levels) that hold an eval's files."""
    found = []
    for depth in range(EVAL_DEPTH):
        for d in sorted(root.glob("/".join(["*"] * depth)) if depth else [root]):
            if d.is_dir() and ((d / RESULTS_FILE).is_file() or (d / TRAJ_FILE).is_file()):
                found.append(d)
    return found


def allocate(counts: list[int], budget: int) -> list[int]:
    """How many of each section's `counts` to keep so that at most `budget` are kept in all,
    spread evenly: every section gets the same share, capped by its count, and what a small
    section leaves goes to the others. When the budget is below the number of sections, evenly
    spaced sections get one each."""
    quota = [0] * len(counts)
    open_ = [i for i, c in enumerate(counts) if c > 0]
    left = min(budget, sum(counts))
    while left > 0 and open_:
        share = left // len(open_)
        if share == 0:                   # fewer left than open sections: evenly spaced ones
            picks = [open_[(k * len(open_)) // left] for k in range(left)]
            for i in picks:
                quota[i] += 1
            break
        for i in open_:
            take = min(share, counts[i] - quota[i])
            quota[i] += take
            left -= take
        open_ = [i for i in open_ if quota[i] < counts[i]]
    return quota


# ---- RL runs ---------------------------------------------------------------------------------

def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InspectError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise InspectError(f"{path}:{n}: a metrics row must be a JSON object")
            rows.append(row)
    return rows


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InspectError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def step_files(root: Path) -> dict[int, list[Path]]:
    """{step: its rollout files, node order} from `rollouts/`."""
    steps: dict[int, list[tuple[int, Path]]] = {}
    folder = root / ROLLOUTS_DIR
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = STEP_FILE.match(f.name)
        if m and f.is_file():
            steps.setdefault(int(m.group(1)), []).append((int(m.group(2) or 0), f))
    return {s: [f for _, f in sorted(fs)] for s, fs in sorted(steps.items())}


def gz_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a gzip file; a damaged or cut file is one InspectError."""
    try:
        with gzip.open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield n, line
    except (OSError, EOFError, zlib.error) as e:
        raise InspectError(f"{path}: not a readable gzip file ({e or type(e).__name__})") from None


def parse_row(line: bytes, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InspectError(f"{where}: not a JSON line ({getattr(e, 'msg', e)})") from None
    if not isinstance(row, dict):
        raise InspectError(f"{where}: a trajectory must be a JSON object")
    return row


def step_url(step: int) -> str:
    """Where the served page fetches step `step`'s trajectories (relative to the page)."""
    return f"step/{step:06d}.json"


def step_summary(metrics: list[dict[str, Any]], step: int) -> dict[str, Any]:
    row = next((r for r in metrics if r.get("step") == step), {})
    return {k: v for k, v in row.items() if isinstance(v, (int, float))}


def run_info(root: Path, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    recipe = root / RECIPE_FILE
    return {"kind": "rl", "source": str(root.resolve()), "metrics": metrics,
            "recipe": read_text(recipe) if recipe.is_file() else None}


def read_rl_steps(root: Path) -> dict[str, Any]:
    """An RL run's page data without a trajectory: its steps from the file names alone."""
    metrics = read_metrics(root / METRICS_FILE)
    sections = [{"name": f"step {step}", "step": step, "total": None, "trajectories": [], "url": step_url(step),
                 "summary": step_summary(metrics, step)} for step in step_files(root)]
    return {**run_info(root, metrics), "sections": sections, "total": None, "shown": 0, "skipped": 0,
            "on_demand": True}


def read_step(root: Path, step: int) -> list[dict[str, Any]] | None:
    """Every trajectory of step `step`, node after node; None when the run has no file of that step."""
    files = step_files(root).get(step)
    if files is None:
        return None
    return [parse_row(line, f"{f}:{n}") for f in files for n, line in gz_lines(f)]


def read_rl_run(root: Path, max_trajectories: int) -> dict[str, Any]:
    metrics = read_metrics(root / METRICS_FILE)
    files = step_files(root)
    counts = {s: sum(1 for f in fs for _ in gz_lines(f)) for s, fs in files.items()}   # also checks every file
    quota = dict(zip(counts, allocate(list(counts.values()), max_trajectories)))
    sections = []
    for step, fs in files.items():
        kept: list[dict[str, Any]] = []
        for f in fs:
            for n, line in gz_lines(f):
                if len(kept) >= quota[step]:
                    break
                kept.append(parse_row(line, f"{f}:{n}"))
        sections.append({"name": f"step {step}", "step": step, "total": counts[step], "trajectories": kept,
                         "summary": step_summary(metrics, step)})
    return {**run_info(root, metrics), "sections": sections, "total": sum(counts.values()),
            "shown": sum(len(s["trajectories"]) for s in sections), "skipped": 0, "on_demand": False}


# ---- eval folders ----------------------------------------------------------------------------

def eval_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    """A trajectories.jsonl's rows and how many lines were skipped: the runner appends chunk by
    chunk and skips a line a crash cut (eval/runner.py `load_done`); so does this reader."""
    rows, skipped = [], 0
    if not path.is_file():
        return rows, skipped
    for line in read_text(path).splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                skipped += 1
    return rows, skipped


def read_eval(root: Path, max_trajectories: int) -> dict[str, Any]:
    found = []
    for folder in eval_folders(root):
        results = {}
        if (folder / RESULTS_FILE).is_file():
            try:
                results = json.loads(read_text(folder / RESULTS_FILE))
            except json.JSONDecodeError as e:
                raise InspectError(f"{folder / RESULTS_FILE}: not JSON ({e.msg}, line {e.lineno})") from None
            if not isinstance(results, dict):
                raise InspectError(f"{folder / RESULTS_FILE}: must be a JSON object")
        rows, skipped = eval_rows(folder / TRAJ_FILE)
        rows.sort(key=lambda r: (str(r.get("problem_id")), r.get("sample_index") or 0))
        name = str(folder.relative_to(root)) if folder != root else str(results.get("benchmark") or root.name)
        found.append((name, results, rows, skipped))
    quota = allocate([len(rows) for _, _, rows, _ in found], max_trajectories)
    sections = []
    for (name, results, rows, _), q in zip(found, quota):
        metrics = results.get("metrics") if isinstance(results.get("metrics"), dict) else {}
        sections.append({"name": name, "step": None, "total": len(rows),
                         "trajectories": [eval_trajectory(r, name) for r in rows[:q]],
                         "summary": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                         "model": results.get("model")})
    return {"kind": "eval", "source": str(root.resolve()), "metrics": [], "recipe": None, "sections": sections,
            "total": sum(len(rows) for _, _, rows, _ in found), "shown": sum(quota),
            "skipped": sum(s for *_, s in found), "on_demand": False}
