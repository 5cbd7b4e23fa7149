"""Stage-3 hard-subset mining: roll out the stage-2 policy 8 times per problem, keep the misses.

The rollouts are an evaluation of the training set under the RL sampling settings, so this reuses
`rstar2 eval`'s runner (same agent loop, sandbox and grader, and its resume: an interrupted
mining run continues where it stopped), with one vLLM replica per group of TP GPUs over every
visible GPU (launch/eval_engines.py). Every problem's pass rate is recorded next to the subset.

Which settings: a problem counts as solved or missed under the policy's own rollouts, so they
take the settings of the RL run that trained it: the recipe that run resolved and wrote in its
`train.out_dir` (config.RESOLVED_RECIPE), the folder its checkpoints sit in (`run_recipe_of`), or a
recipe named instead. From it come the turns, the response tokens, temperature and top-p, the
prompt and tool protocol, the request seeds (its rollout section), what counts as solved
(`reward.mode`) and the problems (`data.train`); a value given on the command line replaces the
recipe's, and `MiningSettings.sources` says where each one came from.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2_cli.config import RESOLVED_RECIPE, RolloutConfig, load_recipe
from rstar2_cli.data.hard_subset import select_hard
from rstar2_cli.data.problems import load_problems
from rstar2_cli.eval import runner
from rstar2_cli.eval.settings import EvalSettings, context_length, protocol_of_rollout, rollout_fields
from rstar2_cli.launch.eval_engines import eval_engines_for
from rstar2_cli.rl.run.stages import find_recipe

# The rollout settings a command line can give (RolloutConfig fields): without a recipe, all of them must be
SAMPLING = ("max_turns", "max_response_tokens", "temperature", "top_p")
DEFAULT_SOURCE = "default (rstar2_cli/config.py)"


def run_recipe_of(policy: str) -> Path | None:
    """The resolved recipe of the RL run a checkpoint folder belongs to: RESOLVED_RECIPE in the
    folder or the nearest folder above it (a checkpoint is `train.out_dir/final` or `/step_N`);
    None for a Hub id or a folder outside any run. The path is taken as given (`..` folded, links
    not followed), so a link named `runs/stage2/final` belongs to `runs/stage2`."""
    path = Path(policy).expanduser()
    if not path.is_dir():
        return None
    path = Path(os.path.abspath(path))
    return next((d / RESOLVED_RECIPE for d in (path, *path.parents) if (d / RESOLVED_RECIPE).is_file()), None)


def stage3_problems() -> str:
    """Where stage 3 reads its problems (the packaged stage-3 recipe's data.train): the subset's
    default place."""
    return load_recipe(find_recipe("stage3")).data.train


SETTINGS = (*SAMPLING, "protocol", "answer_mode", "data")       # what MiningSettings reports, in order


@dataclass(frozen=True)
class MiningSettings:
    """The validated settings of one mining run and where each came from."""
    rollout: RolloutConfig
    answer_mode: str                  # reward.mode: what counts as solved
    data: str                         # the problems to mine
    origin: str                       # the recipe file the settings come from, or DEFAULT_SOURCE
    given: dict[str, str]             # the settings given instead, each with where it was given (its flag)

    @property
    def sources(self) -> dict[str, str]:
        return {name: self.given.get(name, self.origin) for name in SETTINGS}

    def report(self) -> dict[str, dict[str, Any]]:
        """Each setting with its value and source, as the summary JSON records them."""
        protocol = {**protocol_of_rollout(self.rollout), "seed_requests": self.rollout.seed_requests}
        values = {**{f: getattr(self.rollout, f) for f in SAMPLING}, "protocol": protocol,
                  "answer_mode": self.answer_mode, "data": self.data}
        return {name: {"value": values[name], "from": source} for name, source in self.sources.items()}

    def line(self) -> str:
        """One line for the console: `settings from runs/stage2/resolved_recipe.yaml: max_turns 5, ...;
        given: temperature 0.6 (--temperature)`."""
        items = self.report()

        def said(name: str) -> str:
            return name if name == "protocol" else f"{name} {items[name]['value']}"

        line = f"settings from {self.origin}: " + ", ".join(said(n) for n in SETTINGS if n not in self.given)
        return line + ("; given: " + ", ".join(f"{said(n)} ({flag})" for n, flag in self.given.items())
                       if self.given else "")


def mining_settings(recipe: str | Path | None, given: dict[str, tuple[Any, str]]) -> MiningSettings:
    """The settings of a mining run: `recipe`'s (None: the schema's defaults), with `given`
    ({setting: (value, where it was given)}; settings: SAMPLING's and `data`) in their place.
    A recipe that does not load is a ConfigError naming the file; a given value out of its bounds
    (config.py's, checked here, once) a pydantic ValidationError naming the setting."""
    cfg = load_recipe(recipe)
    rollout = RolloutConfig.model_validate({**cfg.rollout.model_dump(),
                                            **{f: v for f, (v, _) in given.items() if f in SAMPLING}})
    data = given["data"][0] if "data" in given else cfg.data.train
    return MiningSettings(rollout=rollout, answer_mode=cfg.reward.mode, data=str(data),
                          origin=str(recipe) if recipe is not None else DEFAULT_SOURCE,
                          given={name: where for name, (_, where) in given.items()})


def mine_hard(policy: str, out: str | Path, settings: MiningSettings, *, samples: int, data_dir: str | None = None,
              limit: int | None = None, seed: int = 0, sandbox_url: str | None = None, tp: int | None = None,
              engine=None, tools=None, progress: bool = True) -> dict[str, Any]:
    """Write `out` (the hard problems, trainer schema + pass_rate) and `out.pass_rates.json`.
    Without `engine` the replicas are planned here (`tp`: GPUs per replica, default from the
    model's size; ValueError, one line, when that cannot be placed)."""
    out = Path(out)
    work = out.parent / f"{out.stem}.rollouts"
    evals = EvalSettings(benchmark="custom", model=policy, data=settings.data, data_dir=data_dir, out_dir=str(work),
                         samples=samples, limit=limit, seed=seed, sandbox_url=sandbox_url, progress=progress,
                         answer_mode=settings.answer_mode, **rollout_fields(settings.rollout))
    if engine is None:
        plan = eval_engines_for(policy, context_length(evals), tp)
        evals = EvalSettings(**{**evals.model_dump(), **plan.settings()})
    results = runner.run_eval(evals, engine=engine, tools=tools)
    problems = load_problems(settings.data, data_dir=data_dir)
    if limit:
        problems = problems[:limit]
    # run_eval's per-problem rows count the same samples (index < samples, reward > 0); the
    # solved count is recovered exactly from solved_fraction * samples.
    counts = {r["problem_id"]: (round(r["solved_fraction"] * r["samples"]), r["samples"])
              for r in results["per_problem"]}
    hard = set(select_hard(counts, threshold_solved=samples))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for p in problems:
            if p.id in hard:
                solved, total = counts[p.id]
                f.write(json.dumps({**p.to_row(), "pass_rate": solved / total}) + "\n")
    summary = {
        "policy": policy, "data": settings.data, "samples": samples, "problems": len(problems), "hard": len(hard),
        "solved_all": len(problems) - len(hard), "out": str(out), "engines": results["engines"],
        "settings": settings.report(), "pass_rates": {pid: s / t for pid, (s, t) in sorted(counts.items())},
    }
    Path(f"{out}.pass_rates.json").write_text(json.dumps(summary, indent=2))
    return summary
