"""Decide whether an extracted answer equals the gold answer.

Two tiers, because most RL gold answers (AIME, DAPO-Math) are integers and grading them through
sympy would make the reward step the bottleneck:

* `fast_verdict` (in-process, cannot hang): when the gold answer is an integer literal and the
  prediction normalises to a plain decimal literal, compare exactly. Normalisation only strips
  decoration that cannot change the value: `\\$`, `\\text{}`/`\\mathbf{}` wrappers, thousands
  commas in groups of three (`1,000`, `10,\\!080`), `x = `, `^\\circ`, a trailing `\\%` (math-verify
  also accepts `25\\%` for 25, so both tiers agree), and trailing units (`\\text{ cm}`, ` cm`).
  It is strict: `10` is not `100`, `-3` is not `3`, `1000.5` is not `1000`. It never hangs: input
  is capped at `FAST_PATH_MAX_CHARS`, no regex has nested quantifiers (no catastrophic
  backtracking; the unanchored suffix scans are at worst quadratic in those 256 chars), the
  unwrapping loop is bounded, and there is no sympy. Anything it cannot settle returns None and goes to the pool.
  For non-integer gold answers it may only say "correct", on exact equality after removing
  spacing commands.
* `symbolic_verdict` (worker processes only): math-verify's `parse`/`verify` for fractions, LaTeX,
  intervals, sets, expressions. Its own signal-based timeouts are disabled
  (`parsing_timeout=None`, `timeout_seconds=None`): they only work in a main thread, and the
  process pool enforces the per-item timeout by killing the worker instead.
  The official release also tries the prime_math grader first; we use math-verify alone rather
  than a second hand-kept symbolic checker.
* `text_verdict` (worker processes only): a response with no box at all is graded as the release
  grades it, by math-verify's own extraction over the response text (its default LaTeX and
  expression targets; the last match wins), against the gold answer.
"""
from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation

FAST_PATH_MAX_CHARS = 256
_MAX_UNWRAP_ROUNDS = 8

_WRAPPER = re.compile(r"^\\(?:boxed|fbox|text|textbf|textrm|mathbf|mathrm|mbox|displaystyle)\s*\{(.*)\}$", re.S)
_SPACING = re.compile(r"\\[!,;: ]|\\quad|\\qquad|~|\\left|\\right")
_DOLLARS = re.compile(r"\\\$|\$")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]{1,8}\}?)?\s*=\s*")
_DEGREES = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)$")
_PERCENT = re.compile(r"\s*\\?%$")
_TEXT_UNIT = re.compile(r"\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*[A-Za-z][A-Za-z. ]{0,40}\}(?:\s*\^\s*\{?\d\}?)?$")
_WORD_UNIT = re.compile(
    r"\s+(?:cm|mm|km|m|meters?|centimeters?|inch(?:es)?|in|feet|foot|ft|yards?|miles?|mph|units?|"
    r"degrees?|dollars?|cents?|seconds?|minutes?|hours?|days?|weeks?|years?|ways|people|students)"
    r"(?:\s*\^\s*\{?\d\}?)?$"
)
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?$|^[+-]?\.\d+$")
_PM = "\\pm"
_STRING_NOISE = re.compile(r"\s+|\\[!,;: ]|\\left|\\right")


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


def _strip_decoration(s: str) -> str:
    s = s.strip().replace("\u2212", "-").replace("{,}", ",")
    s = _DOLLARS.sub("", _SPACING.sub("", s)).strip()
    for _ in range(_MAX_UNWRAP_ROUNDS):
        before = s
        m = _WRAPPER.match(s)
        if m and _balanced(m.group(1)):
            s = m.group(1).strip()
        elif s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
            s = s[1:-1].strip()
        s = _ASSIGNMENT.sub("", s, count=1)
        for pattern in (_DEGREES, _PERCENT, _TEXT_UNIT, _WORD_UNIT):
            s = pattern.sub("", s, count=1).strip()
        s = s.rstrip(".").strip() if s.endswith(".") and not _NUMBER.match(s) else s
        if s == before:
            break
    return s


def number_literal(s: str) -> Decimal | None:
    """The value of `s` if it is a decorated plain decimal literal (`\\$1,000.0 \\text{ cm}`), else None."""
    if len(s) > FAST_PATH_MAX_CHARS:
        return None
    core = _strip_decoration(s)
    if not _NUMBER.match(core):
        return None
    try:
        return Decimal(core.replace(",", "").rstrip("."))
    except InvalidOperation:
        return None


def integer_gold(gold: str) -> int | None:
    """The gold answer as an int when it is an integer literal (`1000`, `10,\\!080`, `90^\\circ`)."""
    value = number_literal(gold)
    if value is None or value != value.to_integral_value():
        return None
    return int(value)


def _canonical_string(s: str) -> str:
    return _STRING_NOISE.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def fast_verdict(pred: str, gold: str) -> bool | None:
    """True/False when settled without sympy (see module docstring), None to defer to the pool."""
    gold_int = integer_gold(gold)
    if gold_int is not None:
        value = number_literal(pred)
        return None if value is None else value == gold_int
    if len(pred) <= FAST_PATH_MAX_CHARS and len(gold) <= FAST_PATH_MAX_CHARS:
        if _canonical_string(pred) == _canonical_string(gold):
            return True
    return None


def _expand_plus_minus(s: str) -> str:
    """`\\frac{-1\\pm\\sqrt{17}}{2}` -> both roots as a list; math-verify only expands a top-level
    `\\pm`. Only a single `\\pm` is expanded (two would mean four ambiguous combinations)."""
    if s.count(_PM) != 1:
        return s
    return f"{s.replace(_PM, '+')}, {s.replace(_PM, '-')}"


def _parse_boxed(s: str) -> list:
    """math-verify's parse of `s` read as one boxed answer (LaTeX first, then plain expressions)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
    return parse(f"\\boxed{{{s}}}", extraction_config=config, parsing_timeout=None)


def symbolic_verdict(pred: str, gold: str) -> str:
    """"correct" / "wrong" / "parse_error" / "grader_error" via math-verify. May hang: pool only."""
    from math_verify import verify

    try:
        gold_parsed, pred_parsed = _parse_boxed(gold), _parse_boxed(pred)
        if not gold_parsed or not pred_parsed:
            return "parse_error"
        if verify(gold_parsed, pred_parsed, timeout_seconds=None):
            return "correct"
        gold_pm, pred_pm = _expand_plus_minus(gold), _expand_plus_minus(pred)
        if (gold_pm, pred_pm) != (gold, pred):
            if verify(_parse_boxed(gold_pm), _parse_boxed(pred_pm), timeout_seconds=None):
                return "correct"
        return "wrong"
    except Exception:  # noqa: BLE001 - math-verify/sympy can raise anything on hostile input
        return "grader_error"


def text_verdict(text: str, gold: str) -> str:
    """"correct" / "wrong" / "no_boxed" (nothing extractable) / "parse_error" / "grader_error" for
    a response without a box, via math-verify over the whole text. May hang: pool only."""
    from math_verify import parse, verify

    try:
        gold_parsed = _parse_boxed(gold)
        if not gold_parsed:
            return "parse_error"
        pred_parsed = parse(text, parsing_timeout=None)
        if not pred_parsed:
            return "no_boxed"
        return "correct" if verify(gold_parsed, pred_parsed, timeout_seconds=None) else "wrong"
    except Exception:  # noqa: BLE001 - math-verify/sympy can raise anything on hostile input
        return "grader_error"


JOB_KINDS = {"boxed": symbolic_verdict, "text": text_verdict}


def job_verdict(pred: str, gold: str, kind: str = "boxed") -> str:
    """A pool job: `pred` is an extracted box ("boxed") or a whole response ("text")."""
    return JOB_KINDS[kind](pred, gold)


def prepare_worker() -> None:
    """Silence math-verify's 'timeout disabled' warning and warm its parser caches."""
    for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    symbolic_verdict("\\frac{1}{2}", "0.5")
