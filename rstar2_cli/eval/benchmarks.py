"""Which benchmarks `rstar2 eval` runs, the family that loads, rolls out and grades each, and
whether its data is there.

Math sets are graded by rstar2's RL grader (`reward.grade_batch`); GPQA, IFEval and BFCL by
their reference packages (eval/reference.py), never by a re-implementation. The families import
only eval/family.py; this registry imports them, so imports run one way.
"""
from __future__ import annotations

from rstar2_cli.data.problems import EVAL_SET_NAMES
from rstar2_cli.eval.bfcl import BFCL
from rstar2_cli.eval.family import MATH, how_to_add, named_set_file
from rstar2_cli.eval.gpqa import GPQA
from rstar2_cli.eval.ifeval import IFEVAL
from rstar2_cli.eval.reference import MissingExtraError, bfcl_data_dir

MATH_SETS = EVAL_SET_NAMES
GENERAL_SETS = ("gpqa_diamond", "ifeval", "bfcl")
BENCHMARKS = (*MATH_SETS, *GENERAL_SETS)
FAMILIES = {"gpqa_diamond": GPQA, "ifeval": IFEVAL, "bfcl": BFCL}
# Paper rows that `rstar2 eval` does not run, and why (docs/eval.md says the same).
LEFT_OUT = {
    "arena_hard": "needs an LLM judge (GPT-4-Turbo in Arena-Hard-Auto) scoring pairwise against "
                  "baseline answers; Arena-Hard-Auto is not a PyPI package, so no reference scorer "
                  "runs offline here",
}


def family_of(benchmark: str):
    """The family object of a benchmark name (a `--data` file with a custom name is math)."""
    return FAMILIES.get(benchmark, MATH)


def missing_data(benchmark: str, data_dir: str | None) -> str | None:
    """None when `benchmark`'s rows can be read without a download: a file in the data dir, the
    bfcl-eval package (BFCL), or the Hub datasets cache when HF_HUB_OFFLINE is set or the Hub
    answers (`hub_ok`); else the "no data: how to add it" line that `eval all` shows in its row."""
    if benchmark == "bfcl":
        try:
            bfcl_data_dir()
        except MissingExtraError as e:
            return f"no data: {e}"
        return None
    if named_set_file(benchmark, data_dir) is not None:
        return None
    return f"no data: {how_to_add(benchmark)}"
