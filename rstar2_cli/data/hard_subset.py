"""Stage-3 hard-problem selection from per-problem pass counts.

rStar2-Agent's last RL stage trains only on problems the current policy does not always solve:
a problem solved in all of its samples gives GRPO zero advantage and no learning signal. The
rollout engine produces `(solved, total)` per problem; this module turns that into the subset.
"""
from __future__ import annotations

from typing import Mapping


def select_hard(
    pass_counts: Mapping[str, tuple[int, int]], threshold_solved: int = 8,
) -> list[str]:
    """Ids of problems solved in fewer than `threshold_solved` samples (sorted, deterministic).

    With the paper's 8 samples per problem and the default threshold 8 this keeps every problem
    not solved in all samples. A problem with fewer than `threshold_solved` samples in total is
    kept unless all of them were solved. Raises ValueError for impossible counts.
    """
    if threshold_solved < 1:
        raise ValueError(f"threshold_solved must be >= 1, got {threshold_solved}")
    hard = []
    for pid, counts in pass_counts.items():
        solved, total = counts
        if total < 1 or not 0 <= solved <= total:
            raise ValueError(f"problem {pid!r}: invalid pass count (solved={solved}, total={total})")
        if solved < min(threshold_solved, total):
            hard.append(pid)
    return sorted(hard)
