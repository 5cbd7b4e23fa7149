"""Detectors for reference answers that are wrong by construction, by class of error.

A wrong reference answer is worse than a missing problem in RL: the policy is rewarded for
reproducing the error. Two error classes occur in DAPO-Math-17k (tests/data/fixtures/README.md names
rows of each):

* float round-trip corruption: a large integer passed through a float64 and back
  (`int(float("105263157894736842"))` == 105263157894736848), and
* placeholder answers: `-1` (any negative) where the text says the answer is a count or a
  sum of positive integers.

Rules here look at the value and the problem text only, never at row ids.
"""
from __future__ import annotations

import re

FLOAT_EXACT_LIMIT = 2**53  # every integer up to here is exactly representable: no artefact possible
MIN_ODD_PART_BITS = 32     # see is_float_artifact: exempts 2**k, 3*2**k... which are real answers


def _significant_digits(decimal: str) -> str:
    return decimal.lstrip("-+").lstrip("0").rstrip("0")


def is_float_artifact(answer: str) -> bool:
    """True if an integer answer looks like a decimal that went through float64 and back.

    Rule: |n| > 2**53, n is exactly a double (`int(float(n)) == n`), its decimal form has MORE
    significant digits than the shortest decimal that round-trips to the same double
    (`repr(float(n))`), and its odd part has >= 32 bits. Such a number is what you get printing
    `int(x)` for a float x that was parsed from a shorter (intended) decimal:
    105263157894736848 == int(1.0526315789473685e17), 22099999999999998951424 == int(2.21e22).
    Round numbers such as 2*10**22 are exact doubles whose shortest form is as short -> kept.

    False-positive risk: a genuine integer above 2**53 is an exact double with probability about
    2**(53 - bits); such values (e.g. a real 18-digit answer with the right low zero bits) would
    be flagged. Powers of two times a small odd factor (2**60, 3*2**70) are exempted by the
    odd-part test; anything else that is exactly a double is rare in competition answers.
    """
    text = answer.strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        return False
    n = int(text)
    if abs(n) <= FLOAT_EXACT_LIMIT or int(float(n)) != n:
        return False
    odd = abs(n)
    while odd % 2 == 0:
        odd //= 2
    if odd.bit_length() < MIN_ODD_PART_BITS:
        return False
    shortest = repr(float(n)).split("e")[0].replace(".", "")
    return len(_significant_digits(text)) > len(_significant_digits(shortest))


# Phrases saying the asked quantity is a count or a positive integer.
_COUNT_OR_POSITIVE = re.compile(
    r"\bhow many\b"
    r"|\b(?:find|compute|determine|what is|give|calculate) the (?:total )?number of\b"
    r"|\b(?:smallest|least|largest|greatest|minimum|maximum) (?:possible )?positive integer\b"
    r"|(?:有多少|多少个|多少种|的个数|种数)",
    re.I,
)
# "... where m and n are (relatively prime) positive integers. Find m + n." -> m + n > 0.
_ARE_POSITIVE = re.compile(
    r"\b(?:are|be)\s+(?:(?:pairwise |mutually )?(?:relatively prime|coprime)\s+)?positive\s+"
    r"(?:integers|numbers)"
)
_CLAUSE_START = re.compile(r"(?:\bwhere\b|\bwith\b|\bsuch that\b|\bif\b|[.;:])", re.I)
_REQUESTED_SUM = re.compile(
    r"(?:find|compute|what is|determine|give|evaluate|provide)\s+(?:the value of\s+)?\$?"
    r"\s*((?:[a-zA-Z]\s*\+\s*)+[a-zA-Z])\s*\.?\$?",
    re.I,
)
# "The length/area/probability ... is (given by|written as) $m\sqrt{n}$" -> form without minus.
_NONNEGATIVE_QUANTITY_FORM = re.compile(
    r"\b(?:length|area|volume|perimeter|distance|probability|radius)\b[^.]{0,200}?"
    r"(?:is|as|by|equals)\s*\$([^$]{1,60})\$",
    re.I,
)


def _letters(expr: str) -> set[str]:
    return set(re.findall(r"(?<![\\a-zA-Z])[a-zA-Z](?![a-zA-Z])", expr))


def is_positive_placeholder(problem: str, answer: str) -> bool:
    """True for a negative answer to a problem whose text says the answer is positive.

    Flags when the answer is negative and the text (a) asks "how many" / "the number of" /
    "the smallest positive integer" (count cues, English and Chinese), or (b) asks for a sum of
    variables all declared "positive integers" ("m and n are relatively prime positive
    integers. Find m+n"), or (c) asks for a sum of the variables of a minus-free form that
    gives a length/area/probability ("the length ... is given by $m\\sqrt{n}$ ... Find m+n").
    Genuine negative answers ("find the minimum value", "compute b - c") match none of these.
    """
    text = answer.strip()
    if not re.fullmatch(r"-\d+", text) or int(text) == 0:
        return False
    if _COUNT_OR_POSITIVE.search(problem):
        return True
    requested = [_letters(m.group(1)) for m in _REQUESTED_SUM.finditer(problem)]
    if not requested:
        return False
    wanted = requested[-1]
    positive: set[str] = set()
    for m in _ARE_POSITIVE.finditer(problem):
        window = problem[max(0, m.start() - 80):m.start()]
        starts = [c.end() for c in _CLAUSE_START.finditer(window)]
        positive |= _letters(window[starts[-1]:] if starts else window)
    if wanted and wanted <= positive:
        return True
    for m in _NONNEGATIVE_QUANTITY_FORM.finditer(problem):
        form = m.group(1)
        if "-" not in form and wanted and wanted <= _letters(form):
            return True
    return False
