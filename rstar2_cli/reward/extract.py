"""Pull the final answer out of a model response, or say why there is none.

rStar2-Agent's reward is binary and outcome-only: the final `\\boxed{}` answer, verified. The
prompt asks for `<answer> ... \\boxed{X} ... </answer>`, but the tags feed only RoC's format
penalty (p_format), never the reward. Extraction is pure string scanning in linear time (one pass
to match braces, no regex backtracking), so it runs in the trainer process and can never hang.

The official reward (`fused_compute_score` in microsoft/rStar's code-judge reward manager: verl's
prime_math grader on the last `\\boxed{}` of the whole response, then math-verify over the full
text) has no `<answer>` requirement. Modes:

* ``outcome`` (default, the release's reading): the last top-level `\\boxed{}` of the last
  `<answer>` block when that block holds one (a model that restates its answer is graded on its
  final statement), else the last top-level `\\boxed{}` anywhere. With no box at all the reason
  is ``no_boxed`` and the grader falls back to math-verify over the response text, in the pool.
* ``strict_answer_tag`` (ablation, neither the paper's nor the release's): requires the `<answer>`
  block (``no_answer`` otherwise) and a box inside its last block (``no_boxed``): a hidden format
  reward on top of the outcome. A final `<answer>` never closed (cut at the length limit) counts.
* ``last_boxed``: the last top-level `\\boxed{}` anywhere, no text fallback (for models not
  trained on the tags).

Conflicting boxed values (e.g. `\\boxed{3} or \\boxed{5}`): `on_conflict="last"` (default, the
official behaviour: only the last one counts, so hedging earns nothing in expectation) or
`"reject"` (reason `multiple_answers`; every box in the scope the answer was taken from: every
`<answer>` block when it came from one, else the whole response).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Mode = Literal["outcome", "strict_answer_tag", "last_boxed"]
OnConflict = Literal["last", "reject"]
MODES: tuple[str, ...] = Mode.__args__  # type: ignore[attr-defined]
TEXT_FALLBACK_MODES: tuple[str, ...] = ("outcome",)   # no box at all: math-verify over the text
ON_CONFLICT: tuple[str, ...] = ("last", "reject")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"


@dataclass(frozen=True, slots=True)
class Extraction:
    """`answer` is the boxed content, or None with `reason` saying why."""

    answer: str | None
    reason: str | None = None


def check_mode(mode: str, on_conflict: str = "last") -> None:
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict: {on_conflict!r} is not one of {', '.join(ON_CONFLICT)}")


def answer_blocks(text: str) -> list[str]:
    """Contents of every `<answer>...</answer>` block; a final unclosed block runs to the end."""
    blocks: list[str] = []
    pos = 0
    while (start := text.find(_OPEN_TAG, pos)) != -1:
        start += len(_OPEN_TAG)
        end = text.find(_CLOSE_TAG, start)
        if end == -1:
            blocks.append(text[start:])
            break
        blocks.append(text[start:end])
        pos = end + len(_CLOSE_TAG)
    return blocks


_BRACE_OR_ESCAPE = re.compile(r"[\\{}]")


def matching_braces(text: str) -> dict[int, int]:
    """Index of each `{` -> index of its `}`, in one pass. `\\{`, `\\}` and `\\\\` are skipped (a
    backslash escapes the character after it, whatever it is). The regex (a character class, no
    backtracking) finds the next brace or backslash in C; Python looks only at those."""
    match: dict[int, int] = {}
    stack: list[int] = []
    escaped = -1                       # the index a backslash escapes
    for m in _BRACE_OR_ESCAPE.finditer(text):
        i = m.start()
        if i == escaped:
            continue
        ch = m.group()
        if ch == "\\":
            escaped = i + 1
        elif ch == "{":
            stack.append(i)
        elif stack:
            match[stack.pop()] = i
    return match


@dataclass(frozen=True, slots=True)
class _Box:
    content: str | None  # None: the box's brace never closes


def boxed_contents(text: str) -> list[_Box]:
    """Top-level `\\boxed{...}` / `\\fbox{...}` in order (a box nested in a box is content)."""
    match = matching_braces(text)
    boxes: list[_Box] = []
    i, n = 0, len(text)
    while i < n:
        j = text.find("\\", i)
        if j == -1:
            break
        cmd = next((c for c in _BOX_COMMANDS if text.startswith(c, j)), None)
        if cmd is None:
            i = j + 2  # skip the escaped char too, mirroring matching_braces
            continue
        k = j + len(cmd)
        while k < n and text[k] in " \t":
            k += 1
        if k >= n or text[k] != "{":
            i = j + len(cmd)
            continue
        close = match.get(k)
        if close is None:
            boxes.append(_Box(None))
            break  # an unclosed box swallows the rest of the text
        boxes.append(_Box(text[k + 1 : close]))
        i = close + 1
    return boxes


def _pick(boxes: list[_Box], on_conflict: OnConflict) -> Extraction:
    if not boxes:
        return Extraction(None, "no_boxed")
    last = boxes[-1]
    if last.content is None:
        return Extraction(None, "unbalanced_braces")
    answer = last.content.strip()
    if not answer:
        return Extraction(None, "empty_boxed")
    if on_conflict == "reject":
        values = {" ".join(b.content.split()) for b in boxes if b.content is not None and b.content.strip()}
        if len(values) > 1:
            return Extraction(None, "multiple_answers")
    return Extraction(answer)


def _from_blocks(blocks: list[str], on_conflict: OnConflict) -> Extraction:
    """The last box of the last block; with "reject", every block's boxes must agree."""
    picked = _pick(boxed_contents(blocks[-1]), "last")
    if picked.answer is None or on_conflict == "last":
        return picked
    return _pick([box for block in blocks for box in boxed_contents(block)], "reject")


def extract_answer(text: str, mode: Mode = "outcome", on_conflict: OnConflict = "last") -> Extraction:
    """The final boxed answer of `text` under `mode` (see the module docstring for the rules)."""
    check_mode(mode, on_conflict)
    if mode == "last_boxed":
        return _pick(boxed_contents(text), on_conflict)
    blocks = answer_blocks(text)
    if mode == "strict_answer_tag":
        return _from_blocks(blocks, on_conflict) if blocks else Extraction(None, "no_answer")
    if blocks and boxed_contents(blocks[-1]):
        return _from_blocks(blocks, on_conflict)
    return _pick(boxed_contents(text), on_conflict)
