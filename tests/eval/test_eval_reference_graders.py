"""GPQA, IFEval and BFCL scores on canned responses equal the reference packages' own scores.

Each test grades canned model outputs through `rstar2 eval`'s family (what a run writes), and
separately calls the reference package's own scoring entry point on the same outputs: lm-eval's
MultiChoiceRegexFilter and exact match for GPQA, lm-eval's IFEval `process_results` and
aggregations, bfcl-eval's `ast_checker` on hand-written BFCL-format calls. The hand-known
scores are asserted too, so a grader that silently failed everything would not pass.
"""
from __future__ import annotations

import json

import pytest

from rstar2_cli.eval import reference
from rstar2_cli.rollout.trajectory import Trajectory


def _traj(pid: str, k: int, answer: str, gold: str = "") -> Trajectory:
    """A response laid out as the release's protocol writes it."""
    return Trajectory(prompt_id=pid, sample_index=k, gold=gold,
                      text=f"let me think</reason>\n<answer>{answer}</answer><|im_end|>")


def test_installed_reference_versions_are_the_pinned_ones():
    v = reference.versions()
    assert v["lm_eval"] == reference.LM_EVAL_VERSION and v["bfcl_eval"] == reference.BFCL_EVAL_VERSION
    assert reference.punkt_tab_dir() is not None


# ---------------------------------------------------------------- GPQA
GPQA_ROW = {"Record ID": "rec1", "Question": "Which gas is inert?", "Correct Answer": "Argon",
            "Incorrect Answer 1": "Oxygen", "Incorrect Answer 2": "Chlorine", "Incorrect Answer 3": "Fluorine"}


def test_gpqa_permutation_is_fixed_per_question_and_recorded():
    from rstar2_cli.eval.gpqa import choice_permutation, problem_from_row

    p = problem_from_row(GPQA_ROW, "f", 1)
    assert p.extra["permutation"] == choice_permutation("rec1") == choice_permutation("rec1")
    assert sorted(p.extra["permutation"]) == [0, 1, 2, 3]
    assert p.extra["choices"][ord(p.answer[1]) - 65] == "Argon"
    assert f"({p.answer[1]}) Argon" in p.problem
    assert {tuple(choice_permutation(f"q{i}")) for i in range(40)} != {tuple(choice_permutation("q0"))}


def test_gpqa_scores_equal_lm_eval_extraction():
    from rstar2_cli.eval.gpqa import FILTER_ARGS, GPQA, problem_from_row

    p = problem_from_row(GPQA_ROW, "f", 1)
    gold = p.answer[1]
    wrong = next(c for c in "ABCD" if c != gold)
    canned = [f"\\boxed{{{gold}}}", f"\\boxed{{({wrong})}}", "The answer is Argon.",
              f"I pick ({gold}) here", "no idea", f"\\boxed{{{p.extra['choices'][ord(wrong) - 65]}}}"]
    expected = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    trajs = [_traj("rec1", k, c) for k, c in enumerate(canned)]
    ours = GPQA.grade(trajs, {"rec1": p}, None)
    assert [g["reward"] for g in ours] == expected
    # the reference: lm-eval's flexible-extract filter and exact match on what the model answered
    flt = reference.multi_choice_filter_class()(**FILTER_ARGS)
    inputs = [f"({gold})", f"({wrong})", "The answer is Argon.", f"I pick ({gold}) here", "no idea",
              p.extra["choices"][ord(wrong) - 65]]
    ref = [float(flt.apply([[x]], [{"choices": p.extra["choices"]}])[0][0] == p.answer) for x in inputs]
    assert [g["reward"] for g in ours] == ref
    assert all(g["permutation"] == p.extra["permutation"] for g in ours)


# ---------------------------------------------------------------- IFEval
IFEVAL_ROWS = [
    {"key": 1, "prompt": "Write about cats without commas.", "instruction_id_list": ["punctuation:no_comma"],
     "kwargs": [{}]},
    {"key": 2, "prompt": "Answer in fewer than 3 sentences, all lowercase.",
     "instruction_id_list": ["length_constraints:number_sentences", "change_case:english_lowercase"],
     "kwargs": [{"relation": "less than", "num_sentences": 3}, {}]},
    {"key": 3, "prompt": "Use at least 2 words in all capital letters.",
     "instruction_id_list": ["change_case:capital_word_frequency"],
     "kwargs": [{"capital_relation": "at least", "capital_frequency": 2}]},
]
IFEVAL_RESPONSES = {  # (problem key, response) -> hand-checked strict prompt-level result
    ("1", "Cats are calm and they sleep a lot."): True,
    ("1", "Cats are calm\nBye, friend"): False,   # loose drops the last line: followed
    ("2", "cats are small animals that sleep for most of the day. dogs like to bark at the mail carrier."): True,
    ("2", "Cats are small animals that sleep for most of the day."): False,
    ("3", "I LOVE CATS and DOGS"): True,
    ("3", "*\nHello world\n*"): False,
}


def test_ifeval_scores_equal_lm_eval_process_results():
    from rstar2_cli.eval.ifeval import IFEVAL, problem_from_row

    problems = {p.id: p for p in (problem_from_row(r, "f", i) for i, r in enumerate(IFEVAL_ROWS, 1))}
    keys = list(IFEVAL_RESPONSES)
    trajs = [_traj(pid, k, resp) for k, (pid, resp) in enumerate(keys)]
    graded = IFEVAL.grade(trajs, problems, None)
    assert [bool(g["reward"]) for g in graded] == list(IFEVAL_RESPONSES.values())
    rows = [dict(g) for g in graded]
    ours = IFEVAL.metrics(rows)["ifeval"]
    # the reference: lm-eval's process_results on each response and its aggregations (ifeval.yaml)
    mod = reference.ifeval()
    docs = {str(r["key"]): r for r in IFEVAL_ROWS}
    results = [mod.process_results(docs[pid], [resp]) for pid, resp in keys]
    assert ours["prompt_level_strict_acc"] == sum(r["prompt_level_strict_acc"] for r in results) / len(results)
    assert ours["prompt_level_loose_acc"] == sum(r["prompt_level_loose_acc"] for r in results) / len(results)
    assert ours["inst_level_strict_acc"] == mod.agg_inst_level_acc([r["inst_level_strict_acc"] for r in results])
    assert ours["inst_level_loose_acc"] == mod.agg_inst_level_acc([r["inst_level_loose_acc"] for r in results])
    assert ours["prompt_level_strict_acc"] == 3 / 6 and ours["inst_level_strict_acc"] == 5 / 8
    assert ours["prompt_level_loose_acc"] == 4 / 6 and ours["inst_level_loose_acc"] == 6 / 8


def test_ifeval_grades_the_answer_not_the_reasoning():
    from rstar2_cli.eval.benchmarks import final_answer_text

    text = "a, b, c</reason> <answer>no commas here</answer><|im_end|>"
    assert final_answer_text(text) == "no commas here"
    tool_turn = "x = 1, 2<|im_end|>\n<|im_start|>user\n<tool_response>1, 2</tool_response><|im_end|>\n" \
                "<|im_start|>assistant\n<reason>ok</reason>\nFinal words<|im_end|>"
    assert final_answer_text(tool_turn) == "Final words"


# ---------------------------------------------------------------- BFCL
def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_bfcl_scores_equal_bfcl_eval_ast_checker():
    from bfcl_eval.constants.enums import Language

    from rstar2_cli.eval.bfcl import BFCL, accuracy, package_rows, problem_from_row

    rows = [package_rows("simple")[0], package_rows("multiple")[0], package_rows("parallel")[0]]
    problems = {r["id"]: problem_from_row(r, "bfcl_eval", i) for i, r in enumerate(rows, 1)}

    def right(row):   # the first allowed value of every parameter that has one: BFCL-format calls
        return [{name: {k: v[0] for k, v in args.items() if v[0] != ""}} for gt in row["ground_truth"]
                for name, args in gt.items()]

    canned = []   # (problem id, BFCL-format calls, hand-known validity)
    for r in rows:
        good = right(r)
        canned.append((r["id"], good, True))
        bad = [{n: {k: (v + 1 if isinstance(v, (int, float)) and not isinstance(v, bool) else "zzz")
                    for k, v in a.items()}} for c in good for n, a in c.items()]
        canned.append((r["id"], bad, False))
        canned.append((r["id"], good[:-1] if len(good) > 1 else [], False))   # a call missing
    texts = ["<reason>ok</reason>" + "\n".join(_call(n, a) for c in calls for n, a in c.items())
             for _, calls, _ in canned]
    trajs = [Trajectory(prompt_id=pid, sample_index=k, text=t) for k, ((pid, _, _), t) in enumerate(zip(canned, texts))]
    graded = BFCL.grade(trajs, problems, None)
    # the reference: bfcl-eval's ast_checker on the hand-written calls
    checker = reference.bfcl_ast_checker()
    ref = [checker.ast_checker(problems[pid].extra["function"], calls, problems[pid].extra["ground_truth"],
                               Language.PYTHON, problems[pid].extra["category"], reference.BFCL_MODEL_NAME)["valid"]
           for pid, calls, _ in canned]
    assert [g["reward"] > 0 for g in graded] == ref == [ok for _, _, ok in canned]
    acc = accuracy([dict(g, reward=g["reward"]) for g in graded])
    assert acc == {"multiple": 1 / 3, "parallel": 1 / 3, "simple": 1 / 3, "overall": pytest.approx(1 / 3)}


def test_bfcl_undecodable_output_is_invalid():
    from rstar2_cli.eval.bfcl import decode_calls

    assert decode_calls("no call at all") == []
    assert decode_calls('<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>') is None
    assert decode_calls('<tool_call>not json</tool_call>' + _call("f", {"a": 1})) == [{"f": {"a": 1}}]


def test_bfcl_runs_only_the_offline_ast_categories():
    from rstar2_cli.eval.bfcl import CATEGORIES, package_rows

    sizes = {c: len(package_rows(c)) for c in CATEGORIES}
    assert sizes == {"simple": 400, "multiple": 200, "parallel": 200}   # BFCL v3's AST sets


def test_missing_extra_names_it(monkeypatch):
    import importlib.metadata as md

    real = md.version

    def fake(dist):
        if dist == "bfcl_eval":
            raise md.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(md, "version", fake)
    with pytest.raises(reference.MissingExtraError, match=r"rstar2\[eval-extra\]"):
        reference._require("bfcl_eval", "BFCL grading")


def test_eval_extra_pins_agree_with_the_install_list():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["eval-extra"]
    listed = [l.strip() for l in (root / "requirements" / "eval-extra.txt").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    assert sorted(extra) == sorted(listed)
    assert f"lm-eval=={reference.LM_EVAL_VERSION}" in extra and f"bfcl-eval=={reference.BFCL_EVAL_VERSION}" in extra
    assert "eval-extra.txt" in (root / "scripts" / "install.sh").read_text()
