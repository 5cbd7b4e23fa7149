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

Results: `eval/<set>/accuracy` (avg@k with k = eval_samples) and its spread, the response
length (`eval/<set>/response_tokens_mean` / `_median`), turns, tool calls and tool-error rate,
and `eval/accuracy` (mean over the sets) for the live table; each set's trajectories and results.json
go under `<out_dir>/eval/step_<N>/<set>/`.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rstar2_cli.config import RecipeConfig


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


def _summary(name: str, results: dict[str, Any]) -> dict[str, float]:
    m = results["metrics"]
    k = m["samples_per_problem"]
    out = {f"eval/{name}/accuracy": float(m[f"avg@{k}"]), f"eval/{name}/accuracy_std": float(m[f"avg@{k}_std"]),
           f"eval/{name}/samples_per_problem": float(k), f"eval/{name}/problems": float(results["num_problems"]),
           f"eval/{name}/tool_error_rate": float(m["tool_error_rate"])}
    for key in ("response_tokens", "turns", "tool_calls"):
        for stat, value in m[key].items():
            out[f"eval/{name}/{key}_{stat}"] = float(value)
    return out


def run_validation(cfg: RecipeConfig, engines: list, tools, step: int, out_dir: Path, *,
                   progress: bool = False) -> dict[str, float]:
    """Evaluate every `train.eval_sets` entry with the current policy on `engines` (all of them share
    the samples); flat metrics for the step. Seeds are per problem and sample, so the results are
    the same whichever engine draws a sample."""
    if not engines:
        raise ValueError("run_validation: no engine to evaluate on (only a rollout host validates)")
    from rich.console import Console

    from rstar2_cli.eval.runner import run_eval
    from rstar2_cli.eval.settings import EvalSettings, protocol_of_rollout

    metrics: dict[str, float] = {}
    for entry in cfg.train.eval_sets:
        name, data = eval_set_source(entry)
        settings = EvalSettings(benchmark=name, data=data, data_dir=cfg.data.data_dir,
                                model=f"{cfg.name}@step{step}", tokenizer=cfg.model.path,
                                out_dir=str(out_dir / "eval" / f"step_{step:06d}" / name),
                                samples=cfg.train.eval_samples, max_tokens=cfg.rollout.max_response_tokens,
                                max_turns=cfg.rollout.max_turns, seed=cfg.train.seed, answer_mode=cfg.reward.mode,
                                **protocol_of_rollout(cfg.rollout), grade_timeout=cfg.reward.timeout, max_model_len=cfg.engine.max_model_len,
                                progress=progress)
        results = run_eval(settings, engine=list(engines), tools=tools, console=Console(file=io.StringIO()))
        metrics.update(_summary(name, results))
    accuracies = [v for k, v in metrics.items() if k.endswith("/accuracy")]
    if accuracies:
        metrics["eval/accuracy"] = sum(accuracies) / len(accuracies)
    return metrics
