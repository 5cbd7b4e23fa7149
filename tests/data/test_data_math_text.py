"""Problem-text cleaning: embedded answer-format instructions, escape damage, normalisation."""
from __future__ import annotations

from rstar2_cli.data.math_text import normalize_problem_text, strip_format_instructions, word_tokens
from rstar2_cli.data.problems import load_problems


def test_strips_dapo_english_template_but_keeps_answer_form_hints():
    raw = ("Solve the following math problem step by step. The last line of your response should be of the "
           "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
           "Find $x$. The answer is in the form \\frac{m}{n}. Please provide m + n.\n\n"
           "Remember to put your answer on its own line after \"Answer:\"")
    assert strip_format_instructions(raw) == "Find $x$. The answer is in the form \\frac{m}{n}. Please provide m + n."


def test_strips_chinese_instruction_from_real_rows(data_dir):
    rows = {p.id: p for p in load_problems("dapo_math_17k", data_dir=data_dir, allow_hub=False)}
    raw = rows["dapo-05546"].problem
    assert "让我们一步一步地思考" in raw
    cleaned = strip_format_instructions(raw)
    assert cleaned.endswith("k+1 的倍数？") and "Answer" not in cleaned
    assert sum("Answer:" in strip_format_instructions(p.problem) for p in rows.values()) == 0


def test_repairs_form_feed_frac_and_tab_escapes():
    assert strip_format_instructions("form \x0crac{m}{n}, a \times b, \x0cnd x") == \
        "form \\frac{m}{n}, a \\times b, find x"


def test_normalization_merges_formatting_variants():
    a = "Let $x = \\dfrac{1}{2}$ and \\left( y \\right),  find   $x+y$."
    b = "let x = \\frac{1}{2} and ( y ), find x+y."
    assert normalize_problem_text(a) == normalize_problem_text(b)
    assert word_tokens("求 $x$ 的值") == ["求", "x", "的", "值"]
