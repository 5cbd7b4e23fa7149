"""Which benchmarks `rstar2 eval` runs, how each is loaded, rolled out and graded.

A benchmark family says three things: how its rows become `Problem`s (`load`), how a batch of
them is rolled out (`rollout`: the agent loop by default, so the model may call its Python tool
exactly as in RL), and how a trajectory is graded (`grade`: one dict per trajectory with
`reward`, `extracted`, `grade_reason` and the family's own fields). `metrics` adds the
family's headline numbers to the avg@k the runner computes from `reward`.

Math sets are graded by rstar2's RL grader (`reward.grade_batch`); GPQA, IFEval and BFCL by
their reference packages (eval/reference.py), never by a re-implementation.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

from rstar2_cli.data.problems import (
    EVAL_SET_NAMES, HUB_IDS, DataError, Problem, find_named_set_file, iter_rows, load_problems, resolve_data_dir,
)

MATH_SETS = EVAL_SET_NAMES
GENERAL_SETS = ("gpqa_diamond", "ifeval", "bfcl")
BENCHMARKS = (*MATH_SETS, *GENERAL_SETS)
# Paper rows that `rstar2 eval` does not run, and why (docs/eval.md says the same).
LEFT_OUT = {
    "arena_hard": "needs an LLM judge (GPT-4-Turbo in Arena-Hard-Auto) scoring pairwise against "
                  "baseline answers; Arena-Hard-Auto is not a PyPI package, so no reference scorer "
                  "runs offline here",
}


def family_of(benchmark: str):
    """The family object of a benchmark name (a `--data` file with a custom name is math)."""
    if benchmark == "gpqa_diamond":
        from rstar2_cli.eval.gpqa import GPQA

        return GPQA
    if benchmark == "ifeval":
        from rstar2_cli.eval.ifeval import IFEVAL

        return IFEVAL
    if benchmark == "bfcl":
        from rstar2_cli.eval.bfcl import BFCL

        return BFCL
    return MATH


def final_answer_text(text: str) -> str:
    """What a response says to the user: its last assistant turn, without the `<reason>` block
    and without tags; the inside of its last `<answer>...</answer>` when it has one.

    The release's protocol asks for `<reason> ... </reason> <answer> ... </answer>`; IFEval checks
    the answer the user reads, not the reasoning or the tool turns before it."""
    last = text.rsplit("<|im_start|>assistant\n", 1)[-1]
    for token in ("<|im_end|>", "<|endoftext|>"):
        last = last.replace(token, "")
    if "</reason>" in last:
        last = last.rsplit("</reason>", 1)[1]
    elif last.lstrip().startswith("<reason>"):
        last = last.split("<reason>", 1)[1]
    if "<answer>" in last:
        inner = last.rsplit("<answer>", 1)[1]
        last = inner.split("</answer>", 1)[0]
    return last.strip()


def set_rows(name: str, data: str | None, data_dir: str | None) -> tuple[str, Iterator[tuple[int, dict[str, Any]]]]:
    """(where, rows) of a named set: `--data FILE`, else `<data_dir>/<name>.jsonl`, else the hub id
    in HUB_IDS. `where` names the source in DataError messages."""
    if data:
        return data, iter_rows(Path(data))
    found = find_named_set_file(name, resolve_data_dir(data_dir))
    if found is not None:
        return str(found), iter_rows(found)
    spec = HUB_IDS[name]
    try:
        import datasets

        ds = datasets.load_dataset(spec.dataset_id, spec.config, split=spec.split)
    except Exception as e:  # offline, gated, renamed...: one line naming the set and the way out
        first = str(e).splitlines()[0] if str(e) else ""
        hint = (" GPQA is gated on the Hub: accept its terms on the dataset page, then run "
                "`huggingface-cli login` (or pass --data FILE)." if name == "gpqa_diamond" else
                " Pass --data FILE or put the set in $RSTAR2_DATA_DIR.")
        raise DataError(f"hub:{spec.dataset_id}: load failed: {type(e).__name__}: {first}.{hint}") from None
    return f"hub:{spec.dataset_id}", enumerate(ds, 1)


def load_set(name: str, label: str, s, from_row) -> list[Problem]:
    """A named set's rows (`set_rows`) as Problems through the family's `from_row(row, where, lineno)`."""
    where, rows = set_rows(name, s.data, s.data_dir)
    problems = [from_row(row, where, lineno) for lineno, row in rows]
    if not problems:
        raise DataError(f"{where}: no {label} rows")
    return problems


def require_fields(row: dict[str, Any], where: str, lineno: int, *names: str) -> None:
    for name in names:
        if name not in row or row[name] is None:
            raise DataError(f"{where}:{lineno}: missing field {name!r}")


class MathFamily:
    """AIME, MATH-500, HMMT and custom `(id, problem, answer)` files: rstar2's RL grader."""
    name = "math"

    def load(self, s) -> list[Problem]:
        return load_problems(s.data or s.benchmark, data_dir=s.data_dir)

    async def rollout(self, chunk: list[Problem], s, generator, tools, tokenizer) -> list:
        from rstar2_cli.rollout.agent_loop import run_agent_loop

        return await run_agent_loop([(p.id, p.problem, p.answer) for p in chunk], s.samples, generator, tools,
                                    tokenizer, s.rollout_config(), seed=s.seed, progress=s.progress)

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        from rstar2_cli.reward import grade_batch

        grades = grade_batch([(t.text, t.gold) for t in trajs], timeout=s.grade_timeout, mode=s.answer_mode)
        return [{"reward": g.reward, "extracted": g.extracted, "grade_reason": g.reason} for g in grades]

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {}


MATH = MathFamily()


async def grade_in_thread(family, trajs, problems, s) -> list[dict[str, Any]]:
    """Grading is CPU work (and may spawn processes): off the event loop that drives the engines."""
    return await asyncio.to_thread(family.grade, trajs, problems, s)
