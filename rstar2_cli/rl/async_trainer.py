"""The asynchronous GRPO-RoC step (experimental; `train.max_staleness` = k >= 1): batches rolled out
up to k steps ahead on the rollout thread while earlier steps train. `async_rollouts.py` says how
it runs (the in-order rule, staleness, partial rollouts, checkpoints); this is the step.

One step: take batch `step` from the pipeline (rolled out and graded ahead, on the rollout
thread) -> drop its groups staler than k -> RoC -> advantages -> exchange -> update -> push (the
engines pause for it instead of idling) -> start the batches the new weights admit -> log, with
the async/ columns -> checkpoint (the batches in flight with it). Everything else is the
synchronous trainer's (`trainer.RLTrainer`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.async_rollouts import Piece, RolloutPipeline
from rstar2_cli.rl.cpu_threads import TrainerThreads
from rstar2_cli.rl.exchange import HostFailure, HostFailures, HostSelection, exchange
from rstar2_cli.rl.loss import advantages_for_groups
from rstar2_cli.rl.metrics import StepTimer
from rstar2_cli.rl.roc import group_rng, select_for_training
from rstar2_cli.rl.rollout_side import RolloutSide, start_rollout_side
from rstar2_cli.rl.step_summary import step_columns, summarise
from rstar2_cli.rl.trainer import RLTrainer
from rstar2_cli.rollout.roll_out import roll_out

log = logging.getLogger(__name__)


class AsyncRLTrainer(RLTrainer):
    """`RLTrainer` with its batches rolled out ahead (module docstring)."""

    def __init__(self, cfg: RecipeConfig, **kwargs: Any):
        super().__init__(cfg, **kwargs)
        self.side.start_thread()
        self.pipeline = RolloutPipeline(cfg.train.max_staleness, cfg.train.steps, self.sampler, self,
                                        first_index=self.step, partial=cfg.train.partial_rollout)
        saved = self.resumed.get("pending_rollouts")
        if saved is not None:
            ordinal = self.side.host_ranks.index(self.info.rank) if self.host.is_host else None
            why = self.pipeline.load_checkpoint_state(saved, self.step, ordinal, len(self.side.host_ranks))
            if why:
                log.warning("resume: the %d saved rollout batch(es) are drawn again and rolled out by the "
                            "resumed weights (%s)", len(saved["batches"]), why)

    def _threads(self) -> TrainerThreads:
        return TrainerThreads(self.cfg.train.cpu_threads, self.info.device, engines_here=bool(self.host.engines),
                              overlapped=True, tensor_parallel_size=self.host.tp_size)

    def _start_rollout_side(self, weights: str) -> RolloutSide:
        return start_rollout_side(self.cfg, self.host, self.info, model=self.policy.model, weights=weights,
                                  version=self.step, parts=self.parts, pause_for_updates=True,
                                  partial=self.cfg.train.partial_rollout)

    # ------------------------------------------------------------------ what the pipeline asks
    def start(self, index: int, problem_indices: list[int]) -> concurrent.futures.Future | None:
        """Start this host's rollout and grading of batch `index` on the rollout thread; its future
        gives this host's `Piece`. None on ranks that are not rollout hosts."""
        if not self.host.is_host:
            return None
        return asyncio.run_coroutine_threadsafe(self._produce(index, problem_indices), self.side.loop)

    async def _produce(self, index: int, problem_indices: list[int]) -> Piece:
        cfg, side, timer = self.cfg, self.side, StepTimer()
        batch = [self.problems[i] for i in problem_indices]
        positions = self.host.prompt_positions(len(batch))
        with timer("rollout"):
            trajs = await roll_out(batch, positions, side.fleet, side.tools, self.tokenizer, cfg, index=index,
                                   node=self.host.node_index, priority=index if cfg.train.partial_rollout else 0)
        with timer("reward"):
            await asyncio.to_thread(self.parts.grade, trajs, cfg.reward)
        return Piece(positions, trajs, timer.sections())

    def settle(self, result: Callable[[], Piece]) -> Piece | HostFailure | None:
        """This host's piece from `result()`, or (distributed) its failure; None off-host."""
        if not self.host.is_host:
            return None
        with HostFailures(self.host.node_index) as caught:
            return result()
        return caught.failure

    def busy_seconds(self) -> list[float]:
        return self.side.fleet.busy_seconds()

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """One asynchronous step (module docstring)."""
        cfg, side, host, timer = self.cfg, self.side, self.host, StepTimer()
        piece = self.pipeline.next_batch(self.step)
        mine, report, records = piece, None, None
        if isinstance(piece, Piece):
            with HostFailures(host.node_index) as caught:
                seen, report = self.pipeline.drop_stale(piece.trajectories, self.step)
                roc = select_for_training(seen, cfg.roc, cfg.train.group_size, group_rng(cfg.train.seed, self.step))
                advantages = advantages_for_groups(roc.groups)
                mine = HostSelection(roc.trajectories, advantages, summarise(
                    host.node_index, len(piece.trajectories), seen, roc, piece.seconds,
                    cfg.rollout.max_response_tokens))
                records = self.rollout_log.pick(seen, roc.trajectories, advantages, step=self.step + 1,
                                                node=host.node_index)
            mine = caught.failure or mine
        shard = exchange(mine, side.host_ranks, self.info.rank, self.info.world_size, cfg.train.ppo_mini_batches)
        reports = rl_dist.broadcast_from_each(report, side.host_ranks)
        gaps: dict = {}
        update = self._update_and_push(shard, timer, gaps) if shard.kept else self._keep_weights(shard)
        self.pipeline.after_update(self.step + 1)      # the new version admits batches at once
        self._write_rollouts(records, gaps, shard, timer)
        timer.stop()
        self.step += 1
        metrics = step_columns(self.step, shard.summaries, update, timer)
        metrics.update(self.pipeline.overlap_metrics(reports, timer.seconds.get("sync", 0.0)))
        metrics = self._log(metrics, shard, update)
        self._save_if_due()
        return metrics

    # ------------------------------------------------------------------ around the steps
    def _checkpoint_extra(self) -> tuple[dict, dict]:
        """The batches in flight, finished first; the checkpoint's sampler position is before them."""
        _, extra = super()._checkpoint_extra()
        pending = self.pipeline.checkpoint_state(
            lambda mine: rl_dist.broadcast_from_each(mine, self.side.host_ranks), self.host.is_host)
        extra["pending_rollouts"] = pending
        return pending["sampler_before"], extra

    def _abandon_batch(self) -> None:
        self.pipeline.abandon(self.step)

    def close(self) -> None:
        self.pipeline.cancel()
        super().close()
