"""GPQA-Diamond (198 four-choice science questions), scored as lm-eval scores it.

Why a fixed permutation per question: the correct choice is always the dataset's "Correct
Answer" column, so the choices must be shuffled; lm-eval shuffles with the process-wide `random`
state, which makes the letter of a question depend on what ran before it. Here each question's
order comes from its own seeded generator (`choice_permutation`), and every trajectory row
records it, so a rerun, a resume and another checkpoint all see the same letters.

Prompt: lm-eval's zero-shot GPQA question text (tasks/gpqa/cot_zeroshot), with lm-eval's
`preprocess` applied to every choice, inside the release's user prompt (which asks for the final
answer in `\\boxed{}`), plus one line asking for the letter as "(X)" in the box, so that both
scores below read the same answer.

Two scores:
- `reward` (the row's score): lm-eval's own, over the whole final assistant turn (reasoning
  included), as lm-eval hands a single-turn generation to its filters: the "flexible-extract"
  filter of gpqa_diamond_cot_zeroshot (`MultiChoiceRegexFilter`: the last "(X)", else a
  choice's text, else ": X"; then take_first), and `exact_match` with ignore_case and
  ignore_punctuation against the gold "(X)".
- `gpqa_boxed`: rstar2's extraction: the last `\\boxed{}` of the final answer (the answer the
  user reads, `family.final_answer_text`; a bare letter, `\\text{C}` or "Option A" there becomes
  "(X)"), or that answer's text when it has no box (so a tentative box in the reasoning does not
  beat a final "The answer is (A)"), through the same filter and match.
"""
from __future__ import annotations

import random
import re
import statistics
from typing import Any

from rstar2_cli.data.problems import DataError, Problem
from rstar2_cli.eval import reference
from rstar2_cli.eval.family import MathFamily, final_answer_text, final_turn, load_set, require_fields
from rstar2_cli.reward.extract import extract_answer

# lm-eval 0.4.13 tasks/gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml, doc_to_text (without its
# "Let's think step by step: " tail: the release's prompt already asks for reasoning).
QUESTION_TEMPLATE = ("What is the correct answer to this question:{question}\nChoices:\n(A) {c[0]}\n"
                     "(B) {c[1]}\n(C) {c[2]}\n(D) {c[3]}")
LETTER_INSTRUCTION = "\nPut the letter of the correct choice, in parentheses, in \\boxed{}, e.g. \\boxed{(A)}."
# The "flexible-extract" filter and the exact_match settings of lm-eval's GPQA yaml (same file).
FILTER_ARGS = dict(regex_pattern=r"(\([A-Z]\))", group_select=-1, ignore_case=True, ignore_punctuation=True)
MATCH_ARGS = dict(ignore_case=True, ignore_punctuation=True)
SOURCE_COLUMNS = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Correct Answer")
# A boxed letter: "B", "(B)", "B.", "\text{B}", "\textbf{(B)}", "Option B", "Choice (B)"
_BOXED_LETTER = re.compile(
    r"(?:\\text(?:bf|rm)?\{)?\s*(?:(?:option|choice|answer)[:\s]*)?\(?\s*([A-Da-d])\s*\)?\.?\s*\}?", re.IGNORECASE
)


def choice_permutation(question_id: str) -> list[int]:
    """Positions 0..3 of SOURCE_COLUMNS in the order shown as (A)..(D); fixed per question id."""
    order = [0, 1, 2, 3]
    random.Random(f"gpqa:{question_id}").shuffle(order)
    return order


def problem_from_row(row: dict[str, Any], where: str, lineno: int) -> Problem:
    """A GPQA row (the Hub's columns) as a Problem: shuffled choices, gold letter, permutation."""
    require_fields(row, where, lineno, "Question", *SOURCE_COLUMNS)
    bad = next((c for c in ("Question", *SOURCE_COLUMNS) if not isinstance(row[c], str)), None)
    if bad or not row["Question"].strip():
        raise DataError(f"{where}:{lineno}: field {bad or 'Question'!r} must be non-empty text, "
                        f"got {row[bad or 'Question']!r}")

    preprocess = reference.gpqa_preprocess()
    qid = str(row.get("Record ID") or row.get("id") or f"gpqa-{lineno:05d}")
    source = [preprocess(row[c]) for c in SOURCE_COLUMNS]
    perm = choice_permutation(qid)
    choices = [source[i] for i in perm]
    gold = f"({chr(65 + perm.index(3))})"
    text = QUESTION_TEMPLATE.format(question=row["Question"], c=choices) + LETTER_INSTRUCTION
    return Problem(qid, text, gold, "gpqa_diamond", {"choices": choices, "permutation": perm})


def lm_eval_choices(texts: list[str], choices: list[list[str]]) -> list[str]:
    """lm-eval's flexible-extract result for each text: "(X)", or its fallback "[invalid]". One
    `apply` for the batch, as lm-eval filters a task's responses (each call first builds a
    table of every Unicode punctuation character)."""
    if not texts:
        return []
    flt = reference.multi_choice_filter_class()(**FILTER_ARGS)
    return [r[0] for r in flt.apply([[t] for t in texts], [{"choices": c} for c in choices])]


def lm_eval_match(choice: str, gold: str) -> bool:
    """lm-eval's exact_match of one prediction with the GPQA yaml's settings."""
    return bool(reference.lm_eval_exact_match()(predictions=[choice], references=[gold], **MATCH_ARGS)["exact_match"])


def boxed_candidate(response_text: str) -> str:
    """What `gpqa_boxed` hands the filter: the final answer's last `\\boxed{}` first (module doc)."""
    answer = final_answer_text(response_text)
    boxed = extract_answer(answer, "last_boxed").answer
    candidate = boxed if boxed is not None else answer
    letter = _BOXED_LETTER.fullmatch(candidate.strip())
    return f"({letter.group(1).upper()})" if letter else candidate


class GPQAFamily(MathFamily):
    name = "gpqa_diamond"

    def load(self, s) -> list[Problem]:
        return load_set(self.name, "GPQA", s, problem_from_row)

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        shown = [problems[t.prompt_id].extra["choices"] for t in trajs]
        picked = lm_eval_choices([final_turn(t.text) for t in trajs], shown)      # the reference's
        boxed_picked = lm_eval_choices([boxed_candidate(t.text) for t in trajs], shown)
        out = []
        for t, choice, boxed in zip(trajs, picked, boxed_picked):
            p = problems[t.prompt_id]
            ok = lm_eval_match(choice, p.answer)
            out.append({"reward": float(ok), "extracted": choice,
                        "grade_reason": "correct" if ok else ("no_choice" if choice == "[invalid]" else "wrong_choice"),
                        "gpqa_boxed": float(lm_eval_match(boxed, p.answer)), "extracted_boxed": boxed,
                        "permutation": p.extra["permutation"]})
        return out

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The two columns over every sample: lm-eval's (the row's score) and rstar2's boxed-first."""
        if not rows:
            return {}
        return {"gpqa": {"lm_eval": statistics.fmean(r["reward"] for r in rows),
                         "gpqa_boxed": statistics.fmean(r.get("gpqa_boxed", 0.0) for r in rows)}}


GPQA = GPQAFamily()
