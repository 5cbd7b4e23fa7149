"""Where a step's graded rollouts come from: the one thing the synchronous and the asynchronous
step differ in.

`RolloutNow` (`train.max_staleness` = 0, the paper's and the release's step): the step draws its
batch, and each rollout host rolls its shard out and grades it now, on the trainer's thread.
`rollout_ahead.RolloutAhead` (k >= 1, experimental): batches drawn and rolled out up to k steps
ahead on the rollout thread; a step takes its own batch with the groups staler than k dropped.
`RLTrainer(cfg, source=...)` takes either; by default the one the recipe asks for
(`trainer.batch_source_for`).

What the step (`trainer.RLTrainer.train_step`) asks of a source, every rank in the same order:
  - `batch(index)`: draw batch `index` (the sampler's, alike on every rank); on a rollout host,
    calling the result gives this host's `GradedBatch` (both sources roll out and grade with
    `roll_out_and_grade`);
  - `after_update(version)`: the weights are now `version`;
  - `columns(report, weight_pause_s)`: the source's own columns of the step (a collective for
    the ahead-of-time source, {} for this one);
  - `checkpoint_state()`, `abandon(index)`, `close()`.
A source is built from the recipe alone; the run attaches what it rolls out with (`RolloutInputs`)
once its engines are up.
"""
from __future__ import annotations

import asyncio

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rstar2_cli.config import RecipeConfig, RewardConfig
from rstar2_cli.rl.selection.host_selection import GradedBatch
from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rl.run.async_rollouts import Piece
from rstar2_cli.rl.ranks.rollout_hosts import RolloutHostPlan
from rstar2_cli.rl.run.rollout_side import RolloutSide
from rstar2_cli.rl.run.sampler import DataSampler
from rstar2_cli.rollout.batch_rollout import roll_out
from rstar2_cli.rollout.trajectory import Trajectory

GradedFn = Callable[[], GradedBatch]


@dataclass(frozen=True)
class RolloutInputs:
    """What a source rolls out from: the run's recipe, problems, tokenizer and sampler, this rank's
    place (`host`) and rollout side, and the grader (`Collaborators.grade`)."""
    cfg: RecipeConfig
    problems: Sequence[Any]
    tokenizer: Any
    sampler: DataSampler
    host: RolloutHostPlan
    side: RolloutSide
    grade: Callable[[Sequence[Trajectory], RewardConfig], None]
    progress: bool = False


async def roll_out_and_grade(run: RolloutInputs, problem_indices: Sequence[int], index: int, *, priority: int = 0,
                             progress: bool = False, overlapped: bool = False) -> Piece:
    """Steps 2-3 on this rollout host, for either source: its shard of batch `index` (the problems
    `problem_indices`) rolled out and graded, each timed. `priority`: the engines' request priority.
    `overlapped`: grade in a worker thread, so the loop's other batches roll on meanwhile; else on
    the calling thread (the synchronous step starts no thread)."""
    cfg, side, timer = run.cfg, run.side, StepTimer()
    problems = [run.problems[i] for i in problem_indices]
    positions = run.host.prompt_positions(len(problems))
    with timer("rollout"):
        trajs = await roll_out(problems, positions, side.fleet, side.tools, run.tokenizer, cfg, index=index,
                               node=run.host.node_index, priority=priority, progress=progress)
    with timer("reward"):
        if overlapped:
            await asyncio.to_thread(run.grade, trajs, cfg.reward)
        else:
            run.grade(trajs, cfg.reward)
    return Piece(positions, trajs, timer.sections())


class BatchSource(Protocol):
    """The interface the step uses (module docstring)."""
    overlapped: bool       # rollouts run while the trainer updates (the engines pause for each load)
    partial: bool          # partial rollouts (train.partial_rollout)

    def attach(self, run: RolloutInputs, *, first_index: int, resumed: Mapping[str, Any]) -> None: ...
    def batch(self, index: int) -> GradedFn: ...
    def after_update(self, version: int) -> None: ...
    def columns(self, report: Any, weight_pause_s: float) -> dict[str, float]: ...
    def checkpoint_state(self) -> tuple[dict, dict]: ...
    def abandon(self, index: int) -> None: ...
    def close(self) -> None: ...


class RolloutNow:
    """The synchronous source: nothing runs ahead of the step (module docstring)."""
    overlapped = False
    partial = False

    def __init__(self) -> None:
        self.run: RolloutInputs | None = None
        self._before: tuple[int, dict] | None = None    # (batch index, the sampler's state before it)

    def attach(self, run: RolloutInputs, *, first_index: int, resumed: Mapping[str, Any]) -> None:
        """`first_index` and `resumed` say nothing here: the sampler's position is the checkpoint's
        (rollouts a k >= 1 checkpoint holds are drawn again)."""
        self.run = run

    def batch(self, index: int) -> GradedFn:
        run = self.run
        self._before = (index, run.sampler.state_dict())
        drawn = run.sampler.next_batch()

        def graded() -> GradedBatch:
            piece = run.side.run(roll_out_and_grade(run, drawn, index, progress=run.progress))
            return GradedBatch(piece.trajectories, len(piece.trajectories), piece.seconds)
        return graded

    def after_update(self, version: int) -> None:
        """Nothing is in flight to admit."""

    def columns(self, report: Any, weight_pause_s: float) -> dict[str, float]:
        return {}

    def checkpoint_state(self) -> tuple[dict, dict]:
        """(the sampler's state, nothing more): the next step draws the next batch."""
        return self.run.sampler.state_dict(), {}

    def abandon(self, index: int) -> None:
        """Batch `index` is drawn again on resume (an engine death the run cannot recover from):
        the sampler goes back to before it, if it was drawn."""
        if self._before is not None and self._before[0] == index:
            self.run.sampler.load_state_dict(self._before[1])

    def close(self) -> None:
        """Nothing of its own to stop."""

