"""The verdict of one grade and the reasons it can carry.

rStar2-Agent trains on a binary outcome reward only, so a grade is a reward (1.0 or 0.0) plus
the reason it was given: the trainer logs reasons to spot extraction problems, grader timeouts
and crashes, which would otherwise look like a policy that merely got the answer wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Reason = Literal[
    "correct",            # the extracted answer matches the gold answer
    "wrong",              # it was graded and does not match
    "no_answer",          # strict_answer_tag mode: no <answer> block in the response
    "no_boxed",           # no \boxed{} / \fbox{} where the mode looks for one (outcome mode:
                          # and math-verify found no answer in the text either)
    "multiple_answers",   # on_conflict="reject" and the boxed values disagree
    "unbalanced_braces",  # the final \boxed{ is never closed (e.g. a truncated response)
    "empty_boxed",        # \boxed{} holds nothing but whitespace
    "parse_error",        # math-verify could not parse the answer or the gold answer
    "grader_error",       # the symbolic check raised (e.g. MemoryError under the worker's limit)
    "timeout",            # the grader ran past its per-item timeout and was killed
    "grader_crash",       # the grader process died while grading this item
]

REASONS: tuple[str, ...] = Reason.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class GradeResult:
    """Outcome reward for one response: `reward` is 1.0 iff `reason == "correct"`."""

    reward: float
    extracted: str | None
    reason: Reason

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"GradeResult.reason: unknown reason {self.reason!r}")
        if self.reward != (1.0 if self.reason == "correct" else 0.0):
            raise ValueError(f"GradeResult.reward: {self.reward!r} does not fit reason {self.reason!r}")

    @classmethod
    def of(cls, reason: Reason, extracted: str | None = None) -> "GradeResult":
        return cls(1.0 if reason == "correct" else 0.0, extracted, reason)
