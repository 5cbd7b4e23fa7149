"""GPQA-Diamond (198 four-choice science questions), graded with lm-eval's GPQA extraction.

Why a fixed permutation per question: the correct choice is always the dataset's "Correct
Answer" column, so the choices must be shuffled; lm-eval shuffles with the process-wide `random`
state, which makes the letter of a question depend on what ran before it. Here each question's
order comes from its own seeded generator (`choice_permutation`), and every trajectory row
records it, so a rerun, a resume and another checkpoint all see the same letters.

Prompt: lm-eval's zero-shot GPQA question text (tasks/gpqa/cot_zeroshot), with lm-eval's
`preprocess` applied to every choice, inside the release's user prompt (which asks for the final
answer in `\\boxed{}`), plus one line asking for the letter.

Grading: the final `\\boxed{}` (rstar2's extraction, as for math); a bare letter there becomes
"(X)". That text, or the whole final answer when nothing is boxed, goes through lm-eval's
`MultiChoiceRegexFilter` with its GPQA "flexible-extract" settings (a "(X)" pattern, else the
choice's text, else ": X"), and the result must equal the gold "(X)": lm-eval's exact_match.
"""
from __future__ import annotations

import random
import re
from typing import Any

from rstar2_cli.data.problems import Problem
from rstar2_cli.eval.benchmarks import MathFamily, final_answer_text, load_set, require_fields

# lm-eval 0.4.13 tasks/gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml, doc_to_text (without its
# "Let's think step by step: " tail: the release's prompt already asks for reasoning).
QUESTION_TEMPLATE = ("What is the correct answer to this question:{question}\nChoices:\n(A) {c[0]}\n"
                     "(B) {c[1]}\n(C) {c[2]}\n(D) {c[3]}")
LETTER_INSTRUCTION = "\nPut the letter of the correct choice in \\boxed{}, e.g. \\boxed{A}."
# The "flexible-extract" filter of lm-eval's GPQA yaml (same file).
FILTER_ARGS = dict(regex_pattern=r"(\([A-Z]\))", group_select=-1, ignore_case=True, ignore_punctuation=True)
SOURCE_COLUMNS = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Correct Answer")
_BARE_LETTER = re.compile(r"\(?\s*([A-Da-d])\s*\)?\.?")


def choice_permutation(question_id: str) -> list[int]:
    """Positions 0..3 of SOURCE_COLUMNS in the order shown as (A)..(D); fixed per question id."""
    order = [0, 1, 2, 3]
    random.Random(f"gpqa:{question_id}").shuffle(order)
    return order


def problem_from_row(row: dict[str, Any], where: str, lineno: int) -> Problem:
    """A GPQA row (the Hub's columns) as a Problem: shuffled choices, gold letter, permutation."""
    require_fields(row, where, lineno, "Question", *SOURCE_COLUMNS)
    from rstar2_cli.eval import reference

    preprocess = reference.gpqa_preprocess()
    qid = str(row.get("Record ID") or row.get("id") or f"gpqa-{lineno:05d}")
    source = [preprocess(row[c]) for c in SOURCE_COLUMNS]
    perm = choice_permutation(qid)
    choices = [source[i] for i in perm]
    gold = f"({chr(65 + perm.index(3))})"
    text = QUESTION_TEMPLATE.format(question=row["Question"], c=choices) + LETTER_INSTRUCTION
    return Problem(qid, text, gold, "gpqa_diamond", {"choices": choices, "permutation": perm})


def extract_choice(response_text: str, choices: list[str]) -> str:
    """The chosen letter as "(X)", or lm-eval's fallback "[invalid]"."""
    from rstar2_cli.eval import reference
    from rstar2_cli.reward.extract import extract_answer

    boxed = extract_answer(response_text, "outcome").answer
    candidate = boxed if boxed is not None else final_answer_text(response_text)
    bare = _BARE_LETTER.fullmatch(candidate.strip())
    if bare:
        candidate = f"({bare.group(1).upper()})"
    flt = reference.multi_choice_filter_class()(**FILTER_ARGS)
    return flt.apply([[candidate]], [{"choices": choices}])[0][0]


class GPQAFamily(MathFamily):
    name = "gpqa_diamond"

    def load(self, s) -> list[Problem]:
        return load_set(self.name, "GPQA", s, problem_from_row)

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        out = []
        for t in trajs:
            p = problems[t.prompt_id]
            choice = extract_choice(t.text, p.extra["choices"])
            out.append({"reward": float(choice == p.answer), "extracted": choice,
                        "grade_reason": "correct" if choice == p.answer else
                        ("no_choice" if choice == "[invalid]" else "wrong_choice"),
                        "permutation": p.extra["permutation"]})
        return out


GPQA = GPQAFamily()
