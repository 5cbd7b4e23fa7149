"""Verified binary outcome reward (rStar2-Agent trains on this and nothing else).

    from rstar2_cli.reward import grade, grade_batch, GradeResult, GraderPool

`grade`/`grade_batch` use a shared worker pool started on first use; `GraderPool` is the same
with a lifetime the caller manages (`with GraderPool(workers=2) as pool: pool.grade_batch(...)`).
"""
from rstar2_cli.reward.extract import Extraction, extract_answer
from rstar2_cli.reward.grader import GraderPool, close_shared_pool, grade, grade_batch
from rstar2_cli.reward.result import REASONS, GradeResult, Reason

__all__ = [
    "REASONS",
    "Extraction",
    "GradeResult",
    "GraderPool",
    "Reason",
    "close_shared_pool",
    "extract_answer",
    "grade",
    "grade_batch",
]
