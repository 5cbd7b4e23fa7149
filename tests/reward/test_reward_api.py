"""The public contract the RL trainer and `rstar2 eval` rely on: types, order, argument checks."""
from __future__ import annotations

import pytest

from rstar2_cli.reward import REASONS, GradeResult, extract_answer, grade, grade_batch
from rstar2_cli.reward.verify import fast_verdict, integer_gold


def test_grade_returns_a_binary_reward_with_reason():
    good = grade("<answer>\\boxed{\\frac{3}{6}}</answer>", "\\frac{1}{2}")
    assert good == GradeResult(1.0, "\\frac{3}{6}", "correct")
    bad = grade("<answer>\\boxed{7}</answer>", "8")
    assert bad == GradeResult(0.0, "7", "wrong")


def test_grade_batch_keeps_input_order_across_fast_and_pool_paths():
    golds = [str(i) if i % 2 else f"\\frac{{{i}}}{{7}}" for i in range(40)]
    pairs = [(f"<answer>\\boxed{{{g}}}</answer>", g) for g in golds]
    pairs[5] = ("<answer>\\boxed{6}</answer>", "5")
    pairs[6] = ("<answer>\\boxed{\\frac{7}{7}}</answer>", "\\frac{6}{7}")
    results = grade_batch(pairs)
    assert [r.extracted for r in results] == [extract_answer(p).answer for p, _ in pairs]
    assert [i for i, r in enumerate(results) if r.reward == 0.0] == [5, 6]
    assert grade_batch([]) == []


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="mode"):
        grade("x", "1", mode="boxed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        grade_batch([("x", "1")], timeout=0)
    with pytest.raises(ValueError, match="on_conflict"):
        grade("x", "1", on_conflict="first")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pairs\[0\]"):
        grade_batch([("x", 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="reward"):
        GradeResult(1.0, "3", "wrong")
    with pytest.raises(ValueError, match="reason"):
        GradeResult(0.0, None, "nope")  # type: ignore[arg-type]


def test_integer_fast_path_is_strict_and_defers_what_it_cannot_settle():
    assert integer_gold("10,\\!080") == 10080 and integer_gold("\\frac{1}{2}") is None
    assert fast_verdict("\\$1{,}000.00 \\text{ dollars}", "1000") is True
    assert fast_verdict("1000.5", "1000") is False and fast_verdict("-3", "3") is False
    assert fast_verdict("10^3", "1000") is None  # symbolic: goes to the pool
    assert fast_verdict("1" * 300, "1") is None  # too long for the no-hang fast path
    assert fast_verdict("\\dfrac{1}{2}", "\\frac{1}{2}") is True
    assert fast_verdict("\\frac{2}{4}", "\\frac{1}{2}") is None  # never "wrong" for non-integer gold


def test_reasons_are_the_documented_set():
    assert {"correct", "wrong", "no_answer", "no_boxed", "multiple_answers", "unbalanced_braces",
            "empty_boxed", "timeout", "grader_crash", "parse_error"} <= set(REASONS)


def test_workers_argument_resizes_the_shared_pool():
    from rstar2_cli.reward.grader import shared_pool

    pairs = [("<answer>\\boxed{\\sqrt{4}}</answer>", "2")]
    assert [r.reason for r in grade_batch(pairs, workers=1)] == ["correct"]
    assert shared_pool().workers.size == 1
    assert [r.reason for r in grade_batch(pairs, workers=2)] == ["correct"]
    assert shared_pool().workers.size == 2
