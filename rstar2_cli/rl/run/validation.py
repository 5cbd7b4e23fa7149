"""Held-out evaluation inside an RL run (the release validates on AIME24 before training and
every `trainer.test_freq=5` steps).

Why inside the run and on the trainer's own engines and sandbox: a held-out curve is the only way
to see overfitting or a collapse while it happens, and starting a second engine would double the
memory of a colocated run. So, as the quickstart does, `run_eval` is given every engine of the
rollout host (right after the weight sync, so they sample the policy just trained; the
load-balanced scheduler spreads the samples over them, so a point takes about 1/N of one
engine's time) and its sandbox, and grades with the recipe's reward mode and renders with its
rollout protocol (prompt, tool texts and limits: what the policy is trained on). Generation
follows `rstar2 eval`'s protocol (temperature and top-p of EvalSettings) with the stage's response
budget and turn limit, so a point costs about one rollout of `eval_samples` x the set's size.

Several nodes: every rollout host evaluates an interleaved share of each set (problems h, h + H,
... of H hosts) on its own engines and sandbox, under `<set>/node<h>/`; rank 0 gathers the hosts'
samples (`rl_dist.gather_from`), writes them in the set's order into the set's folder and computes
the results there with `run_eval` (every sample present: nothing is generated again), so the
metrics, results.json and trajectories are those one host evaluating everything writes. Each
sample's seed comes from its problem and index, never from the engine or host that draws it.

Results: `eval/<set>/accuracy` (avg@k with k = eval_samples) and its spread, the response
length (`eval/<set>/response_tokens_mean` / `_median`), turns, tool calls and tool-error rate,
and `eval/accuracy` (mean over the sets) for the live table; each set's trajectories and results.json
go under `<out_dir>/eval/step_<N>/<set>/`.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_cli.config import RecipeConfig
from rstar2_cli.data.problems import load_problems
from rstar2_cli.eval.runner import RESULTS_FILE, TRAJ_FILE, load_done, run_eval
from rstar2_cli.eval.settings import EvalSettings, protocol_of_rollout


def validation_due(cfg: RecipeConfig, step: int) -> bool:
    """Whether the held-out sets are evaluated after `step` (0: before the first update)."""
    every = cfg.train.eval_every
    if every <= 0:
        return False
    if step == 0:
        return cfg.train.eval_before_train
    return step % every == 0 or step == cfg.train.steps


def eval_set_source(name: str) -> tuple[str, str | None]:
    """(benchmark name, data file or None) for an `eval_sets` entry: a benchmark or a jsonl."""
    if name.endswith(".jsonl") or Path(name).is_file():
        return Path(name).stem, name
    return name, None


def check_eval_sets(cfg: RecipeConfig) -> None:
    """Load every held-out set the run will evaluate (`train.eval_every` > 0), so a missing or bad
    one fails at start, not at the first evaluation."""
    if cfg.train.eval_every <= 0:
        return
    for entry in cfg.train.eval_sets:
        name, data = eval_set_source(entry)
        load_problems(data or name, data_dir=cfg.data.data_dir)


def _summary(name: str, results: dict[str, Any]) -> dict[str, float]:
    m = results["metrics"]
    k = m["samples_per_problem"]
    out = {f"eval/{name}/accuracy": float(m[f"avg@{k}"]), f"eval/{name}/accuracy_std": float(m[f"avg@{k}_std"]),
           f"eval/{name}/samples_per_problem": float(k), f"eval/{name}/problems": float(results["num_problems"]),
           f"eval/{name}/tool_error_rate": float(m["tool_error_rate"]),
           f"eval/{name}/failed_samples": float(m.get("failed_samples", 0))}
    for key in ("response_tokens", "turns", "tool_calls"):
        for stat, value in m[key].items():
            out[f"eval/{name}/{key}_{stat}"] = float(value)
    return out


def _settings(cfg: RecipeConfig, name: str, data: str | None, out: Path, step: int, progress: bool):

    return EvalSettings(benchmark=name, data=data, data_dir=cfg.data.data_dir, model=f"{cfg.name}@step{step}",
                        tokenizer=cfg.model.path, out_dir=str(out), samples=cfg.train.eval_samples,
                        max_tokens=cfg.rollout.max_response_tokens, max_turns=cfg.rollout.max_turns,
                        seed=cfg.train.seed, answer_mode=cfg.reward.mode, **protocol_of_rollout(cfg.rollout),
                        grade_timeout=cfg.reward.timeout, max_model_len=cfg.engine.max_model_len, progress=progress)


def _eval(settings, engines: list, tools) -> dict[str, Any]:
    return run_eval(settings, engine=list(engines), tools=tools, console=Console(file=io.StringIO()))


def _set_dir(out_dir: Path, step: int, name: str) -> Path:
    return out_dir / "eval" / f"step_{step:06d}" / name


def _share(cfg: RecipeConfig, name: str, data: str | None, folder: Path, host: int, hosts: int, engines: list,
           tools, step: int, progress: bool) -> dict[str, Any]:
    """Host `host` of `hosts`: its interleaved share of the set, evaluated under `folder`; its samples."""
    share = load_problems(data or name, data_dir=cfg.data.data_dir)[host::hosts]
    if not share:
        return {"rows": [], "generation_seconds": 0.0, "resumed_problems": 0}
    folder.mkdir(parents=True, exist_ok=True)
    problems = folder / "problems.jsonl"
    problems.write_text("".join(json.dumps(p.to_row()) + "\n" for p in share))
    results = _eval(_settings(cfg, name, str(problems), folder, step, progress), engines, tools)
    rows = [r for (_, index), r in load_done(folder / TRAJ_FILE).items() if index < cfg.train.eval_samples]
    return {"rows": rows, "generation_seconds": results["generation_seconds"],
            "resumed_problems": results["resumed_problems"]}


def validate_share(cfg: RecipeConfig, engines: list, tools, step: int, out_dir: Path, *, host: int = 0,
                   hosts: int = 1, progress: bool = False) -> dict[str, dict[str, Any]]:
    """Rollout host `host` of `hosts`: every `train.eval_sets` entry evaluated with the current policy
    on `engines` (all of them share the samples) and `tools`, for `merge_validation` on rank 0. One
    host: the whole set in the set's folder, `{set: {"results": ...}}`; several: its interleaved
    share under `<set>/node<host>/`, `{set: {"rows": its samples, ...}}`."""
    if not engines:
        raise ValueError("run_validation: no engine to evaluate on (only a rollout host validates)")
    part: dict[str, dict[str, Any]] = {}
    for entry in cfg.train.eval_sets:
        name, data = eval_set_source(entry)
        folder = _set_dir(out_dir, step, name)
        if hosts == 1:
            part[name] = {"results": _eval(_settings(cfg, name, data, folder, step, progress), engines, tools)}
        else:
            part[name] = _share(cfg, name, data, folder / f"node{host}", host, hosts, engines, tools, step, progress)
    return part


def _merged(cfg: RecipeConfig, name: str, data: str | None, folder: Path, shares: list[dict[str, Any]],
            engines: list, tools, step: int) -> dict[str, Any]:
    """Rank 0: the hosts' samples of one set, in the set's order, into its folder, and its results
    computed there (`run_eval` finds every sample done; a sample missing would be drawn on
    `engines`). results.json says how long the slowest host generated and what the hosts resumed."""
    order = {p.id: i for i, p in enumerate(load_problems(data or name, data_dir=cfg.data.data_dir))}
    rows = sorted((r for share in shares for r in share["rows"]),
                  key=lambda r: (order.get(r["problem_id"], len(order)), int(r["sample_index"])))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAJ_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = _eval(_settings(cfg, name, data, folder, step, False), engines, tools)
    results.update(generation_seconds=max(s["generation_seconds"] for s in shares),
                   resumed_problems=sum(s["resumed_problems"] for s in shares))
    (folder / RESULTS_FILE).write_text(json.dumps(results, indent=2))
    return results


def merge_validation(cfg: RecipeConfig, shares: list[dict[str, dict[str, Any]]], engines: list, tools, step: int,
                     out_dir: Path) -> dict[str, float]:
    """Rank 0: the flat metrics of the step from every host's `validate_share`, in node order."""
    metrics: dict[str, float] = {}
    for entry in cfg.train.eval_sets:
        name, data = eval_set_source(entry)
        if len(shares) == 1:
            results = shares[0][name]["results"]
        else:
            results = _merged(cfg, name, data, _set_dir(out_dir, step, name), [p[name] for p in shares], engines,
                              tools, step)
        metrics.update(_summary(name, results))
    accuracies = [v for k, v in metrics.items() if k.endswith("/accuracy")]
    if accuracies:
        metrics["eval/accuracy"] = sum(accuracies) / len(accuracies)
    return metrics


def run_validation(cfg: RecipeConfig, engines: list, tools, step: int, out_dir: Path, *,
                   progress: bool = False) -> dict[str, float]:
    """Evaluate every `train.eval_sets` entry with the current policy on one host's `engines` (all of
    them share the samples); flat metrics for the step. Seeds are per problem and sample, so the
    results are the same whichever engine draws a sample."""
    part = validate_share(cfg, engines, tools, step, out_dir, progress=progress)
    return merge_validation(cfg, [part], engines, tools, step, out_dir)
