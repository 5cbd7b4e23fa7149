"""IFEval (541 prompts with verifiable instructions), scored by lm-eval's IFEval checkers.

Every response is checked by lm-eval's `tasks/ifeval/utils.process_results` (the instruction
classes of Google's IFEval code, as lm-eval packages them): strict and loose, per prompt and per
instruction. The run's four numbers are lm-eval's aggregations over every sample: the mean of
the prompt-level booleans, and `agg_inst_level_acc` over the instruction-level lists. A sample's
`reward` is its prompt-level strict result, the number the paper reports (IFEval strict prompt),
so avg@k is that accuracy averaged over the k samples.

What is checked is the answer the user reads (`benchmarks.final_answer_text`): the last
assistant turn without the `<reason>` block, or the inside of its `<answer>` tags.

Why the seeding: lm-eval's checkers draw from Python's process-wide `random` when an instruction's
kwargs leave a value out or give one it rejects (letter_frequency with the letter "#" or "!"
draws a random letter in `build_description`; others draw counts and relations), and langdetect
samples n-grams at random (reference.ifeval seeds it). `score_response` runs lm-eval's code with
`random` seeded to `RANDOM_SEED` and restores the caller's state after, so a response's verdict
is a pure function of the response: the same in every run, on resume, and in any order.
"""
from __future__ import annotations

import random
import statistics
from typing import Any

from rstar2_cli.data.problems import DataError, Problem
from rstar2_cli.eval import reference
from rstar2_cli.eval.family import MathFamily, final_answer_text, load_set, require_fields

RANDOM_SEED = 0      # lm-eval's own default (evaluator.simple_evaluate: random_seed=0)
METRICS = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")


def problem_from_row(row: dict[str, Any], where: str, lineno: int) -> Problem:
    require_fields(row, where, lineno, "key", "prompt", "instruction_id_list", "kwargs")
    ids, kwargs = row["instruction_id_list"], row["kwargs"]
    if not isinstance(ids, list) or not isinstance(kwargs, list) or len(ids) != len(kwargs):
        raise DataError(f"{where}:{lineno}: instruction_id_list and kwargs must be lists of the same length")
    if not all(isinstance(k, dict) for k in kwargs):
        raise DataError(f"{where}:{lineno}: field 'kwargs' must be a list of objects (one per instruction)")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise DataError(f"{where}:{lineno}: field 'prompt' must be non-empty text")

    known = reference.ifeval().instructions_registry.INSTRUCTION_DICT
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise DataError(f"{where}:{lineno}: unknown IFEval instruction {unknown[0]!r}")
    doc = {"key": row["key"], "prompt": row["prompt"], "instruction_id_list": ids, "kwargs": kwargs}
    return Problem(str(row["key"]), row["prompt"], "", "ifeval", {"doc": doc})


def score_response(doc: dict[str, Any], response: str) -> dict[str, Any]:
    """lm-eval's own per-response result: the two prompt-level booleans and two instruction lists."""
    module = reference.ifeval()
    state = random.getstate()
    random.seed(RANDOM_SEED)
    try:
        return module.process_results(doc, [response])
    finally:
        random.setstate(state)


def aggregate(results: list[dict[str, Any]]) -> dict[str, float]:
    """lm-eval's aggregation of per-response results (ifeval.yaml: mean, agg_inst_level_acc)."""
    agg = reference.ifeval().agg_inst_level_acc
    return {
        "prompt_level_strict_acc": statistics.fmean(float(r["prompt_level_strict_acc"]) for r in results),
        "inst_level_strict_acc": agg([r["inst_level_strict_acc"] for r in results]),
        "prompt_level_loose_acc": statistics.fmean(float(r["prompt_level_loose_acc"]) for r in results),
        "inst_level_loose_acc": agg([r["inst_level_loose_acc"] for r in results]),
    }


class IFEvalFamily(MathFamily):
    name = "ifeval"

    def load(self, s) -> list[Problem]:
        return load_set(self.name, "IFEval", s, problem_from_row)

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        out = []
        for t in trajs:
            response = final_answer_text(t.text)
            r = score_response(problems[t.prompt_id].extra["doc"], response)
            out.append({"reward": float(r["prompt_level_strict_acc"]), "extracted": None,
                        "grade_reason": "followed" if r["prompt_level_strict_acc"] else "not_followed",
                        "ifeval": {k: r[k] for k in METRICS}})
        return out

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"ifeval": aggregate([r["ifeval"] for r in rows])}


IFEVAL = IFEvalFamily()
