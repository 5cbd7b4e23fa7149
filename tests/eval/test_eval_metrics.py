"""Eval metrics against hand-computed values, including pass@k edge cases."""
from __future__ import annotations

import math

import pytest

from rstar2_cli.eval.metrics import (
    SampleRecord, avg_at_k, maj_at_k, majority_answer, mean_pass_at_k, pass_at_k, per_problem_summary,
    summarize, usage_stats,
)


def rec(pid, i, reward, extracted=None, tokens=0, turns=0, calls=0, errors=0):
    return SampleRecord(pid, i, reward, extracted, tokens, turns, calls, errors)


# Problem A: samples 0..3 correct pattern 1,0,1,1 ; B: 0,0,0,1 ; C: 0,0,0,0
RECORDS = [
    rec("A", 0, 1, "5", 100, 2, 1, 0), rec("A", 1, 0, "4", 200, 3, 2, 1),
    rec("A", 2, 1, "5", 300, 2, 1, 0), rec("A", 3, 1, "5", 400, 1, 0, 0),
    rec("B", 0, 0, "7", 50, 1, 1, 1), rec("B", 1, 0, "8", 50, 1, 1, 0),
    rec("B", 2, 0, "7", 50, 1, 1, 0), rec("B", 3, 1, "9", 50, 1, 1, 0),
    rec("C", 0, 0, None, 10, 1, 0, 0), rec("C", 1, 0, "", 10, 1, 0, 0),
    rec("C", 2, 0, "3", 10, 1, 0, 0), rec("C", 3, 0, "2", 10, 1, 0, 0),
]


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0),            # c = 0
    (4, 4, 2, 1.0),            # c = n
    (4, 1, 4, 1.0),            # n = k, one correct
    (4, 0, 4, 0.0),            # n = k, none correct
    (4, 1, 1, 0.25),
    (4, 1, 2, 0.5),            # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 3, 0.9),            # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
])
def test_pass_at_k_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_with_fewer_samples_than_k_raises():
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 2, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_avg_at_k_and_std_across_sample_indices():
    avg, std = avg_at_k(RECORDS, 4)
    # per-index accuracies: idx0 1/3, idx1 0, idx2 1/3, idx3 2/3 -> mean 1/3
    per_index = [1 / 3, 0, 1 / 3, 2 / 3]
    assert avg == pytest.approx(1 / 3)
    assert std == pytest.approx(math.sqrt(sum((x - 1 / 3) ** 2 for x in per_index) / 4))
    assert avg_at_k(RECORDS, 1) == pytest.approx((1 / 3, 0.0))


def test_avg_at_k_requires_every_sample_index():
    with pytest.raises(ValueError, match="problem 'A' has no sample_index 1"):
        avg_at_k([rec("A", 0, 1), rec("A", 2, 1)], 2)


def test_mean_pass_at_k():
    assert mean_pass_at_k(RECORDS, 1) == pytest.approx((3 / 4 + 1 / 4 + 0) / 3)
    assert mean_pass_at_k(RECORDS, 2) == pytest.approx((1 + 0.5 + 0) / 3)  # A: 1-C(1,2)/C(4,2)=1


def test_maj_at_k_and_tie_break():
    # A: "5" x3 (correct); B: "7" x2 (wrong); C: no majority among "3","2" -> tie -> first ("3"), wrong
    assert maj_at_k(RECORDS, 4) == pytest.approx(1 / 3)
    # Tie "a" (index 1) vs "b" (index 0) -> "b" wins: earliest sample index, whatever the order given.
    tie = [rec("P", 1, 1, "a"), rec("P", 0, 0, "b"), rec("P", 2, 1, "a"), rec("P", 3, 0, "b")]
    assert majority_answer(tie).extracted == "b"
    assert majority_answer(list(reversed(tie))).extracted == "b"
    assert maj_at_k(tie, 4) == 0.0
    assert majority_answer([rec("P", 0, 0, None), rec("P", 1, 0, "")]) is None


def test_usage_and_per_problem_summary():
    usage = usage_stats(RECORDS)
    assert usage["response_tokens"] == {"mean": pytest.approx(1240 / 12), "median": 50.0}
    assert usage["turns"]["mean"] == pytest.approx(16 / 12)
    assert usage["tool_calls"] == {"mean": pytest.approx(8 / 12), "median": 1.0}
    assert usage["tool_error_rate"] == pytest.approx(2 / 8)
    assert usage_stats([rec("X", 0, 1)])["tool_error_rate"] == 0.0
    rows = per_problem_summary(RECORDS)
    assert [r["problem_id"] for r in rows] == ["A", "B", "C"]
    assert rows[0] == {"problem_id": "A", "samples": 4, "solved_fraction": 0.75, "mean_response_tokens": 250.0,
                       "mean_turns": 2.0, "mean_tool_calls": 1.0}


def test_summarize_from_dicts():
    rows = [{"problem_id": r.problem_id, "sample_index": r.sample_index, "reward": r.reward,
             "extracted": r.extracted, "response_tokens": r.response_tokens, "turns": r.turns,
             "tool_calls": r.tool_calls, "tool_errors": r.tool_errors} for r in RECORDS]
    out = summarize(rows, ks=(1, 4, 8))
    assert out["problems"] == 3 and out["samples_per_problem"] == 4
    assert out["avg@4"] == pytest.approx(1 / 3) and out["pass@4"] == pytest.approx(2 / 3)
    assert out["maj@4"] == pytest.approx(1 / 3) and "pass@8" not in out
    with pytest.raises(ValueError, match="missing field 'reward'"):
        summarize([{"problem_id": "a", "sample_index": 0}])
    with pytest.raises(ValueError, match="duplicate sample_index"):
        summarize([rec("a", 0, 1), rec("a", 0, 0)])
