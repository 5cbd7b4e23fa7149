"""Pull the final answer out of a model response, or say why there is none.

rStar2-Agent's prompt asks for the final answer as `<answer> ... \\boxed{X} ... </answer>`.
Extraction is pure string scanning in linear time (one pass to match braces, no regex
backtracking), so it runs in the trainer process and can never hang.

Semantics, matched to the official release where it has any: the official reward
(`fused_compute_score` in microsoft/rStar, vendored from verl's prime_math grader with math-verify
as fallback) grades the LAST `\\boxed{}` / `\\fbox{}` of the whole response. So:

* paper mode reads the LAST `<answer>` block (a model that restates its answer is graded on the
  final statement) and, inside it, the LAST top-level `\\boxed{}`. A final `<answer>` that is never
  closed (response cut at the length limit) still counts, as it would officially.
  Unlike the official grader, paper mode requires the `<answer>` block and a box: `no_answer` /
  `no_boxed` rather than a lenient guess from prose.
* last_boxed mode reads the last top-level `\\boxed{}` anywhere (for models not trained on the tags).
* conflicting boxed values (e.g. `\\boxed{3} or \\boxed{5}`): `on_conflict="last"` (default, the
  official behaviour: only the last one counts, so hedging earns nothing in expectation) or
  `"reject"` (reason `multiple_answers`; in paper mode every `<answer>` block is in scope, in
  last_boxed mode the whole response is).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["paper", "last_boxed"]
OnConflict = Literal["last", "reject"]
MODES: tuple[str, ...] = ("paper", "last_boxed")
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


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each `{` -> index of its `}`, in one pass. `\\{`, `\\}` and `\\\\` are skipped."""
    match: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            match[stack.pop()] = i
        i += 1
    return match


@dataclass(frozen=True, slots=True)
class _Box:
    content: str | None  # None: the box's brace never closes


def boxed_contents(text: str) -> list[_Box]:
    """Top-level `\\boxed{...}` / `\\fbox{...}` in order (a box nested in a box is content)."""
    match = _matching_braces(text)
    boxes: list[_Box] = []
    i, n = 0, len(text)
    while i < n:
        j = text.find("\\", i)
        if j == -1:
            break
        cmd = next((c for c in _BOX_COMMANDS if text.startswith(c, j)), None)
        if cmd is None:
            i = j + 2  # skip the escaped char too, mirroring _matching_braces
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


def extract_answer(text: str, mode: Mode = "paper", on_conflict: OnConflict = "last") -> Extraction:
    """The final boxed answer of `text` under `mode` (see the module docstring for the rules)."""
    check_mode(mode, on_conflict)
    if mode == "last_boxed":
        return _pick(boxed_contents(text), on_conflict)
    blocks = answer_blocks(text)
    if not blocks:
        return Extraction(None, "no_answer")
    last_boxes = boxed_contents(blocks[-1])
    picked = _pick(last_boxes, "last")
    if picked.answer is None or on_conflict == "last":
        return picked
    every_box = [box for block in blocks for box in boxed_contents(block)]
    return _pick(every_box, "reject")
