"""Exact and near-duplicate removal for problem sets, with answer-conflict handling.

Duplicated problems over-weight some prompts in RL, and duplicates whose reference answers
disagree mean at least one answer is wrong, which rewards a wrong solution. Exact duplicates
(same normalised text) with conflicting answers are therefore all dropped; agreeing ones keep one
copy. Near duplicates (MinHash LSH over word 3-grams, `datasketch`) that agree keep one copy;
near duplicates with DIFFERENT answers are usually variants with a changed number or a changed
question ("...give m+n" vs "...give m"), so one copy per distinct answer is kept and counted.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from rstar2_cli.data.decontaminate import ngrams
from rstar2_cli.data.math_text import normalize_problem_text
from rstar2_cli.data.problems import Problem

SHINGLE_WORDS = 3
NUM_PERM = 128


@dataclass
class DedupResult:
    kept: list[Problem]
    duplicates: list[Problem] = field(default_factory=list)           # agreeing extra copies
    conflicts: list[Problem] = field(default_factory=list)            # all rows of conflict groups
    conflict_groups: list[list[Problem]] = field(default_factory=list)
    near_variants_kept: int = 0  # rows kept although near-duplicate of a row with another answer


def exact_dedup(problems: Sequence[Problem]) -> DedupResult:
    """Group by normalised text; keep the first of agreeing groups, drop conflicting groups."""
    groups: dict[str, list[Problem]] = defaultdict(list)
    for p in problems:
        groups[normalize_problem_text(p.problem)].append(p)
    result = DedupResult(kept=[])
    for members in groups.values():
        if len({p.answer for p in members}) > 1:
            result.conflicts.extend(members)
            result.conflict_groups.append(members)
        else:
            result.kept.append(members[0])
            result.duplicates.extend(members[1:])
    order = {id(p): i for i, p in enumerate(problems)}
    result.kept.sort(key=lambda p: order[id(p)])
    return result


def _shingles(text: str) -> set[bytes]:
    # a text without words still gets one (empty) shingle, so it hashes like any other row
    return {" ".join(g).encode() for g in ngrams(text, SHINGLE_WORDS)} or {b""}


def near_dedup(
    problems: Sequence[Problem], threshold: float = 0.9, *, seed: int = 1,
    progress: Callable[[int], None] | None = None,
) -> DedupResult:
    """Cluster rows whose word-3-gram Jaccard similarity is >= threshold (MinHash LSH estimate).

    In each cluster the first row per distinct answer is kept (see module docstring).
    `progress(n)` is called after each row is hashed.
    """
    from datasketch import MinHash, MinHashLSH

    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"near-dup threshold must be in (0, 1], got {threshold}")
    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    hashes: list[MinHash] = []
    parent = list(range(len(problems)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # generator() shares one set of hash permutations across all rows (much faster than MinHash()).
    minhashes = MinHash.generator((list(_shingles(p.problem)) for p in problems), num_perm=NUM_PERM, seed=seed)
    for i, mh in enumerate(minhashes):
        for j in lsh.query(mh):  # candidates; confirm with the estimate to cut LSH false positives
            if mh.jaccard(hashes[j]) >= threshold:
                parent[find(i)] = find(j)
        lsh.insert(i, mh)
        hashes.append(mh)
        if progress is not None:
            progress(1)
    clusters: dict[int, list[int]] = defaultdict(list)
    for i in range(len(problems)):
        clusters[find(i)].append(i)
    result = DedupResult(kept=[])
    keep_idx: list[int] = []
    for members in clusters.values():
        seen_answers: set[str] = set()
        for i in members:
            if problems[i].answer in seen_answers:
                result.duplicates.append(problems[i])
            else:
                seen_answers.add(problems[i].answer)
                keep_idx.append(i)
        result.near_variants_kept += len(seen_answers) - 1
    result.kept = [problems[i] for i in sorted(keep_idx)]
    return result
