"""Random and truncated responses through grade_batch: every item gets a valid verdict.

Policies emit arbitrary text, including cut-off LaTeX; the reward step must return a reward for
each of them (no exception, no hang) and keep working afterwards. They run in strict_answer_tag
mode (extraction and the boxed grader): 1,000 of them, every kind in proportion and the very long
inputs included, by default; the full 10,000 under `slow`. A slice of them also runs in the
default outcome mode, whose box-less responses go through math-verify over the whole text in the
pool.
"""
from __future__ import annotations

import json
import random
import string

import pytest

from rstar2_cli.data.problems import PACKAGED_SETS_DIR
from rstar2_cli.reward import REASONS, GraderPool

N_ITEMS = 10_000
N_FAST = 1_000
LATEX_TOKENS = [
    "\\frac{", "}{", "}", "{", "\\sqrt{", "^", "_", "\\pi", "\\cdot", "!", "\\left(", "\\right)", "(", ")",
    "[", "]", ",", "-", "+", "=", "x", "\\infty", "\\cup", "\\text{", "\\%", "\\$", "\\\\", "\\{", "\\}",
    "\\begin{pmatrix}", "\\end{pmatrix}", "&", "1", "2", "9", "10", "0.5", "\\pm", "\\circ", "\\boxed{",
    "<answer>", "</answer>", " ", "\n", "\\", "é", "∞",
]


def _random_text(rng: random.Random) -> str:
    alphabet = string.printable + "∑√π€\u0000\u2212"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))


def _token_soup(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(LATEX_TOKENS) for _ in range(rng.randint(1, n)))


def _truncated(rng: random.Random, text: str) -> str:
    cut = rng.randint(0, len(text))
    return text[:cut]


def _items(n: int = N_ITEMS) -> list[tuple[str, str]]:
    """`n` items: 35 % arbitrary text, 30 % cut solutions, 27 % number-like answers, the rest LaTeX
    soup in a box, then five very long inputs (the same items as ever at n = N_ITEMS)."""
    rng = random.Random(20250915)
    rows = [json.loads(line) for line in (PACKAGED_SETS_DIR / "math500.jsonl").read_text(encoding="utf-8").splitlines()]
    golds = [r["answer"] for r in rows]
    items: list[tuple[str, str]] = []
    for _ in range(n * 35 // 100):  # arbitrary text, occasionally with tags: extraction only
        text = _random_text(rng)
        if rng.random() < 0.3:
            text = f"{text}<answer>{_random_text(rng)}"
        items.append((text, rng.choice(golds)))
    for _ in range(n * 30 // 100):  # real solutions and answers cut at a random point
        row = rng.choice(rows)
        full = f"{row['solution']}\n<answer>\\boxed{{{row['answer']}}}</answer>"
        items.append((_truncated(rng, full), row["answer"]))
    for _ in range(n * 27 // 100):  # number-like answers against integer golds: the fast path
        answer = rng.choice([str(rng.randint(-10**6, 10**6)), f"{rng.randint(0, 999)},{rng.randint(100, 999)}",
                             f"{rng.random() * 100:.3f}", f"\\text{{{rng.randint(0, 99)}}}", _token_soup(rng, 3)])
        items.append((f"<answer>\\boxed{{{answer}}}</answer>", str(rng.randint(0, 999))))
    for _ in range(n - len(items) - 5):  # random or truncated LaTeX inside a box: the pool
        soup = _token_soup(rng, 12) if rng.random() < 0.5 else _truncated(rng, rng.choice(golds))
        items.append((f"<answer>\\boxed{{{soup}}}</answer>", rng.choice(golds)))
    items += [  # very long inputs: extraction must stay linear
        ("\\boxed{" * 20_000, "1"),
        ("<answer>" * 20_000, "1"),
        ("<answer>\\boxed{" + "{" * 50_000 + "}" * 50_000 + "}</answer>", "1"),
        ("\\" * 100_001, "1"),
        ("<answer>\\boxed{" + "1" * 100_000 + "}</answer>", "1"),
    ]
    return items


# (items, per-item timeout): the nested-brace input runs into the timeout, which bounds the fast run
@pytest.mark.parametrize("n, timeout", [(N_FAST, 1.0), pytest.param(N_ITEMS, 3.0, marks=pytest.mark.slow)])
def test_hostile_responses_all_get_a_valid_verdict(n: int, timeout: float):
    items = _items(n)
    assert len(items) == n
    with GraderPool(workers=2) as pool:
        results = pool.grade_batch(items, timeout=timeout, mode="strict_answer_tag")
        assert len(results) == n
        for r in results:
            assert r.reason in REASONS
            assert r.reward == (1.0 if r.reason == "correct" else 0.0)
        reasons = {r.reason for r in results}
        assert {"no_answer", "unbalanced_braces", "correct", "wrong"} <= reasons
        assert pool.grade("<answer>\\boxed{0.5}</answer>", "\\frac{1}{2}").reason == "correct"


def test_hostile_box_less_responses_get_a_verdict_in_outcome_mode():
    items = _items()
    sample = items[:30] + items[3500:3510] + items[-2:-1]   # random text, cut solutions, a very long one
    with GraderPool(workers=2) as pool:
        results = pool.grade_batch(sample, timeout=2.0)
        assert len(results) == len(sample)
        assert all(r.reason in REASONS and r.reward == (1.0 if r.reason == "correct" else 0.0) for r in results)
        assert "no_answer" not in {r.reason for r in results}   # tags never gate the outcome reward
        assert pool.grade("The answer is $\\frac{1}{2}$.", "0.5").reason == "correct"
