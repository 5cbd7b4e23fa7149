"""The GRPO-RoC step (the paper's and the release's) and the run around it.

One step, `RLTrainer.train_step`, in the paper's order, one call each (paths under rl/):
  1. next batch: `train.prompts_per_step` prompts from the seeded, resumable sampler (`run/sampler.py`);
  2. roll out: oversample x G trajectories per prompt of this node's shard, through the agent loop
     on the fleet's vLLM engines and the sandbox (`rollout/batch_rollout.py`, `rollout/fleet.py`);
  3. grade: the binary outcome reward of each (`rollout/batch_rollout.grade`, `reward/`);
     1-3 come from the run's batch source (`run/batch_source.py`): now, on the trainer's thread (the
     paper's), or rolled out up to `train.max_staleness` steps ahead (experimental, `run/rollout_ahead.py`);
  4. RoC: each group down to G (`selection/roc.py`; plain GRPO keeps the first G);
  5. advantages: group-normalised over the kept G (`update/loss.py`);
     4-5, the host's summary and its rollout-log sample are one call (`selection/host_selection.py`);
  6. exchange: each rank receives exactly the trajectories it trains (`ranks/exchange.py`);
  7. update: the policy on this rank's shard (`update/policy.py`; FSDP2 under torchrun);
  8. push: the new weights into the engines (`run/rollout_side.py`, `rollout/weight_sync/`);
  9. log: a sample of its rollouts with their log-prob gaps (`logs/rollout_log.py`), the step's row
     (`selection/step_summary.py`, `logs/writer.py`); every `train.eval_every` steps the held-out
     sets (`run/validation.py`);
 10. checkpoint every `train.save_every` steps (`update/checkpoint.py`).
Steps 2-5 run on each node's rollout host over its own shard of the prompts (`ranks/rollout_hosts.py`);
metrics stay on rank 0; every rank writes its own shards of a checkpoint. A step whose groups are
all filtered out (equal rewards, infrastructure failures) trains nothing: no optimizer, LR or
weight step (`train/skipped_empty` = 1). Step numbers: `self.step` counts the steps trained (the
weights' version, the index of the next batch); the step training batch `index` is step
`index + 1` in every log, checkpoint and message.

Faults (`faults.py`): SIGTERM or SIGUSR1 ends the run at the next step boundary with a
checkpoint and exit code 75 (`preemption.py`); `--resume auto` continues from `latest`
(`resume.py`). A NaN/inf step takes no optimizer step; `train.max_nonfinite_steps` in a row, a
remote sandbox down for longer than `sandbox.outage_s`, a checkpoint that cannot be written, an
engine death past `engine.max_restarts` (`rollout/engine_health.py`: a dead engine is restarted with
the current weights and its trajectories rolled out again), a weight push that failed on a
host (every rank stops with the same line naming the node: `rollout_side.push_weights`) or the
tool-loop alarm with `train.stop_on_tool_loop` (`logs/loop_alarm.py`) checkpoint and abort (`RunAborted`).
Injected faults come in `Collaborators.faults` (`faults.FaultPlan`).
"""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from rich.console import Console
from transformers import AutoTokenizer

from rstar2_cli.config import RecipeConfig
from rstar2_cli.data.problems import load_problems
from rstar2_cli.rl.update import checkpoint
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.batch_source import BatchSource, RolloutInputs, RolloutNow
from rstar2_cli.rl.ranks.cpu_threads import TrainerThreads
from rstar2_cli.rl.ranks.exchange import HostFailure, HostFailures, HostSelection, StepShard, exchange
from rstar2_cli.rl.run.faults import NonfiniteSteps, RunAborted
from rstar2_cli.rl.selection.host_selection import select_on_host
from rstar2_cli.rl.logs.writer import MetricsWriter
from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rl.update.policy import UpdateResult, policy_for
from rstar2_cli.rl.run.preemption import Preempted, PreemptionWatch
from rstar2_cli.rl.run.resume import resume_mode, start_run
from rstar2_cli.rl.run.rollout_ahead import RolloutAhead
from rstar2_cli.rl.ranks.rollout_hosts import plan_rollout_host
from rstar2_cli.rl.logs.rollout_log import RolloutLog, StepLog
from rstar2_cli.rl.run.rollout_side import (Collaborators, RolloutSide, WeightPushFailed, push_weights,
                                        sandbox_down_for, start_rollout_side)
from rstar2_cli.rl.run.sampler import DataSampler
from rstar2_cli.rl.run.stages import banner_text
from rstar2_cli.rl.selection.step_summary import step_columns
from rstar2_cli.rl.logs.loop_alarm import ToolLoopAlarm
from rstar2_cli.rl.run.validation import check_eval_sets, merge_validation, validate_share, validation_due
from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

__all__ = ["RLTrainer", "RunAborted", "resume_mode"]

log = logging.getLogger(__name__)


def batch_source_for(cfg: RecipeConfig) -> BatchSource:
    """The recipe's batch source: `train.max_staleness` = 0 rolls each batch out at its own step
    (`RolloutNow`, the paper's), >= 1 up to k steps ahead (`RolloutAhead`, experimental)."""
    if cfg.train.max_staleness:
        return RolloutAhead(cfg.train.max_staleness, partial=cfg.train.partial_rollout)
    return RolloutNow()


class RLTrainer:
    """Owns the policy, the rollout side, the data order and the metrics of one RL run.
    `source`: where each step's graded rollouts come from (`batch_source.py`; by default the one
    the recipe's `train.max_staleness` asks for). `collaborators`: what the run is built from besides the
    recipe (`rollout_side.Collaborators`)."""

    def __init__(self, cfg: RecipeConfig, *, source: BatchSource | None = None, resume: bool | str = False,
                 progress: bool = True, on_step: Callable[[int, dict], None] | None = None,
                 collaborators: Collaborators = Collaborators()):
        self.cfg, self.progress, self.on_step, self.collaborators = cfg, progress, on_step, collaborators
        self.source = source if source is not None else batch_source_for(cfg)
        self.out_dir = Path(cfg.train.out_dir)
        self.info = rl_dist.setup_distributed()     # torchrun: this rank joins the process group
        # bad data (the training set, a held-out set) fails here, before any model is loaded
        self.problems = load_problems(cfg.data.train, data_dir=cfg.data.data_dir)
        check_eval_sets(cfg)
        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.host = plan_rollout_host(cfg.engine, os.environ)    # a bad launch env fails here too
        # before the engines start (rl/ranks/cpu_threads.py): the update takes every CPU, engines idle
        self.threads = TrainerThreads(cfg.train.cpu_threads, self.info.device, engines_here=bool(self.host.engines),
                                      overlapped=self.source.overlapped, tensor_parallel_size=self.host.tp_size)
        self.policy = policy_for(cfg, self.info)
        if self.info.is_main:
            log.info("attention: %s", self.policy.attention.reason)
        self.sampler = DataSampler(len(self.problems), min(cfg.train.prompts_per_step, len(self.problems)),
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.nonfinite = NonfiniteSteps(cfg.train.max_nonfinite_steps, collaborators.faults.nonfinite_steps)
        self.tool_loop = ToolLoopAlarm(cfg.train.tool_loop_baseline_steps, cfg.train.tool_loop_factor)
        self.tool_loop_alarm: str | None = None           # this step's alarm line (rl/logs/loop_alarm.py)
        start = start_run(cfg, resume, self.policy, self.sampler, is_main=self.info.is_main)
        self.step = start.step                            # steps trained = the weights' version
        self.last_checkpoint, self.saved_step = start.checkpoint, start.step   # what is on disk now
        self.nonfinite.load_state_dict(start.extra.get("nonfinite", {}))
        self.tool_loop.load_state_dict(start.extra.get("tool_loop", {}))
        self.writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    enabled=self.info.is_main, live=progress)
        if resume_mode(resume):   # rows a stopped run wrote after its last checkpoint are written again
            self.writer.keep_through(self.step if start.checkpoint is not None else None)
        if self.info.is_main and progress:
            Console(stderr=True).rule(banner_text(cfg, self.step))
        self.side: RolloutSide = start_rollout_side(
            cfg, self.host, self.info, model=self.policy.model, weights=start.engine_weights, version=self.step,
            collaborators=collaborators, pause_for_updates=self.source.overlapped, partial=self.source.partial)
        self.step_log = StepLog(RolloutLog(self.out_dir, self.problems, self.tokenizer, count=cfg.train.log_rollouts,
                                           seed=cfg.train.seed, roc_mode=cfg.roc.mode) if self.host.is_host else None,
                                count=cfg.train.log_rollouts, hosts=self.side.host_ranks, rank=self.info.rank,
                                node=self.host.node_index)
        self.source.attach(RolloutInputs(cfg, self.problems, self.tokenizer, self.sampler, self.host, self.side,
                                         collaborators.grade, progress), first_index=self.step, resumed=start.extra)
        self._restarts_seen = 0                           # the fleet's restarts already logged

    def close(self) -> None:
        self.source.close()
        self.side.close()
        self.writer.close()
        self.threads.restore()

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """One GRPO-RoC step, in the paper's order (module docstring)."""
        cfg, host, timer = self.cfg, self.host, StepTimer()
        index, step = self.step, self.step + 1   # the batch (= the weights' version rolling it out), the step's number
        # 1-3. next batch, rolled out and graded: now, or ahead of the step (the batch source)
        graded_batch = self.source.batch(index)             # every rank draws it alike
        mine: HostSelection | HostFailure | None = None
        report = None                                      # an ahead-of-time source's staleness report
        if host.is_host:
            with HostFailures(host.node_index) as caught:   # distributed: raised on every rank in 6.
                graded = graded_batch()
                report = graded.report
                # 4-5. RoC down to G, advantages over the kept G, the host's summary and rollout-log sample
                mine = select_on_host(graded, cfg, index=index, node=host.node_index,
                                      pick=self.step_log.picker(step), timer=timer)
            mine = caught.failure or mine
        # 6. exchange: every rank receives the trajectories it trains
        shard = exchange(mine, self.side.host_ranks, self.info.rank, self.info.world_size, cfg.train.ppo_mini_batches)
        # 7. update the policy, 8. push its weights into the engines (nothing to learn: neither)
        update = self._update_and_push(shard, timer, step) if shard.kept else self._keep_weights(shard, step)
        self.source.after_update(step)
        # 9. log: the rollout sample, the step's row, the held-out sets when due
        with timer("rollout_log"):
            self.step_log.write(step, update.gaps, trained=bool(shard.kept))
        timer.stop()
        metrics = step_columns(step, shard.summaries, update, timer)
        metrics.update(self.source.columns(report, timer.seconds.get("sync", 0.0)))
        metrics.update(self._fault_columns(shard, update))
        metrics.update(self.validate_if_due())
        self._write_row(metrics)
        # 10. checkpoint
        self._save_if_due()
        return metrics

    def _save_if_due(self) -> None:
        if self.step % self.cfg.train.save_every == 0 and self.step < self.cfg.train.steps:
            self.save()

    def _update_and_push(self, shard: StepShard, timer: StepTimer, step: int) -> UpdateResult:
        """7-8: the update on this rank's shard (colocated on GPU: the engines sleep meanwhile), then
        the push (colocated: the engines woken for it); no engine restart reads the weights between.
        After the update the weights are version `step`, even if the push fails: the abandoning
        checkpoint is this step's, and its batch is not drawn again on resume."""
        advantages = self.nonfinite.advantages(step, shard.advantages)
        with self.side.fleet.lock:
            with timer("train"):
                self.side.fleet.sleep()
                with self.threads.alone():
                    update = self.policy.update(shard.trajectories, advantages, shard.mini_batches)
            self.step = step
            with timer("sync"):
                push_weights(self.side.fleet, self.policy, self.host.is_host, node=self.host.node_index)
        return update

    def _keep_weights(self, shard: StepShard, step: int) -> UpdateResult:
        """Every group filtered out: no optimizer, LR or weight step; the weights are the next version."""
        dropped = {k[len("roc/dropped_"):]: int(v) for s in shard.summaries for k, v in s.roc.items()
                   if k.startswith("roc/dropped_") and v}
        log.warning("step %d: no group left after filtering (%s): skipped, no optimizer or LR step",
                    step, ", ".join(f"{k} {v}" for k, v in dropped.items()) or "no groups")
        self.side.fleet.keep_weights()
        self.step = step
        return UpdateResult()

    def _fault_columns(self, shard: StepShard, update: UpdateResult) -> dict[str, float]:
        """The step's skipped, non-finite and engine-restart columns."""
        out = {"train/skipped_empty": float(not shard.kept), **self.nonfinite.count(self.step, update)}
        restarts = self.side.fleet.restarts     # per process: a resumed run counts from 0
        out["faults/engine_restarts"] = float(restarts - self._restarts_seen)
        self._restarts_seen = restarts
        return out

    def _write_row(self, metrics: dict[str, float]) -> None:
        """The step's row, with the tool-loop alarm's column (and its line when it fires)."""
        self.tool_loop_alarm = self.tool_loop.observe(self.step, metrics)
        metrics["tools/loop_alarm"] = float(self.tool_loop.above)
        self.writer.write(self.step, metrics)
        if self.tool_loop_alarm:
            self.writer.note(self.tool_loop_alarm)
        if self.on_step is not None and self.info.is_main:
            self.on_step(self.step, metrics)

    # ------------------------------------------------------------------ around the steps
    def validate_if_due(self) -> dict[str, float]:
        """The held-out columns when `train.eval_every` asks for them at this step (`validate`)."""
        return self.validate() if validation_due(self.cfg, self.step) else {}

    def validate(self) -> dict[str, float]:
        """Held-out eval of the current policy (`validation.py`): each rollout host evaluates its share
        of every set on its own engines and sandbox; every rank waits for the hosts (heartbeats:
        `rl_dist.gather_from`), rank 0 merges and returns the metrics, the other ranks {}."""
        timer, side = StepTimer(), self.side
        with timer("eval"):
            share = None
            if self.host.is_host:
                share = validate_share(self.cfg, side.fleet.engines, side.tools, self.step, self.out_dir,
                                       host=side.host_ranks.index(self.info.rank), hosts=len(side.host_ranks),
                                       progress=self.progress)
            shares = rl_dist.gather_from(share, side.host_ranks, dst=0)
            if shares is None:
                return {}
            metrics = merge_validation(self.cfg, shares, side.fleet.engines, side.tools, self.step, self.out_dir)
        metrics.update(timer.sections())
        return metrics

    def _checkpoint_extra(self) -> tuple[dict, dict]:
        """(the sampler's state, the trainer's and the source's extras) a checkpoint of this step holds."""
        sampler_state, extra = self.source.checkpoint_state()
        return sampler_state, {"nonfinite": self.nonfinite.state_dict(), "tool_loop": self.tool_loop.state_dict(),
                               **extra}

    def save(self, final: bool = False) -> Path:
        target = self.out_dir / ("final" if final else f"step_{self.step:06d}")
        sampler_state, extra = self._checkpoint_extra()
        try:
            checkpoint.save_checkpoint(target, self.policy, self.tokenizer, sampler_state, self.step,
                                       final=final, extra=extra, keep=self.cfg.train.keep_checkpoints,
                                       fail_write=self.collaborators.faults.checkpoint_write_step == self.step)
        except checkpoint.CheckpointWriteError as e:   # a full disk: the previous checkpoint is intact
            raise RunAborted(f"step {self.step}: {e}") from None
        self.last_checkpoint, self.saved_step = target, self.step
        return target

    def _saved(self) -> Path | None:
        """A checkpoint of the current step: written now unless it is on disk already."""
        return self.save() if self.step != self.saved_step else self.last_checkpoint

    def _abort_if_needed(self) -> None:
        """`RunAborted` (after a checkpoint) for the faults the run cannot continue past (`faults.py`)."""
        cfg = self.cfg
        if self.nonfinite.exhausted:
            raise RunAborted(f"step {self.step}: {self.nonfinite.streak} steps in a row with a non-finite loss or "
                             f"gradient norm (train.max_nonfinite_steps={cfg.train.max_nonfinite_steps}); "
                             f"{self._saved()} holds the last finite weights")
        if self.tool_loop_alarm and cfg.train.stop_on_tool_loop:
            raise RunAborted(f"{self.tool_loop_alarm} (train.stop_on_tool_loop); {self._saved()} holds step "
                             f"{self.step}")
        down = sandbox_down_for(cfg, self.side.tools)
        if down > cfg.sandbox.outage_s:
            raise RunAborted(f"step {self.step}: sandbox {cfg.sandbox.url} down for {down:.0f}s, every call failing "
                             f"(sandbox.outage_s={cfg.sandbox.outage_s:g}); {self._saved()} holds step "
                             f"{self.saved_step}")

    def train(self) -> Path:
        """Run until train.steps; checkpoint every save_every steps and at the end. Raises
        `preemption.Preempted` after the checkpoint a preemption signal asks for, and `RunAborted`
        (module docstring)."""
        watch = PreemptionWatch(self.cfg.train.preempt_grace_s).install()
        try:
            if self.step == 0 and validation_due(self.cfg, 0):
                self.writer.write(0, {"step": 0.0, **self.validate()})
            while self.step < self.cfg.train.steps:
                if watch.agreed():   # every rank, every step boundary: all stop at the same step
                    raise Preempted(self.step, self._saved(), watch.signal_name)
                failing = self.step + 1
                try:
                    self.train_step()
                # an engine death in the rollout: its batch is drawn again on resume; at the push: the next one
                except (EngineRestartsExhausted, WeightPushFailed) as e:
                    self.source.abandon(self.step)     # a batch not trained is drawn again on resume
                    saved = self._saved()
                    if watch.signalled is not None:   # SIGTERM to every process of a preempted job
                        raise Preempted(self.step, saved, watch.signal_name) from None
                    raise RunAborted(f"step {failing}: {e}; {saved or 'no checkpoint (no step ran)'} "
                                     f"holds step {self.step}") from None
                self._abort_if_needed()
            return self.save(final=True)
        finally:
            try:
                self.writer.plot()
            except Exception as e:   # a missing plotting backend must not hide the run's own outcome
                log.warning("curves.png not written: %r", e)
            try:
                self.close()
            finally:                 # after close: a shutdown that hangs past the grace still exits 75
                watch.uninstall()
