"""The ahead-of-time batch source (experimental; `train.max_staleness` = k >= 1): batches rolled
out up to k steps ahead on the rollout thread while earlier steps train (`batch_source.py` says
what a source is; `async_rollouts.py` how the pipeline runs: the in-order rule, staleness,
partial rollouts, checkpoints).

For each step the source gives its batch, rolled out and graded ahead, with the groups staler
than k dropped; the rollout loop runs in a thread of its own, the engines pause for each weight
load instead of idling (`overlapped`), the batches the new weights admit start right after it,
and a checkpoint holds the batches in flight.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from typing import Any, Callable

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.async_rollouts import RolloutPipeline
from rstar2_cli.rl.run.batch_source import RolloutInputs, roll_out_and_grade
from rstar2_cli.rl.selection.host_selection import GradedBatch

log = logging.getLogger(__name__)


class RolloutAhead:
    """Batches rolled out up to `max_staleness` steps ahead (module docstring)."""
    overlapped = True

    def __init__(self, max_staleness: int, *, partial: bool = False):
        self.max_staleness, self.partial = max_staleness, partial
        self.run: RolloutInputs | None = None
        self.pipeline: RolloutPipeline | None = None

    def attach(self, run: RolloutInputs, *, first_index: int, resumed: Mapping[str, Any]) -> None:
        """Start the rollout thread and the pipeline at batch `first_index`; a checkpoint's batches
        in flight (`resumed["pending_rollouts"]`) go back in flight when this run can use them."""
        self.run = run
        run.side.start_thread()
        self.pipeline = RolloutPipeline(self.max_staleness, run.cfg.train.steps, run.sampler, self,
                                        first_index=first_index, partial=self.partial)
        saved = resumed.get("pending_rollouts")
        if saved is not None:
            hosts = run.side.host_ranks
            ordinal = hosts.index(rl_dist.process_info().rank) if run.host.is_host else None
            why = self.pipeline.load_checkpoint_state(saved, first_index, ordinal, len(hosts))
            if why:
                log.warning("resume: the %d saved rollout batch(es) are drawn again and rolled out by the "
                            "resumed weights (%s)", len(saved["batches"]), why)

    # ------------------------------------------------------------------ what the pipeline asks
    def start(self, index: int, problem_indices: list[int]) -> concurrent.futures.Future | None:
        """Start this host's rollout and grading of batch `index` on the rollout thread; its future
        gives this host's `Piece`. None on ranks that are not rollout hosts."""
        if not self.run.host.is_host:
            return None
        coro = roll_out_and_grade(self.run, problem_indices, index, priority=index if self.partial else 0,
                                  overlapped=True)
        return asyncio.run_coroutine_threadsafe(coro, self.run.side.loop)

    def busy_seconds(self) -> list[float]:
        return self.run.side.fleet.busy_seconds()

    # ------------------------------------------------------------------ what the step asks
    def batch(self, index: int) -> Callable[[], GradedBatch]:
        pending = self.pipeline.next_batch(index)

        def graded() -> GradedBatch:
            piece = self.pipeline.wait(pending)
            seen, report = self.pipeline.drop_stale(piece.trajectories, index)
            return GradedBatch(seen, len(piece.trajectories), dict(piece.seconds), report)
        return graded

    def after_update(self, version: int) -> None:
        self.pipeline.after_update(version)      # the new version admits batches at once

    def columns(self, report: Any, weight_pause_s: float) -> dict[str, float]:
        """The async/ columns: every host's staleness report (a collective) and the overlap."""
        reports = rl_dist.broadcast_from_each(report, self.run.side.host_ranks)
        return self.pipeline.overlap_metrics(reports, weight_pause_s)

    def checkpoint_state(self) -> tuple[dict, dict]:
        """The batches in flight, finished first; the checkpoint's sampler position is before them."""
        pending = self.pipeline.checkpoint_state(
            lambda mine: rl_dist.broadcast_from_each(mine, self.run.side.host_ranks), self.run.host.is_host)
        return pending["sampler_before"], {"pending_rollouts": pending}

    def abandon(self, index: int) -> None:
        self.pipeline.abandon(index)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.cancel()
