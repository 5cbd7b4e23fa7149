"""Where a step's batch comes from: the synchronous step's direct call, or the asynchronous pipeline.

`train.max_staleness` = k. At k = 0 (the paper's and the release's step, the default) a step
draws its prompts, and each rollout host rolls out and grades its node-shard of them, in the step
itself, by a direct call (`SyncRollouts`): nothing runs ahead, nothing rolls out during the
update, a held-out eval or a checkpoint. At k >= 1 (experimental, `rl/async_rollouts.py`) batches
are rolled out up to k steps ahead while earlier steps train. The trainer sees one interface
(`RolloutSource`), so the step reads the same either way and the asynchronous machinery (futures,
batches in flight, staleness) stays in its own module.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rstar2_cli.rl.shards import Piece, Rolled, StepShard


class RolloutSource(Protocol):
    """What the trainer asks of the rollout side, step after step."""

    def next_batch(self, step: int) -> Rolled:
        """Step `step`'s batch (batch `step` of the data order), rolled out and graded."""

    def after_update(self, version: int) -> None:
        """The engines hold `version` now (k >= 1: start the batches it admits)."""

    def overlap_metrics(self, shard: StepShard, weight_pause_s: float) -> dict[str, float]:
        """The step's async/ columns ({} at k = 0)."""

    def checkpoint_state(self, gather: Callable[[Any], list[Any]], is_host: bool) -> dict[str, Any] | None:
        """What a checkpoint keeps of the rollouts in flight (None: nothing)."""

    def load_checkpoint_state(self, saved: dict[str, Any], step: int, host_ordinal: int | None,
                              num_hosts: int) -> str | None:
        """Put a checkpoint's rollouts back, or rewind the sampler to draw them again and say why."""

    def abandon(self, step: int) -> None:
        """Give up batch `step` (and any ahead of it): the sampler moves back to before it."""

    def cancel(self) -> None:
        """Stop waiting for anything in flight (closing down)."""


class SyncRollouts:
    """k = 0: each step draws its batch and rolls it out by a direct call on the rollout service
    (`RolloutService.roll_out`: rolled out and graded before it returns)."""

    def __init__(self, sampler: Any, rollouts: Any):
        self.sampler, self.rollouts = sampler, rollouts
        self._before: tuple[int, dict] | None = None     # (step, sampler state before its draw)

    def next_batch(self, step: int) -> Rolled:
        self._before = (step, self.sampler.state_dict())
        return Rolled(self.rollouts.roll_out(step, self.sampler.next_batch()))

    def after_update(self, version: int) -> None:
        return None

    def overlap_metrics(self, shard: StepShard, weight_pause_s: float) -> dict[str, float]:
        return {}

    def checkpoint_state(self, gather: Callable[[Any], list[Any]], is_host: bool) -> None:
        return None

    def load_checkpoint_state(self, saved: dict[str, Any], step: int, host_ordinal: int | None,
                              num_hosts: int) -> str | None:
        """A checkpoint of an asynchronous run holds batches rolled out ahead: a synchronous run
        draws them again (the sampler moves back to before them) and rolls them out itself."""
        if not saved["batches"]:
            return None
        self.sampler.load_state_dict(saved["sampler_before"])
        return "train.max_staleness=0 rolls each batch out with the weights that train it"

    def abandon(self, step: int) -> None:
        if self._before is not None and self._before[0] == step:
            self.sampler.load_state_dict(self._before[1])

    def cancel(self) -> None:
        return None


def rollout_source(max_staleness: int, total_steps: int, sampler: Any, rollouts: Any, *, first_index: int,
                   partial: bool) -> RolloutSource:
    """The source for `train.max_staleness`: the direct call at 0, the asynchronous pipeline above."""
    if not max_staleness:
        return SyncRollouts(sampler, rollouts)
    from rstar2_cli.rl.async_rollouts import RolloutPipeline

    return RolloutPipeline(max_staleness, total_steps, sampler, rollouts, first_index=first_index, partial=partial)
