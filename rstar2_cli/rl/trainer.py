"""The synchronous GRPO-RoC step (the paper's and the release's) and the run around it.

One step, `RLTrainer.train_step`, in the paper's order, one call each:
  1. next batch: `train.prompts_per_step` prompts from the seeded, resumable sampler (`sampler.py`);
  2. roll out: oversample x G trajectories per prompt of this node's shard, through the agent loop
     on the fleet's vLLM engines and the sandbox (`rollout/roll_out.py`, `rollout/fleet.py`);
  3. grade: the binary outcome reward of each (`rollout/roll_out.grade`, `reward/`);
  4. RoC: each group down to G (`roc.select_for_training`; plain GRPO keeps the first G);
  5. advantages: group-normalised over the kept G (`loss.advantages_for_groups`);
  6. exchange: each rank receives exactly the trajectories it trains (`exchange.py`);
  7. update: the policy on this rank's shard (`policy.py`; FSDP2 under torchrun);
  8. push: the new weights into the engines (`rollout_side.push_weights`, `rollout/weight_sync/`);
  9. log: the step's row (`step_summary.py`, `metrics.py`) and a sample of its rollouts
     (`rollout_log.py`); every `train.eval_every` steps the held-out sets (`validation.py`);
 10. checkpoint every `train.save_every` steps (`checkpoint.py`).
Steps 2-5 run on each node's rollout host over its own shard of the prompts (`rollout_hosts.py`);
metrics stay on rank 0; every rank writes its own shards of a checkpoint. A step whose groups are
all filtered out (equal rewards, infrastructure failures) trains nothing: no optimizer, LR or
weight step (`train/skipped_empty` = 1). Nothing runs ahead of the step: the roll-out is a plain
call on the trainer's thread. Rolling out ahead of the trainer (`train.max_staleness` >= 1) is
another trainer, `async_trainer.py`.

Faults (`faults.py`): SIGTERM or SIGUSR1 ends the run at the next step boundary with a
checkpoint and exit code 75 (`preemption.py`); `--resume auto` continues from `latest`
(`resume.py`). A NaN/inf step takes no optimizer step; `train.max_nonfinite_steps` in a row, a
remote sandbox down for longer than `sandbox.outage_s`, a checkpoint that cannot be written, an
engine death past `engine.max_restarts` (`rollout/engine_health.py`: a dead engine is restarted with
the current weights and its trajectories rolled out again), a weight push that failed on a
host (every rank stops with the same line naming the node: `rollout_side.push_weights`) or the
tool-loop alarm with `train.stop_on_tool_loop` (`tool_loop.py`) checkpoint and abort (`RunAborted`).
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

from rstar2_cli.config import RESOLVED_RECIPE, RecipeConfig, dump_recipe
from rstar2_cli.data.problems import load_problems
from rstar2_cli.rl import checkpoint
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.cpu_threads import TrainerThreads
from rstar2_cli.rl.exchange import HostFailure, HostFailures, HostSelection, StepShard, exchange
from rstar2_cli.rl.faults import NonfiniteSteps, RunAborted, fault_steps
from rstar2_cli.rl.logprob_gap import fill_logprob_gaps
from rstar2_cli.rl.loss import advantages_for_groups
from rstar2_cli.rl.metrics import MetricsWriter, StepTimer
from rstar2_cli.rl.policy import policy_for
from rstar2_cli.rl.preemption import Preempted, PreemptionWatch
from rstar2_cli.rl.stages import banner_text
from rstar2_cli.rl.resume import resume_mode, start_run
from rstar2_cli.rl.roc import group_rng, select_for_training
from rstar2_cli.rl.rollout_hosts import plan_rollout_host
from rstar2_cli.rl.rollout_log import RolloutLog
from rstar2_cli.rl.rollout_side import (Collaborators, RolloutSide, WeightPushFailed, push_weights,
                                        sandbox_down_for, start_rollout_side)
from rstar2_cli.rl.sampler import DataSampler
from rstar2_cli.rl.step_summary import step_columns, summarise
from rstar2_cli.rl.tool_loop import ToolLoopAlarm
from rstar2_cli.rl.validation import check_eval_sets, merge_validation, validate_share, validation_due
from rstar2_cli.rollout.engine_health import EngineRestartsExhausted
from rstar2_cli.rollout.roll_out import roll_out

__all__ = ["RLTrainer", "RunAborted", "resume_mode"]

log = logging.getLogger(__name__)


class RLTrainer:
    """Owns the policy, the rollout side, the data order and the metrics of one RL run.
    `parts`: what the run is built from besides the recipe (`rollout_side.Collaborators`)."""

    def __init__(self, cfg: RecipeConfig, *, resume: bool | str = False, progress: bool = True,
                 on_step: Callable[[int, dict], None] | None = None, parts: Collaborators = Collaborators()):
        self.cfg, self.progress, self.on_step, self.parts = cfg, progress, on_step, parts
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
        self.threads = self._threads()
        self.policy = policy_for(cfg, self.info)
        if self.info.is_main:
            log.info("attention: %s", self.policy.attention.reason)
        self.sampler = DataSampler(len(self.problems), min(cfg.train.prompts_per_step, len(self.problems)),
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.nonfinite = NonfiniteSteps(cfg.train.max_nonfinite_steps, fault_steps(os.environ))
        self.tool_loop = ToolLoopAlarm(cfg.train.tool_loop_baseline_steps, cfg.train.tool_loop_factor)
        self.tool_loop_alarm: str | None = None           # this step's alarm line (rl/tool_loop.py)
        self.rollout_log = (RolloutLog(self.out_dir, self.problems, self.tokenizer, count=cfg.train.log_rollouts,
                                       seed=cfg.train.seed, roc_mode=cfg.roc.mode) if self.host.is_host else None)
        start = start_run(cfg, resume, self.policy, self.sampler, is_main=self.info.is_main)
        self.step, self.resumed = start.step, start.extra
        self.last_checkpoint, self.saved_step = start.checkpoint, start.step   # what is on disk now
        self.nonfinite.load_state_dict(start.extra.get("nonfinite", {}))
        self.tool_loop.load_state_dict(start.extra.get("tool_loop", {}))
        self._sampler_before = self.sampler.state_dict()    # before the batch of the step running
        self.writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    enabled=self.info.is_main, live=progress)
        if resume_mode(resume):   # rows a stopped run wrote after its last checkpoint are written again
            self.writer.keep_through(self.step if start.checkpoint is not None else None)
        if self.info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / RESOLVED_RECIPE).write_text(dump_recipe(cfg))
            if progress:
                Console(stderr=True).rule(banner_text(cfg, self.step))
        self.side: RolloutSide = self._start_rollout_side(start.engine_weights)
        self._restarts_seen = 0                           # the fleet's restarts already logged

    def _threads(self) -> TrainerThreads:
        """Before the engines start (rl/cpu_threads.py): the update takes every CPU, engines idle."""
        return TrainerThreads(self.cfg.train.cpu_threads, self.info.device, engines_here=bool(self.host.engines),
                              tensor_parallel_size=self.host.tp_size)

    def _start_rollout_side(self, weights: str) -> RolloutSide:
        return start_rollout_side(self.cfg, self.host, self.info, model=self.policy.model, weights=weights,
                                  version=self.step, parts=self.parts)

    def close(self) -> None:
        self.side.close()
        self.writer.close()
        self.threads.restore()

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """One GRPO-RoC step, in the paper's order (module docstring)."""
        cfg, side, host, timer = self.cfg, self.side, self.host, StepTimer()
        # 1. next batch: the step's prompts, drawn alike on every rank
        self._sampler_before = self.sampler.state_dict()
        batch = [self.problems[i] for i in self.sampler.next_batch()]
        mine: HostSelection | HostFailure | None = None
        records = None                                       # this host's rollout-log sample
        if host.is_host:
            with HostFailures(host.node_index) as caught:   # distributed: raised on every rank in 6.
                # 2. roll out this node's shard of the prompts
                with timer("rollout"):
                    trajs = side.run(roll_out(batch, host.prompt_positions(len(batch)), side.fleet, side.tools,
                                              self.tokenizer, cfg, index=self.step, node=host.node_index,
                                              progress=self.progress))
                # 3. grade
                with timer("reward"):
                    self.parts.grade(trajs, cfg.reward)
                # 4. RoC: each group of oversample x G down to G
                roc = select_for_training(trajs, cfg.roc, cfg.train.group_size, group_rng(cfg.train.seed, self.step))
                # 5. advantages over the kept G
                advantages = advantages_for_groups(roc.groups)
                mine = HostSelection(roc.trajectories, advantages, summarise(
                    host.node_index, len(trajs), trajs, roc, timer.sections(), cfg.rollout.max_response_tokens))
                with timer("rollout_log"):
                    records = self.rollout_log.pick(trajs, roc.trajectories, advantages, step=self.step + 1,
                                                    node=host.node_index)
            mine = caught.failure or mine
        # 6. exchange: every rank receives the trajectories it trains
        shard = exchange(mine, side.host_ranks, self.info.rank, self.info.world_size, cfg.train.ppo_mini_batches)
        # 7. update the policy, 8. push its weights into the engines (nothing to learn: neither)
        gaps: dict = {}                                      # per trained trajectory (rl/logprob_gap.py)
        update = self._update_and_push(shard, timer, gaps) if shard.kept else self._keep_weights(shard)
        self._write_rollouts(records, gaps, shard, timer)
        timer.stop()
        self.step += 1
        # 9. log
        metrics = self._log(step_columns(self.step, shard.summaries, update, timer), shard, update)
        # 10. checkpoint
        self._save_if_due()
        return metrics

    def _write_rollouts(self, records: list | None, gaps: dict, shard: StepShard, timer: StepTimer) -> None:
        """After the update, every rank: the trained trajectories' log-prob gaps joined into the hosts'
        records (`logprob_gap.fill_logprob_gaps`, a collective), then each host's sample on disk."""
        with timer("rollout_log"):
            if self.cfg.train.log_rollouts > 0 and shard.kept:
                records = fill_logprob_gaps(records, gaps, hosts=self.side.host_ranks, rank=self.info.rank)
            if self.host.is_host:
                self.rollout_log.write(self.step + 1, self.host.node_index, len(self.side.host_ranks), records)

    def _save_if_due(self) -> None:
        if self.step % self.cfg.train.save_every == 0 and self.step < self.cfg.train.steps:
            self.save()

    def _update_and_push(self, shard: StepShard, timer: StepTimer, gaps: dict) -> dict[str, float]:
        """7-8: the update on this rank's shard (colocated on GPU: the engines sleep meanwhile; `gaps`
        filled per trajectory), then the push (colocated: the engines woken for it); no engine restart
        reads the weights between."""
        advantages = self.nonfinite.advantages(self.step + 1, shard.advantages)
        with self.side.fleet.lock:
            with timer("train"):
                self.side.fleet.sleep()
                with self.threads.alone():
                    update = self.policy.update(shard.trajectories, advantages, shard.mini_batches, gaps=gaps)
            with timer("sync"):
                try:
                    push_weights(self.side.fleet, self.policy, self.host.is_host, node=self.host.node_index)
                except (EngineRestartsExhausted, WeightPushFailed):   # the update stands: the abandoning
                    self.step += 1       # checkpoint is this step's, and its batch is not drawn again on resume
                    self._sampler_before = self.sampler.state_dict()
                    raise
        return update

    def _keep_weights(self, shard: StepShard) -> dict[str, float]:
        """Every group filtered out: no optimizer, LR or weight step; the weights are the next version."""
        dropped = {k[len("roc/dropped_"):]: int(v) for s in shard.summaries for k, v in s.roc.items()
                   if k.startswith("roc/dropped_") and v}
        log.warning("step %d: no group left after filtering (%s): skipped, no optimizer or LR step",
                    self.step + 1, ", ".join(f"{k} {v}" for k, v in dropped.items()) or "no groups")
        self.side.fleet.keep_weights()
        return {}

    def _log(self, metrics: dict[str, float], shard: StepShard, update: dict[str, float]) -> dict[str, float]:
        """The step's row: its columns, faults, held-out evaluation and the tool-loop alarm."""
        metrics["train/skipped_empty"] = float(not shard.kept)
        metrics.update(self.nonfinite.count(self.step, update))
        restarts = self.side.fleet.restarts     # per process: a resumed run counts from 0
        metrics["faults/engine_restarts"] = float(restarts - self._restarts_seen)
        self._restarts_seen = restarts
        if validation_due(self.cfg, self.step):
            metrics.update(self.validate())
        self.tool_loop_alarm = self.tool_loop.observe(self.step, metrics)
        metrics["tools/loop_alarm"] = float(self.tool_loop.above)
        self.writer.write(self.step, metrics)
        if self.tool_loop_alarm:
            self.writer.note(self.tool_loop_alarm)
        if self.on_step is not None and self.info.is_main:
            self.on_step(self.step, metrics)
        return metrics

    # ------------------------------------------------------------------ around the steps
    def validate(self) -> dict[str, float]:
        """Held-out eval of the current policy (`validation.py`): each rollout host evaluates its share
        of every set on its own engines and sandbox; every rank waits for the hosts (heartbeats:
        `rl_dist.gather_from`), rank 0 merges and returns the metrics, the other ranks {}."""
        timer, side = StepTimer(), self.side
        with timer("eval"):
            part = None
            if self.host.is_host:
                part = validate_share(self.cfg, side.fleet.engines, side.tools, self.step, self.out_dir,
                                      host=side.host_ranks.index(self.info.rank), hosts=len(side.host_ranks),
                                      progress=self.progress)
            parts = rl_dist.gather_from(part, side.host_ranks, dst=0)
            if parts is None:
                return {}
            metrics = merge_validation(self.cfg, parts, side.fleet.engines, side.tools, self.step, self.out_dir)
        metrics.update(timer.sections())
        return metrics

    def _checkpoint_extra(self) -> tuple[dict, dict]:
        """(the sampler's state, the trainer's extras) a checkpoint of this step holds."""
        return self.sampler.state_dict(), {"nonfinite": self.nonfinite.state_dict(),
                                           "tool_loop": self.tool_loop.state_dict()}

    def save(self, final: bool = False) -> Path:
        target = self.out_dir / ("final" if final else f"step_{self.step:06d}")
        sampler_state, extra = self._checkpoint_extra()
        try:
            checkpoint.save_checkpoint(target, self.policy, self.tokenizer, sampler_state, self.step,
                                       final=final, extra=extra, keep=self.cfg.train.keep_checkpoints)
        except checkpoint.CheckpointWriteError as e:   # a full disk: the previous checkpoint is intact
            raise RunAborted(f"step {self.step}: {e}") from None
        self.last_checkpoint, self.saved_step = target, self.step
        return target

    def _saved(self) -> Path | None:
        """A checkpoint of the current step: written now unless it is on disk already."""
        return self.save() if self.step != self.saved_step else self.last_checkpoint

    def _abandon_batch(self) -> None:
        """An engine death the run cannot recover from: the step's batch is drawn again on resume."""
        self.sampler.load_state_dict(self._sampler_before)

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
                # a rollout's engine death: its batch is drawn again on resume; at the push: the next batch
                except (EngineRestartsExhausted, WeightPushFailed) as e:
                    self._abandon_batch()
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
