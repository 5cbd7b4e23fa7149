"""Answer normalisation and the suspicious-answer detectors, on unit cases and the real DAPO rows."""
from __future__ import annotations

import pytest

from rstar2_cli.data.answer_checks import is_float_artifact, is_positive_placeholder
from rstar2_cli.data.math_text import is_integer_answer, normalize_answer
from rstar2_cli.data.problems import load_problems


@pytest.mark.parametrize("raw, norm", [
    ("$\\boxed{1{,}024}$", "1024"), ("1,234,567", "1234567"), (" 42.0 ", "42"), ("\\boxed{ -7 }", "-7"),
    ("007", "7"), ("-0", "0"), ("\\frac{1}{2}", "\\frac{1}{2}"), ("3.5", "3.5"), ("1,5", "1,5"),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_integer_filter():
    assert [is_integer_answer(normalize_answer(a)) for a in ["12", "$-3$", "2.0", "1/2", "\\sqrt{2}", "x=3"]] \
        == [True, True, True, False, False, False]


@pytest.mark.parametrize("answer, flagged", [
    ("105263157894736848", True),        # int(float(105263157894736842))
    ("22099999999999998951424", True),   # int(2.21e22)
    ("-105263157894736848", True),
    ("105263157894736842", False),       # the intended value is not a double
    ("20000000000000000000000", False),  # round: 2e22 is exact and short
    (str(2**60), False),                 # exact double but a power of two (real answers)
    (str(3 * 2**70), False),
    (str(2**53 - 1), False),             # below 2**53 nothing can be corrupted
    ("12345", False), ("1/2", False),
])
def test_float_artifact_unit_cases(answer, flagged):
    assert is_float_artifact(answer) is flagged


def test_float_artifact_flags_the_corrupted_dapo_rows(data_dir):
    rows = load_problems("dapo_math_17k", data_dir=data_dir, allow_hub=False)
    flagged = {p.id for p in rows if is_float_artifact(p.answer)}
    assert flagged == {"dapo-01000", "dapo-05195", "dapo-12110"}


@pytest.mark.parametrize("problem, answer, flagged", [
    ("How many subsets of {1,2,3} are there?", "-1", True),
    ("Find the number of ordered pairs (a,b) with a+b=5.", "-1", True),
    ("The probability is $m/n$, where $m$ and $n$ are relatively prime positive integers. Find $m+n$.",
     "-1", True),
    ("The area can be written as $p\\sqrt{q}-r$, where $p$, $q$, and $r$ are positive integers. Find $p+q+r$.",
     "-5", True),
    ("The length of the path is given by $m\\sqrt{n}$, where $m$ and $n$ are integers. Find $m+n$.",
     "-1", True),
    ("Find the minimum value of $x^2+2x$ over all real numbers $x$.", "-1", False),
    ("Let $n$ be the number of possible values of $f(5)$ and $s$ their sum. Find $n \\times s$.", "-3", False),
    ("The answer is $\\frac{m}{n}$ where $m$ and $n$ are coprime integers. Find $m+n$.", "-1", False),
    ("How many subsets of {1,2,3} are there?", "8", False),
])
def test_positive_placeholder_unit_cases(problem, answer, flagged):
    assert is_positive_placeholder(problem, answer) is flagged


def test_positive_placeholder_on_real_rows_flags_only_impossible_negatives(data_dir):
    rows = load_problems("dapo_math_17k", data_dir=data_dir, allow_hub=False)
    flagged = {p.id for p in rows if is_positive_placeholder(p.problem, p.answer)}
    assert flagged == {"dapo-05785", "dapo-05885"}     # not the sample's other negative answers
    genuine = {p.id: p for p in rows}["dapo-00081"]  # "Determine the value of A" = -1
    assert not is_positive_placeholder(genuine.problem, genuine.answer)
