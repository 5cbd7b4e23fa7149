"""GPQA and IFEval scores on canned responses (tests/eval/fixtures/) equal the reference
packages' own scores (BFCL: test_eval_reference_bfcl.py).

Each test grades the canned outputs through `rstar2 eval`'s family (what a run writes), and
separately runs the reference package's own pipeline on the same outputs: lm-eval's GPQA filter
ensemble built from its task yaml and its exact_match, lm-eval's IFEval `process_results` and
aggregations. Hand-known verdicts are asserted too, so a grader that silently failed everything
would not pass.
"""
from __future__ import annotations

import pytest

from rstar2_cli.eval import reference
from rstar2_cli.rollout.trajectory import Trajectory
from reference_fixtures import gpqa_cases, read_jsonl


def test_installed_reference_versions_are_the_pinned_ones():
    v = reference.versions()
    assert v["lm_eval"] == reference.LM_EVAL_VERSION and v["bfcl_eval"] == reference.BFCL_EVAL_VERSION
    assert reference.punkt_tab_dir() is not None


# ---------------------------------------------------------------- GPQA
def test_gpqa_permutation_is_fixed_per_question_and_recorded():
    from rstar2_cli.eval.gpqa import choice_permutation, problem_from_row

    row = read_jsonl("gpqa_rows.jsonl")[0]
    p = problem_from_row(row, "f", 1)
    assert p.extra["permutation"] == choice_permutation(row["Record ID"]) == choice_permutation(row["Record ID"])
    assert sorted(p.extra["permutation"]) == [0, 1, 2, 3]
    assert p.extra["choices"][ord(p.answer[1]) - 65] == row["Correct Answer"]
    assert f"({p.answer[1]}) {row['Correct Answer']}" in p.problem
    assert {tuple(choice_permutation(f"q{i}")) for i in range(40)} != {tuple(choice_permutation("q0"))}


def lm_eval_gpqa(problems, trajs, finals) -> list[float]:
    """lm-eval's own GPQA pipeline on each final turn: the task yaml's "flexible-extract" filter
    ensemble (built by lm_eval.filters.build_filter_ensemble from the installed yaml) on
    Instances, then the yaml's exact_match settings."""
    import importlib.util
    import sys
    from pathlib import Path

    import yaml
    from lm_eval.api.instance import Instance

    reference.multi_choice_filter_class()     # lm_eval.filters is registered as a bare namespace;
    root = Path(list(importlib.util.find_spec("lm_eval").submodule_search_locations)[0])
    filters = sys.modules["lm_eval.filters"]   # run its own __init__ in it for build_filter_ensemble
    if not hasattr(filters, "build_filter_ensemble"):
        spec = importlib.util.spec_from_file_location("lm_eval.filters", root / "filters" / "__init__.py")
        spec.loader.exec_module(filters)
    build_filter_ensemble = filters.build_filter_ensemble

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, tag, node: None)   # `!function utils.process_docs`
    task_yaml = root / "tasks/gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml"
    config = yaml.load(task_yaml.read_text(), Loader=Loader)
    spec = next(f for f in config["filter_list"] if f["name"] == "flexible-extract")
    ensemble = build_filter_ensemble(spec["name"], [[f["function"], {k: v for k, v in f.items() if k != "function"}]
                                                    for f in spec["filter"]])
    instances = []
    for i, (t, final) in enumerate(zip(trajs, finals)):
        inst = Instance("generate_until", {"choices": problems[t.prompt_id].extra["choices"]}, ("", {}), i)
        inst.resps = [final]
        instances.append(inst)
    ensemble.apply(instances)
    metric = next(m for m in config["metric_list"] if m["metric"] == "exact_match")
    match_args = {k: metric[k] for k in ("ignore_case", "ignore_punctuation")}
    exact_match = reference.lm_eval_exact_match()
    return [float(exact_match(predictions=[inst.filtered_resps["flexible-extract"]],
                              references=[problems[t.prompt_id].answer], **match_args)["exact_match"])
            for inst, t in zip(instances, trajs)]


def test_gpqa_scores_equal_lm_eval_over_the_final_turn():
    from rstar2_cli.eval.gpqa import GPQA

    problems, trajs, finals, kinds = gpqa_cases()
    ours = GPQA.grade(trajs, problems, None)
    assert [g["reward"] for g in ours] == lm_eval_gpqa(problems, trajs, finals)
    assert all(g["permutation"] == problems[t.prompt_id].extra["permutation"] for g, t in zip(ours, trajs))
    by_kind = {k: g for k, g in zip(kinds, ours)}     # hand-known cases, the last question's
    assert by_kind["tentative_box_then_plain"]["reward"] == 1.0          # the final "(X)" counts, not an earlier box
    assert by_kind["boxed_bare"]["reward"] == 0.0 and by_kind["boxed_bare"]["extracted"] == "[invalid]"
    assert by_kind["choice_text"]["reward"] == 1.0 and by_kind["colon_letter"]["reward"] == 1.0
    assert by_kind["tool_turn_then_answer"]["reward"] == 0.0              # only the final turn is read


def test_gpqa_boxed_is_a_second_named_column():
    from rstar2_cli.eval.gpqa import GPQA

    problems, trajs, _, kinds = gpqa_cases()
    ours = GPQA.grade(trajs, problems, None)
    boxed = {k: g["gpqa_boxed"] for k, g in zip(kinds, ours)}
    assert boxed["boxed_bare"] == boxed["boxed_text"] == boxed["boxed_option"] == boxed["boxed_paren"] == 1.0
    assert boxed["tentative_box_then_plain"] == 1.0 and boxed["wrong_text_boxed"] == 0.0
    m = GPQA.metrics(ours)["gpqa"]
    assert m["lm_eval"] == sum(g["reward"] for g in ours) / len(ours) != m["gpqa_boxed"]


# ---------------------------------------------------------------- IFEval
def _ifeval_cases():
    from rstar2_cli.eval.ifeval import problem_from_row

    rows = read_jsonl("ifeval_rows.jsonl")
    problems = {p.id: p for p in (problem_from_row(r, "ifeval_rows.jsonl", i) for i, r in enumerate(rows, 1))}
    responses = read_jsonl("ifeval_responses.jsonl")
    trajs = [Trajectory(prompt_id=str(r["key"]), sample_index=k, text=r["text"]) for k, r in enumerate(responses)]
    return problems, {str(r["key"]): r for r in rows}, responses, trajs


def test_ifeval_scores_equal_lm_eval_process_results():
    import random

    from rstar2_cli.eval.ifeval import IFEVAL, RANDOM_SEED

    problems, docs, responses, trajs = _ifeval_cases()
    graded = IFEVAL.grade(trajs, problems, None)
    ours = IFEVAL.metrics([dict(g) for g in graded])["ifeval"]
    # the reference: lm-eval's process_results on each answer (random seeded as lm-eval's
    # evaluator seeds it) and its aggregations (ifeval.yaml)
    mod = reference.ifeval()
    results = []
    for r in responses:
        random.seed(RANDOM_SEED)
        results.append(mod.process_results(docs[str(r["key"])], [r["answer"]]))
    assert [bool(g["reward"]) for g in graded] == [r["prompt_level_strict_acc"] for r in results]
    assert ours["prompt_level_strict_acc"] == sum(r["prompt_level_strict_acc"] for r in results) / len(results)
    assert ours["prompt_level_loose_acc"] == sum(r["prompt_level_loose_acc"] for r in results) / len(results)
    assert ours["inst_level_strict_acc"] == mod.agg_inst_level_acc([r["inst_level_strict_acc"] for r in results])
    assert ours["inst_level_loose_acc"] == mod.agg_inst_level_acc([r["inst_level_loose_acc"] for r in results])
    hand = {("1", 0): True, ("1", 1): False, ("2", 0): True, ("2", 1): False, ("3", 0): True, ("3", 1): False,
            ("6", 0): True, ("6", 1): False}
    pos = {}
    for r, g in zip(responses, graded):
        key = (str(r["key"]), pos.setdefault(str(r["key"]), 0))
        pos[str(r["key"])] += 1
        if key in hand:
            assert bool(g["reward"]) == hand[key], key


def test_ifeval_letter_frequency_verdicts_do_not_change_between_runs():
    """The letter "#" or "!" makes lm-eval's checker draw a random letter: verdicts must not
    depend on the process's random state (unseeded, they do: checked below)."""
    import random

    from rstar2_cli.eval.ifeval import IFEVAL

    problems, docs, responses, trajs = _ifeval_cases()
    drawn = [t for t in trajs if t.prompt_id in ("4", "5")]
    runs = set()
    for state in range(12):
        random.seed(state)
        runs.add(tuple(g["reward"] for g in IFEVAL.grade(drawn, problems, None)))
    assert len(runs) == 1
    unseeded = set()
    for state in range(12):
        random.seed(state)
        unseeded.add(
            tuple(
                reference.ifeval().process_results(docs[t.prompt_id], [r["answer"]])["prompt_level_strict_acc"]
                for t, r in zip(trajs, responses)
                if t.prompt_id in ("4", "5")
            )
        )
    assert len(unseeded) > 1     # the reference alone varies with the random state


def test_ifeval_grades_the_answer_not_the_reasoning():
    from rstar2_cli.eval.family import final_answer_text

    text = "a, b, c</reason> <answer>no commas here</answer><|im_end|>"
    assert final_answer_text(text) == "no commas here"
    tool_turn = "x = 1, 2<|im_end|>\n<|im_start|>user\n<tool_response>1, 2</tool_response><|im_end|>\n" \
                "<|im_start|>assistant\n<reason>ok</reason>\nFinal words<|im_end|>"
    assert final_answer_text(tool_turn) == "Final words"


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
