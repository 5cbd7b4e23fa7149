"""What every benchmark family shares: the math family (the base the others extend), reading a
named set's rows, and the answer text a user reads.

A family says three things: how its rows become `Problem`s (`load`), how a batch of them is
rolled out (`rollout`: the agent loop by default, so the model may call its Python tool exactly
as in RL), and how a trajectory is graded (`grade`: one dict per trajectory with `reward`,
`extracted`, `grade_reason` and the family's own fields). `metrics` adds the family's headline
numbers to the avg@k the runner computes from `reward`.

This module sits below the families (gpqa.py, ifeval.py, bfcl.py) and the registry
(benchmarks.py) imports them all, so imports run one way.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

from rstar2_cli import reward
from rstar2_cli.data.problems import (
    HUB_IDS, DataError, Problem, find_named_set_file, iter_rows, load_hub_source, load_problems, resolve_data_dir,
)
from rstar2_cli.rollout.agent_loop import run_agent_loop


def final_answer_text(text: str) -> str:
    """What a response says to the user: its last assistant turn, without the `<reason>` block
    and without tags; the inside of its last `<answer>...</answer>` when it has one.

    The release's protocol asks for `<reason> ... </reason> <answer> ... </answer>`; IFEval checks
    the answer the user reads, not the reasoning or the tool turns before it."""
    last = final_turn(text)
    if "</reason>" in last:
        last = last.rsplit("</reason>", 1)[1]
    elif last.lstrip().startswith("<reason>"):
        last = last.split("<reason>", 1)[1]
    if "<answer>" in last:
        inner = last.rsplit("<answer>", 1)[1]
        last = inner.split("</answer>", 1)[0]
    return last.strip()


def final_turn(text: str) -> str:
    """The whole last assistant turn of a response (reasoning included), without end tokens: what a
    single-turn harness such as lm-eval would hand its filters."""
    last = text.rsplit("<|im_start|>assistant\n", 1)[-1]
    for token in ("<|im_end|>", "<|endoftext|>"):
        last = last.replace(token, "")
    return last


def named_set_file(name: str, data_dir: str | None) -> Path | None:
    """`<data dir>/<name>.jsonl` (or .parquet / .json) when it exists, else the copy shipped in the
    package (aime24, aime25, math500, hmmt25: data/problems.py). A benchmark name is never
    read as a path: a folder `ifeval/` in the working directory does not shadow the benchmark."""
    return find_named_set_file(name, resolve_data_dir(data_dir))


def set_rows(name: str, data: str | None, data_dir: str | None) -> tuple[str, Iterator[tuple[int, dict[str, Any]]]]:
    """(where, rows) of a named set: `--data FILE`, else `<data_dir>/<name>.jsonl` or the shipped copy, else the Hub
    dataset in HUB_IDS (the local datasets cache when HF_HUB_OFFLINE is set). `where` names the
    source in DataError messages."""
    if data:
        return data, iter_rows(Path(data))
    found = named_set_file(name, data_dir)
    if found is not None:
        return str(found), iter_rows(found)
    spec = HUB_IDS[name]
    try:
        import datasets  # lazy: datasets (~0.7 s), only for a set read from the Hub

        ds = datasets.load_dataset(spec.dataset_id, spec.config, split=spec.split)
    except Exception as e:  # offline, gated, renamed...: one line naming the set and the way out
        first = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"hub:{spec.dataset_id}: load failed: {type(e).__name__}: {first}. "
                        f"{how_to_add(name)}") from None
    return f"hub:{spec.dataset_id}", enumerate(ds, 1)


def how_to_add(name: str) -> str:
    """One line telling a user how to give `rstar2 eval` the set `name`."""
    if name in ("gpqa_diamond", "ifeval"):
        flag = "--gpqa" if name == "gpqa_diamond" else "--ifeval"
        gated = (" (GPQA is gated on the Hub: accept its terms on the dataset page and `huggingface-cli login` "
                 "to fetch it)" if name == "gpqa_diamond" else "")
        return (f"run `rstar2 prepare eval-data {flag} FILE --out DIR` and pass `--data-dir DIR`, or "
                f"`rstar2 prepare eval-data --from-hub` with {HUB_IDS[name].dataset_id} in the Hub cache{gated}")
    return f"put {name}.jsonl in the data dir (--data-dir or $RSTAR2_DATA_DIR), or pass --data FILE"


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
        if s.data:
            return load_problems(s.data)
        found = named_set_file(s.benchmark, s.data_dir)
        if found is not None:
            return load_problems(str(found))
        return load_hub_source(HUB_IDS[s.benchmark], s.benchmark)

    async def rollout(self, chunk: list[Problem], s, generator, tools, tokenizer) -> list:
        return await run_agent_loop([(p.id, p.problem, p.answer) for p in chunk], s.samples, generator, tools,
                                    tokenizer, s.rollout_config(), seed=s.seed, progress=s.progress)

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        grades = reward.grade_batch([(t.text, t.gold) for t in trajs], timeout=s.grade_timeout, mode=s.answer_mode)
        return [{"reward": g.reward, "extracted": g.extracted, "grade_reason": g.reason} for g in grades]

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {}


MATH = MathFamily()


async def grade_in_thread(family, trajs, problems, s) -> list[dict[str, Any]]:
    """Grading is CPU work (and may spawn processes): off the event loop that drives the engines."""
    return await asyncio.to_thread(family.grade, trajs, problems, s)
