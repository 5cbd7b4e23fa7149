"""Word 8-gram decontamination of training problems against evaluation sets.

Training on an evaluation problem inflates every reported score, so (as in the rStar2-Agent
paper) any training problem sharing a word 8-gram with an eval problem is removed. Text is
compared after `normalize_problem_text`, tokenised into words (CJK: characters).

Competition problems share boilerplate ("where m and n are relatively prime positive integers.
Find m+n" matches 388 DAPO rows against AIME alone), so an eval 8-gram that occurs in at least
`boilerplate_min_problems` distinct training problems is treated as boilerplate and ignored.
Specific 8-grams of a copied problem still match, and a training row that shares at least
`copy_fraction` of some eval problem's 8-grams is removed whatever their frequency (a problem
copied into many training rows). `boilerplate_min_problems=0` gives the plain paper rule.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from rstar2_cli.data.math_text import word_tokens
from rstar2_cli.data.problems import Problem


@dataclass(frozen=True)
class DecontaminationConfig:
    ngram: int = 8
    boilerplate_min_problems: int = 10
    copy_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {self.ngram}")
        if self.boilerplate_min_problems < 0:
            raise ValueError(f"boilerplate_min_problems must be >= 0, got {self.boilerplate_min_problems}")
        if not 0.0 < self.copy_fraction <= 1.0:
            raise ValueError(f"copy_fraction must be in (0, 1], got {self.copy_fraction}")


@dataclass
class DecontaminationResult:
    kept: list[Problem]
    removed: list[Problem] = field(default_factory=list)
    hits_per_eval_set: dict[str, int] = field(default_factory=dict)  # removed rows matching each set
    matches: dict[str, list[str]] = field(default_factory=dict)       # removed row id -> eval ids


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    tokens = word_tokens(text)
    if len(tokens) < n:  # a very short problem is its own only n-gram
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def decontaminate(
    train: Sequence[Problem], eval_sets: dict[str, Sequence[Problem]],
    config: DecontaminationConfig = DecontaminationConfig(),
) -> DecontaminationResult:
    """Split `train` into kept rows and rows overlapping any eval set (see module docstring)."""
    eval_index: dict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)
    eval_sizes: dict[tuple[str, str], int] = {}
    for set_name, problems in eval_sets.items():
        for p in problems:
            grams = ngrams(p.problem, config.ngram)
            eval_sizes[(set_name, p.id)] = len(grams)
            for g in grams:
                eval_index[g].add((set_name, p.id))
    train_grams = [ngrams(p.problem, config.ngram) & eval_index.keys() for p in train]
    frequency = Counter(g for grams in train_grams for g in grams)
    result = DecontaminationResult(kept=[], hits_per_eval_set={name: 0 for name in eval_sets})
    for p, grams in zip(train, train_grams):
        shared: Counter[tuple[str, str]] = Counter()
        specific: set[tuple[str, str]] = set()
        for g in grams:
            owners = eval_index[g]
            shared.update(owners)
            if not config.boilerplate_min_problems or frequency[g] < config.boilerplate_min_problems:
                specific |= owners
        copied = {key for key, n in shared.items() if n >= config.copy_fraction * eval_sizes[key]}
        hit = specific | copied
        if not hit:
            result.kept.append(p)
            continue
        result.removed.append(p)
        result.matches[p.id] = sorted(f"{s}:{i}" for s, i in hit)
        for set_name in {s for s, _ in hit}:
            result.hits_per_eval_set[set_name] += 1
    return result
