"""Stage-3 hard-subset mining: roll out the stage-2 policy 8 times per problem, keep the misses.

The rollouts are an evaluation of the training set under the RL sampling settings, so this reuses
`rstar2 eval`'s runner (same agent loop, sandbox and grader, and its resume: an interrupted
mining run continues where it stopped), with one vLLM replica per group of TP GPUs over every
visible GPU (launch/eval_engines.py). Every problem's pass rate is recorded next to the subset.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rstar2_cli.data.hard_subset import select_hard


def mine_hard(policy: str, data: str, out: str | Path, *, samples: int = 8, data_dir: str | None = None,
              temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 12288, max_turns: int = 10,
              limit: int | None = None, seed: int = 0, sandbox_url: str | None = None, tp: int | None = None,
              engine=None, tools=None, progress: bool = True) -> dict[str, Any]:
    """Write `out` (the hard problems, trainer schema + pass_rate) and `out.pass_rates.json`.
    Without `engine` the replicas are planned here (`tp`: GPUs per replica, default from the
    model's size; ValueError, one line, when that cannot be placed)."""
    from rstar2_cli.data.problems import load_problems
    from rstar2_cli.eval.runner import run_eval
    from rstar2_cli.eval.settings import EvalSettings, context_length
    from rstar2_cli.launch.eval_engines import eval_engines_for

    out = Path(out)
    work = out.parent / f"{out.stem}.rollouts"
    settings = EvalSettings(benchmark="custom", model=policy, data=data, data_dir=data_dir, out_dir=str(work),
                            samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            max_turns=max_turns, limit=limit, seed=seed, sandbox_url=sandbox_url,
                            progress=progress)
    if engine is None:
        plan = eval_engines_for(policy, context_length(settings), tp)
        settings = EvalSettings(**{**settings.model_dump(), **plan.settings()})
    results = run_eval(settings, engine=engine, tools=tools)
    problems = load_problems(data, data_dir=data_dir)
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
        "policy": policy, "data": data, "samples": samples, "problems": len(problems), "hard": len(hard),
        "solved_all": len(problems) - len(hard), "out": str(out), "engines": results["engines"],
        "pass_rates": {pid: s / t for pid, (s, t) in sorted(counts.items())},
    }
    Path(f"{out}.pass_rates.json").write_text(json.dumps(summary, indent=2))
    return summary
