"""What stops an RL run, and the fault injection tests and benchmarks/compare/chaos_rl.py use.

A step whose loss or gradient norm is NaN or inf takes no optimizer step (the same on every rank:
both are global values, `PolicyTrainer.update`) and is counted (`faults/nonfinite_steps`);
`train.max_nonfinite_steps` of them in a row checkpoint and abort (`RunAborted`). The checkpoint
comes first because a skipped step changes neither the weights nor the optimizer state: it holds
the last finite weights and the data position, so nothing since the last periodic save is lost
and the run can be resumed with a changed recipe (a lower `optim.lr`, say). The other aborts
(a sandbox outage, an engine death past `engine.max_restarts`, a checkpoint that cannot be
written, the tool-loop alarm with `train.stop_on_tool_loop`) are raised where they are found.

Fault injection (tests, benchmarks/compare/chaos_rl.py): a `FaultPlan` in the run's
`Collaborators` (`rollout_side.py`). `nonfinite_steps` get NaN advantages on every rank, so their
loss and gradients are NaN; `checkpoint_write_step`'s checkpoint write fails as a full disk would
(`checkpoint.save_checkpoint(fail_write=True)`). A trainer process started by `rstar2 rl` (or by
torchrun) takes its plan from the environment, read once where the process starts
(`launch_entry.run`: `FaultPlan.from_env`): `RSTAR2_FAULT_NONFINITE_STEPS=3,4`,
`RSTAR2_FAULT_CHECKPOINT_WRITE=<step>`, steps numbered from 1.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

FAULT_NONFINITE_ENV = "RSTAR2_FAULT_NONFINITE_STEPS"
FAULT_CHECKPOINT_WRITE_ENV = "RSTAR2_FAULT_CHECKPOINT_WRITE"


class RunAborted(RuntimeError):
    """A fault the run cannot continue past; the message is one line saying why and what was saved."""


@dataclass(frozen=True)
class FaultPlan:
    """The faults a run injects (module docstring); none by default."""
    nonfinite_steps: frozenset[int] = frozenset()
    checkpoint_write_step: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FaultPlan:
        """The plan `RSTAR2_FAULT_NONFINITE_STEPS` (comma-separated) and `RSTAR2_FAULT_CHECKPOINT_WRITE`
        name; an unset one injects nothing."""
        raw = env.get(FAULT_NONFINITE_ENV, "").strip()
        try:
            steps = frozenset(int(x) for x in raw.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{FAULT_NONFINITE_ENV}={raw!r}: expected comma-separated step numbers") from None
        raw = env.get(FAULT_CHECKPOINT_WRITE_ENV, "").strip()
        try:
            write = int(raw) if raw else None
        except ValueError:
            raise ValueError(f"{FAULT_CHECKPOINT_WRITE_ENV}={raw!r}: expected a step number") from None
        return cls(steps, write)


class NonfiniteSteps:
    """Steps whose optimizer step was skipped for a NaN/inf loss or gradient norm: all of them, and
    the streak in a row (a step that trained nothing neither extends nor ends it). `inject`: the
    steps given NaN advantages (`FaultPlan.nonfinite_steps`)."""

    def __init__(self, limit: int, inject: frozenset[int] = frozenset()):
        self.limit, self.inject = limit, inject
        self.total = self.streak = 0

    def advantages(self, step: int, advantages: list[float]) -> list[float]:
        """`advantages`, or NaNs where step `step` (1-based) is injected."""
        return [float("nan")] * len(advantages) if step in self.inject else advantages

    def count(self, step: int, update: Mapping[str, float]) -> dict[str, float]:
        """Count step `step`'s update; its `faults/nonfinite_steps` column."""
        if update.get("nonfinite_skipped", 0.0) > 0:
            self.total += 1
            self.streak += 1
            log.warning("step %d: non-finite loss (%s) or gradient norm (%s): optimizer step skipped "
                        "(%d in a row, train.max_nonfinite_steps=%d)", step, update.get("loss"),
                        update.get("grad_norm"), self.streak, self.limit)
        elif update.get("optimizer_steps", 0.0) > 0:
            self.streak = 0
        return {"faults/nonfinite_steps": float(self.total)}

    @property
    def exhausted(self) -> bool:
        return self.streak >= self.limit

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "streak": self.streak}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.total, self.streak = int(state.get("total", 0)), int(state.get("streak", 0))
