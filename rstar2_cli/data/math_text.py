"""Text and answer normalisation shared by dedup, decontamination and the integer filter.

Two problems that differ only in `\\dfrac` vs `\\frac`, `\\left(` vs `(`, `$`-delimiters or LaTeX
spacing are the same problem, and an answer written `$\\boxed{1{,}024}$` is the integer 1024.
Keeping these rules in one module makes dedup and decontamination agree on what "same" means.
"""
from __future__ import annotations

import re
import unicodedata

# Answer-format instructions that some sources embed in the problem text. They tell a model HOW
# to write the answer (our prompt template does that), so they are removed; hints that change
# WHAT is asked ("The answer is in the form m/n ... provide m + n") are part of the problem and kept.
FORMAT_INSTRUCTION_PATTERNS = [
    # DAPO English template (hub version; the SvS copy already has it removed).
    re.compile(r"^\s*Solve the following math problem step by step\. The last line of your response "
               r"should be of the form Answer: \$Answer \(without quotes\) where \$Answer is the "
               r"answer to the problem\.\s*", re.S),
    re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$", re.S),
    # DAPO Chinese template: "Let's think step by step. Output the final answer as 'Answer: \boxed{}'..."
    re.compile(r"\s*让我们一步一步地思考。请以“Answer: \\boxed\{<final_answer>\}”的格式输出最终答案。"
               r"(?:如果是选择题，请按顺序输出正确的选项，不带任何标点或空格。)?"
               r"(?:对于其他类型的问题，请只输出最终答案的数值。)?\s*$", re.S),
    re.compile(r"\s*Please (?:put|write) (?:your|the) final answer (?:with)?in \\boxed\{\}\.?\s*$", re.I),
]

# Control characters left by broken escaping upstream (DAPO: 691 form feeds in 600+ rows):
# "\frac" JSON-decoded as form-feed + "rac"; "\times"/"\text" as TAB + "imes"/"ext"; and the PDF
# "fi" ligature extracted as a form feed ("\x0cnd" = "find", "\x0crst" = "first").
_FORMFEED_FRAC = re.compile("\x0c(?=rac)")
_TAB_LATEX = re.compile(r"\t(?=(?:imes|heta|riangle|ext|frac|an(?![a-z])|au(?![a-z])|ilde|o(?![a-z])))")
_FORMFEED_LIGATURE = re.compile("\x0c(?=[a-eg-z])")
_OTHER_CONTROL = re.compile("[\x00-\x08\x0b-\x1f]")

_LATEX_SPACING = re.compile(r"\\(?:[,;:!> ]|quad|qquad|enspace|thinspace|medspace|thickspace)|~")
_LATEX_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])")
_LATEX_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_WHITESPACE = re.compile(r"\s+")
_WORD = re.compile(r"[\u4e00-\u9fff]|[^\W\u4e00-\u9fff]+")  # a CJK character, or a word run


def repair_control_chars(text: str) -> str:
    """Undo escape damage: form feed before "rac" -> "\\frac", TAB before "imes" -> "\\times",
    form feed before a letter -> "fi" (PDF ligature); any other control character -> space."""
    text = _FORMFEED_FRAC.sub(r"\\f", text)
    text = _TAB_LATEX.sub(r"\\t", text)
    text = _FORMFEED_LIGATURE.sub("fi", text)
    return _OTHER_CONTROL.sub(" ", text)


def strip_format_instructions(problem: str) -> str:
    """Problem text without embedded answer-format instructions and with LaTeX escapes repaired."""
    text = repair_control_chars(problem)
    for pattern in FORMAT_INSTRUCTION_PATTERNS:
        text = pattern.sub("", text)
    return text.strip()


def normalize_problem_text(text: str) -> str:
    """Canonical form for exact dedup: NFKC, lowercase, no `$`, LaTeX spacing/sizing, one space."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _LATEX_SPACING.sub(" ", text)
    text = _LATEX_SIZING.sub("", text)
    text = _LATEX_FRAC_VARIANTS.sub(r"\\frac", text)
    text = text.replace("$", "")
    return _WHITESPACE.sub(" ", text).strip()


def word_tokens(text: str) -> list[str]:
    """Word tokens (letters/digits runs, CJK characters one by one) of the normalised text."""
    return _WORD.findall(normalize_problem_text(text))


_BOXED = re.compile(r"^\\(?:boxed|fbox)\{(.*)\}$", re.S)
_INTEGER = re.compile(r"^[+-]?\d+$")


def normalize_answer(answer: str) -> str:
    """Strip `$`, `\\boxed{}`, spaces, thousands commas (`1,024`, `1{,}024`) and a trailing `.0`."""
    text = str(answer).strip()
    text = text.strip("$").strip()
    while (m := _BOXED.match(text)) is not None:
        text = m.group(1).strip().strip("$").strip()
    text = text.replace("{,}", ",").replace("\\!", "")
    text = _WHITESPACE.sub("", text)
    if re.fullmatch(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.0+)?", text):
        text = text.replace(",", "")
    text = re.sub(r"^([+-]?\d+)\.0+$", r"\1", text)
    if _INTEGER.match(text):
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("+-").lstrip("0") or "0"
        text = (sign if digits != "0" else "") + digits
    return text


def is_integer_answer(answer: str) -> bool:
    """True for a normalised answer that is a plain (signed) integer."""
    return bool(_INTEGER.match(answer))
