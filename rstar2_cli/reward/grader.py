"""The outcome reward: extract, take the no-hang fast path when it applies, else grade in the pool.

A response with no box at all is, in the default ``outcome`` mode, graded as the release grades
it: math-verify over the response text, in the pool like every symbolic check (see `extract`).

The RL trainer and `rstar2 eval` call `grade_batch`; both need results in input order, a reward
for every item however hostile the text, and no call that blocks past its per-item timeout.
`GraderPool` owns a `WorkerPool` for callers that manage its lifetime; the module-level
functions share one lazily started pool that is closed at interpreter exit.
"""
from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence

from rstar2_cli.reward.extract import TEXT_FALLBACK_MODES, Mode, OnConflict, check_mode, extract_answer
from rstar2_cli.reward.pool import WorkerPool
from rstar2_cli.reward.result import GradeResult
from rstar2_cli.reward.verify import fast_verdict


def _check_timeout(timeout: float) -> None:
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout: must be a positive number of seconds, got {timeout!r}")


class GraderPool:
    """Grades responses against gold answers; symbolic checks run in its own worker processes."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        chunk_size: int = 16,
        start_method: str = "forkserver",
        memory_limit_mb: int | None = 4096,
    ) -> None:
        self.workers = WorkerPool(
            workers, chunk_size=chunk_size, start_method=start_method, memory_limit_mb=memory_limit_mb
        )

    def grade(
        self,
        response_text: str,
        gold_answer: str,
        *,
        mode: Mode = "outcome",
        timeout: float = 5.0,
        on_conflict: OnConflict = "last",
    ) -> GradeResult:
        return self.grade_batch([(response_text, gold_answer)], mode=mode, timeout=timeout, on_conflict=on_conflict)[0]

    def grade_batch(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        timeout: float = 5.0,
        mode: Mode = "outcome",
        on_conflict: OnConflict = "last",
    ) -> list[GradeResult]:
        """One GradeResult per (response_text, gold_answer), in input order."""
        check_mode(mode, on_conflict)
        _check_timeout(timeout)
        results: list[GradeResult | None] = [None] * len(pairs)
        deferred: list[tuple[int, str, str, str]] = []     # (index, pred or text, gold, job kind)
        text_fallback = mode in TEXT_FALLBACK_MODES
        for i, pair in enumerate(pairs):
            response, gold = pair
            if not isinstance(response, str) or not isinstance(gold, str):
                raise TypeError(
                    f"pairs[{i}]: expected (str, str), got ({type(response).__name__}, {type(gold).__name__})"
                )
            extraction = extract_answer(response, mode, on_conflict)
            if extraction.answer is None:
                if text_fallback and extraction.reason == "no_boxed":
                    deferred.append((i, response, gold, "text"))
                else:
                    results[i] = GradeResult.of(extraction.reason or "no_boxed")  # type: ignore[arg-type]
                continue
            verdict = fast_verdict(extraction.answer, gold)
            if verdict is None:
                deferred.append((i, extraction.answer, gold, "boxed"))
            else:
                results[i] = GradeResult.of("correct" if verdict else "wrong", extraction.answer)
        reasons = self.workers.run([job[1:] for job in deferred], timeout)
        for (i, pred, _, kind), reason in zip(deferred, reasons, strict=True):
            results[i] = GradeResult.of(reason, pred if kind == "boxed" else None)  # type: ignore[arg-type]
        return [r for r in results if r is not None]

    def start(self) -> None:
        self.workers.start()

    def close(self) -> None:
        self.workers.close()

    def __enter__(self) -> "GraderPool":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: GraderPool | None = None
_shared_lock = threading.Lock()


def shared_pool(workers: int | None = None) -> GraderPool:
    """The process-wide pool, started on first use; a different `workers` count restarts it."""
    global _shared
    with _shared_lock:
        if _shared is not None and workers is not None and _shared.workers.size != workers:
            _shared.close()
            _shared = None
        if _shared is None:
            _shared = GraderPool(workers)
        return _shared


def close_shared_pool() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


atexit.register(close_shared_pool)


def grade(
    response_text: str,
    gold_answer: str,
    *,
    mode: Mode = "outcome",
    timeout: float = 5.0,
    on_conflict: OnConflict = "last",
) -> GradeResult:
    """Binary outcome reward for one response (see `grade_batch`)."""
    return shared_pool().grade(response_text, gold_answer, mode=mode, timeout=timeout, on_conflict=on_conflict)


def grade_batch(
    pairs: Sequence[tuple[str, str]],
    *,
    timeout: float = 5.0,
    mode: Mode = "outcome",
    workers: int | None = None,
    on_conflict: OnConflict = "last",
) -> list[GradeResult]:
    """Binary outcome rewards for (response_text, gold_answer) pairs, in input order, on the shared pool."""
    return shared_pool(workers).grade_batch(pairs, timeout=timeout, mode=mode, on_conflict=on_conflict)
