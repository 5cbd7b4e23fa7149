"""reward/extract.py `matching_braces` (the grader's brace matching, on every response) pairs the
same braces as the character-by-character scan it replaces, on random texts dense in braces and
backslashes (escapes of every kind, a trailing backslash, unbalanced braces)."""
from __future__ import annotations

import random

from rstar2_cli.reward.extract import boxed_contents, matching_braces


def scan_reference(text: str) -> dict[int, int]:
    """The specification, one character at a time: a backslash skips the character after it."""
    match: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "{":
            stack.append(i)
        elif text[i] == "}" and stack:
            match[stack.pop()] = i
        i += 1
    return match


def test_matching_braces_equals_the_character_scan_on_random_texts():
    rng = random.Random(0)
    alphabet = ["{", "}", "\\", "a", " ", "\n", "\\boxed{", "é", "\\\\", "\\{", "\\}"]
    cases = ["", "\\", "{", "}", "\\{}", "{\\}", "{\\\\}", "\\\\{}", "a{b{c}d}e}", "{{{", "}}}"]
    cases += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80))) for _ in range(5000)]
    for text in cases:
        assert matching_braces(text) == scan_reference(text), repr(text)


def test_boxes_read_through_escapes_and_nesting():
    text = r"so \boxed{\frac{1}{2} \{x\}} and \\boxed{3} then \boxed{\boxed{4}}"
    assert [b.content for b in boxed_contents(text)] == [r"\frac{1}{2} \{x\}", r"\boxed{4}"]
