"""The wall clock of one RL step, by section (time/<name> columns)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class StepTimer:
    """The wall clock of one step: `with timer("train"): ...` -> time/train; `timer.add("rollout",
    s)` records a section timed elsewhere (on a rollout host, or on the rollout thread); time/step
    is the wall time from the timer's creation to `stop()` (to `metrics()` if never stopped)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.total: float | None = None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def elapsed(self) -> float:
        """Seconds since the timer was created."""
        return time.perf_counter() - self.started

    def stop(self) -> None:
        """Fix time/step at the wall time so far."""
        self.total = self.elapsed()

    def sections(self) -> dict[str, float]:
        """{"time/<name>": seconds} of the sections, without time/step."""
        return {f"time/{k}": v for k, v in self.seconds.items()}

    def metrics(self) -> dict[str, float]:
        return {**self.sections(), "time/step": self.elapsed() if self.total is None else self.total}
