"""Every (prediction, gold, verdict) row of grading_cases.tsv, graded the way the trainer does.

A wrong verdict here is a wrong RL training signal, so every row must come out exactly right.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_cli.data.problems import PACKAGED_SETS_DIR
from rstar2_cli.reward import grade_batch

CASES = Path(__file__).with_name("grading_cases.tsv")


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for n, line in enumerate(CASES.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        assert len(fields) == 3, f"{CASES.name}:{n}: expected 3 tab-separated fields, got {len(fields)}"
        rows.append((fields[0], fields[1], fields[2]))
    return rows


ROWS = _rows()


def test_table_is_large_and_covers_both_verdicts():
    verdicts = [v for _, _, v in ROWS]
    assert len(ROWS) >= 200
    assert verdicts.count("correct") >= 80 and verdicts.count("wrong") >= 60


def test_every_table_row_gets_its_expected_verdict():
    pairs = [(f"Some reasoning.\n<answer>The answer is \\boxed{{{p}}}.</answer>", g) for p, g, _ in ROWS]
    results = grade_batch(pairs, timeout=10.0)
    mismatches = [
        f"{p!r} vs gold {g!r}: expected {want}, got {r.reason}"
        for (p, g, want), r in zip(ROWS, results, strict=True)
        if r.reason != want
    ]
    assert not mismatches, "\n".join(mismatches)
    for (p, _, want), r in zip(ROWS, results):
        assert r.reward == (1.0 if want == "correct" else 0.0)
        assert r.extracted == p.strip()


def _answers(path: Path) -> list[str]:
    return [json.loads(line)["answer"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_real_gold_answers_match_themselves_and_not_their_neighbours():
    """HMMT 2025 + a MATH-500 slice: each gold answer is correct for itself, wrong for the next one."""
    golds = _answers(PACKAGED_SETS_DIR / "hmmt25.jsonl") + _answers(PACKAGED_SETS_DIR / "math500.jsonl")[:60]
    golds = list(dict.fromkeys(golds))  # distinct, in order
    pairs = [(f"<answer>\\boxed{{{g}}}</answer>", g) for g in golds]
    pairs += [(f"<answer>\\boxed{{{golds[i + 1]}}}</answer>", golds[i]) for i in range(len(golds) - 1)]
    results = grade_batch(pairs, timeout=10.0)
    n = len(golds)
    assert [r.reason for r in results[:n]] == ["correct"] * n, [
        (g, r.reason) for g, r in zip(golds, results) if r.reason != "correct"
    ]
    wrongly_correct = [(golds[i + 1], golds[i]) for i, r in enumerate(results[n:]) if r.reward != 0.0]
    assert not wrongly_correct


@pytest.mark.parametrize(
    ("response", "gold", "mode", "on_conflict", "reason", "extracted"),
    [
        ("I think it is 42.", "42", "strict_answer_tag", "last", "no_answer", None),
        ("<answer>42</answer>", "42", "strict_answer_tag", "last", "no_boxed", None),
        ("<answer>\\boxed{}</answer>", "42", "strict_answer_tag", "last", "empty_boxed", None),
        ("<answer>\\boxed{  }</answer>", "42", "strict_answer_tag", "last", "empty_boxed", None),
        ("<answer>\\boxed{42</answer>", "42", "strict_answer_tag", "last", "unbalanced_braces", None),
        (
            "<answer>\\boxed{41}</answer> wait <answer>\\boxed{42}</answer>",
            "42",
            "strict_answer_tag",
            "last",
            "correct",
            "42",
        ),
        (
            "<answer>\\boxed{42}</answer> wait <answer>\\boxed{41}</answer>",
            "42",
            "strict_answer_tag",
            "last",
            "wrong",
            "41",
        ),
        ("<answer>\\boxed{41} or \\boxed{42}</answer>", "42", "strict_answer_tag", "last", "correct", "42"),
        ("<answer>\\boxed{41} or \\boxed{42}</answer>", "42", "strict_answer_tag", "reject", "multiple_answers", None),
        (
            "<answer>\\boxed{41}</answer><answer>\\boxed{42}</answer>",
            "42",
            "strict_answer_tag",
            "reject",
            "multiple_answers",
            None,
        ),
        ("<answer>\\boxed{42}, i.e. \\boxed{ 42 }</answer>", "42", "strict_answer_tag", "reject", "correct", "42"),
        ("<answer>\\fbox{42}</answer>", "42", "strict_answer_tag", "last", "correct", "42"),
        ("<answer>\\boxed {42}</answer>", "42", "strict_answer_tag", "last", "correct", "42"),
        ("<answer>$\\boxed{\\boxed{42}}$</answer>", "42", "strict_answer_tag", "last", "correct", "\\boxed{42}"),
        ("\\boxed{42} <answer>forty-two</answer>", "42", "strict_answer_tag", "last", "no_boxed", None),
        ("<answer>\\boxed{42}", "42", "strict_answer_tag", "last", "correct", "42"),  # cut before </answer>
        ("<answer>\\boxed{\\{1,2\\}}</answer>", "\\{1,2\\}", "strict_answer_tag", "last", "correct", "\\{1,2\\}"),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac12", "strict_answer_tag", "last", "correct", "\\frac{1}{2}"),
        # outcome (the default, the release's reading): tags never gate the reward
        ("Thus the result is \\boxed{70}.", "70", "outcome", "last", "correct", "70"),
        ("<answer>\\boxed{70}</answer>", "70", "outcome", "last", "correct", "70"),
        ("<answer>\\boxed{41}</answer> wait <answer>\\boxed{42}</answer>", "42", "outcome", "last", "correct", "42"),
        ("<answer>\\boxed{41} or \\boxed{42}</answer>", "42", "outcome", "last", "correct", "42"),
        ("<answer>\\boxed{42}</answer> then \\boxed{41}", "42", "outcome", "last", "correct", "42"),
        ("\\boxed{41} then \\boxed{42} <answer>forty-two</answer>", "42", "outcome", "last", "correct", "42"),
        ("Step \\boxed{41}. Finally \\boxed{42}", "42", "outcome", "reject", "multiple_answers", None),
        ("<answer>\\boxed{42}</answer><answer>\\boxed{41}</answer>", "42", "outcome", "last", "wrong", "41"),
        ("Finally \\boxed{4", "4", "outcome", "last", "unbalanced_braces", None),
        # no box at all: math-verify over the response text (graded in the pool)
        ("So the answer is $\\frac{1}{2}$.", "0.5", "outcome", "last", "correct", None),
        ("<answer>The answer is $42$</answer>", "42", "outcome", "last", "correct", None),
        ("The answer is $41$.", "42", "outcome", "last", "wrong", None),
        ("I do not know.", "42", "outcome", "last", "no_boxed", None),
        ("Step: \\boxed{41}. Finally \\boxed{42}", "42", "last_boxed", "last", "correct", "42"),
        ("Step: \\boxed{41}. Finally \\boxed{42}", "42", "last_boxed", "reject", "multiple_answers", None),
        ("Finally 42", "42", "last_boxed", "last", "no_boxed", None),
        ("<answer>\\boxed{42}</answer>", "42", "last_boxed", "last", "correct", "42"),
        ("Finally \\boxed{4", "4", "last_boxed", "last", "unbalanced_braces", None),
    ],
)
def test_extraction_rules(response, gold, mode, on_conflict, reason, extracted):
    (result,) = grade_batch([(response, gold)], mode=mode, timeout=10.0, on_conflict=on_conflict)
    assert (result.reason, result.extracted) == (reason, extracted)
    assert result.reward == (1.0 if reason == "correct" else 0.0)
