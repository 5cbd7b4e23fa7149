"""What an RL run folder (`train.out_dir`) already holds, read before a run starts.

A run writes `step_<n>/` checkpoints, a `latest` file naming the newest one and a `metrics.jsonl`
row per step (rl/update/checkpoint.py, rl/logs/writer.py). A second run started into the same folder without
`--resume` would append its steps 1, 2, ... to the first run's rows, overwrite some of its
checkpoints and move `latest`, so `rstar2 rl` refuses it (`refusal`). Reading plain files only
(no torch): the check runs before anything is imported or started.

`resolved_recipe.yaml` (config.RESOLVED_RECIPE) is the recipe a run was launched with, written by
whoever launches it (`rstar2 rl` on each node, before torchrun reads it; the quickstart for its RL
runs) through `write_resolved_recipe` alone; the trainer only reads recipes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: `rstar2 rl --help` reads this module without pydantic
    from rstar2_cli.config import RecipeConfig

METRICS_FILE = "metrics.jsonl"
LATEST_FILE = "latest"
STEP_PREFIX = "step_"


@dataclass(frozen=True)
class PreviousRun:
    """The traces of a run in a folder: the highest step any of them names, and what they are."""
    step: int | None
    traces: tuple[str, ...]


def step_of(name: str) -> int | None:
    """The n of a `step_<n>` name; None for any other name."""
    suffix = name.removeprefix(STEP_PREFIX)
    return int(suffix) if name.startswith(STEP_PREFIX) and suffix.isdigit() else None


def last_logged_step(metrics_text: str) -> int | None:
    """The `step` of metrics.jsonl's last readable row (a cut last line is skipped)."""
    for line in reversed(metrics_text.splitlines()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            return int(row["step"])
    return None


def previous_run(out_dir: str | Path) -> PreviousRun | None:
    """The run `out_dir` holds: a `step_<n>` folder, a `latest` file or a non-empty metrics.jsonl;
    None when it holds none of them (an empty or missing folder, or one with only a recipe)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return None
    steps: list[int] = []
    traces: list[str] = []
    latest = out_dir / LATEST_FILE
    if latest.is_file():
        named = latest.read_text(encoding="utf-8", errors="replace").strip()
        traces.append(f"{LATEST_FILE} -> {named}")
        steps += [n for n in (step_of(named),) if n is not None]
    folders = sorted((n, p.name) for p in out_dir.glob(f"{STEP_PREFIX}*") if p.is_dir()
                     and (n := step_of(p.name)) is not None)
    if folders:
        traces.append(folders[-1][1] if len(folders) == 1 else f"{folders[0][1]} .. {folders[-1][1]}")
        steps.append(folders[-1][0])
    metrics = out_dir / METRICS_FILE
    text = metrics.read_text(encoding="utf-8", errors="replace") if metrics.is_file() else ""
    if text.strip():
        logged = last_logged_step(text)
        traces.append(METRICS_FILE if logged is None else f"{METRICS_FILE} through step {logged}")
        steps += [logged] if logged is not None else []
    if not traces:
        return None
    return PreviousRun(max(steps) if steps else None, tuple(traces))


def refusal(out_dir: str | Path, resume: str | None) -> str | None:
    """The one line that refuses a fresh start into a folder holding a run; None when the run may
    start (the folder holds none, or `--resume` continues it)."""
    if resume:
        return None
    found = previous_run(out_dir)
    if found is None:
        return None
    at = f"at step {found.step}" if found.step is not None else "with no step logged"
    return (f"train.out_dir {out_dir}: already holds a run, {at} ({', '.join(found.traces)}); a new run there "
            f"would mix with it. Continue it with --resume (its latest checkpoint) or --resume auto (that, "
            f"else a fresh start), or give this run another train.out_dir (--set train.out_dir=DIR)")


def write_resolved_recipe(cfg: RecipeConfig) -> Path:
    """`cfg` as `<train.out_dir>/resolved_recipe.yaml`, atomically (every node of a launch may
    write it at once: the same text)."""
    from rstar2_cli.config import RESOLVED_RECIPE, dump_recipe  # lazy: pydantic, for --help's speed (cli.py)

    path = Path(cfg.train.out_dir) / RESOLVED_RECIPE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(dump_recipe(cfg))
    tmp.replace(path)
    return path
