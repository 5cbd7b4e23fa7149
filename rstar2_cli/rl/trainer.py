"""The GRPO-RoC step loop: rollouts -> reward -> RoC -> advantages -> update -> sync -> log.

One step (`RLTrainer.train_step`), in the paper's order:
  1. sample `prompts_per_step` prompts (a resumable seeded sampler);
  2. roll out oversample*G trajectories per prompt through the agent loop (vLLM + sandbox);
  3. grade every trajectory with the isolated binary outcome grader;
  4. downsample each group to G with RoC (or keep the first G: plain GRPO);
  5. group-normalised advantages over the kept G;
  6. the policy update (FSDP2 when launched under torchrun);
  7. push the new weights into the engines;
  8. log metrics (JSONL, live table, optional TensorBoard/wandb; curves.png at the end) and a
     sample of the rollouts (each host its own, `rollout_log.py`); every `train.eval_every` steps
     (and before the first) the held-out sets are evaluated on the trainer's own engines and
     sandboxes, a share on each rollout host (`validation.py`), and logged with the step.
A step whose groups are all filtered out (equal rewards, infrastructure failures) is skipped:
no optimizer step, no LR step, no weight sync; it is logged with `train/skipped_empty` = 1.

Steps 1-3 come from the rollout source (`rollout_source.py`): at k = `train.max_staleness` = 0 a
direct call in the step itself, in this order; at k >= 1 (experimental, `async_rollouts.py`) they
ran up to k steps ahead, while earlier steps trained. Steps 4-5 run on each rollout host over its
own groups, and each rank receives only the trajectories it trains (`shards.py`). The engines, the
sandbox and the weight pusher are the rollout service's (`rollout_service.py`). Metrics stay on
rank 0; every rank writes its own shards of a checkpoint (`checkpoint.py`).
GPU memory: the policy load and a continued or resumed AdamW state (one optimizer step, its
temporaries freed into torch's caching allocator) leave cached blocks that vLLM counts as used, so
every rank releases them (`release`, injected: `torch.cuda.empty_cache()` and a barrier) before
the hosts start their engines, before every colocated wake and before an engine restart.

Faults: SIGTERM or SIGUSR1 ends the run at the next step boundary with a checkpoint and exit code
75 (`preemption.py`); `--resume auto` continues from `latest` if there is one, else starts fresh.
A step whose loss or gradient norm is NaN or inf takes no optimizer step (the same on every rank:
both are global values, `PolicyTrainer.update`) and is counted (`faults/nonfinite_steps`);
`train.max_nonfinite_steps` of them in a row checkpoint and abort (`RunAborted`). The checkpoint
comes first because a skipped step changes neither the weights nor the optimizer state: it holds
the last finite weights and the data position, so nothing since the last periodic save is lost
and the run can be resumed with a changed recipe (a lower `optim.lr`, say).
A remote sandbox (`sandbox.url`) rides out short outages in its client (retries with backoff;
calls that fail anyway are `internal_error` results, infrastructure failures that RoC leaves out);
one where every call has failed for longer than `sandbox.outage_s` checkpoints and aborts too.
A checkpoint that cannot be written (a full disk: `checkpoint.CheckpointWriteError`) aborts the run
(`RunAborted`), the previous checkpoint and `latest` intact.
A vLLM engine that dies or hangs mid-rollout is restarted with the current weights and the
trajectories it interrupted are rolled out again with their own seeds (`rollout/engine_health.py`,
`faults/engine_restarts`); one death more than `engine.max_restarts` checkpoints the last
completed step and aborts (`RunAborted`), the step's batch drawn again on resume.
Fault injection for tests and benchmarks/compare/chaos_rl.py: `RSTAR2_FAULT_NONFINITE_STEPS=3,4` gives
those (1-based) steps NaN advantages, so their loss and gradients are NaN (read once, at start);
`RSTAR2_FAULT_CHECKPOINT_WRITE=<step>` fails that step's checkpoint write (`checkpoint.py`).
A tool-loop alarm (`tool_loop.py`) with `train.stop_on_tool_loop` checkpoints and aborts too.
"""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rstar2_cli.config import RecipeConfig, dump_recipe
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.preemption import RESUME_MODES
from rstar2_cli.rl.rollout_hosts import plan_rollout_host
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache

log = logging.getLogger(__name__)

FAULT_NONFINITE_ENV = "RSTAR2_FAULT_NONFINITE_STEPS"


class RunAborted(RuntimeError):
    """A fault the run cannot continue past; the message is one line saying why and what was saved."""


def fault_steps(env: dict) -> frozenset[int]:
    """The 1-based steps `RSTAR2_FAULT_NONFINITE_STEPS` (comma-separated) names; empty if unset."""
    raw = env.get(FAULT_NONFINITE_ENV, "").strip()
    try:
        return frozenset(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{FAULT_NONFINITE_ENV}={raw!r}: expected comma-separated step numbers") from None


def resume_mode(resume: bool | str | None) -> str | None:
    """`--resume` as given: True or "latest" (the latest checkpoint, which must exist), "auto"
    (the latest if there is one, else a fresh start), False/None (a fresh start)."""
    if resume is True or resume == "latest":
        return "latest"
    if resume is False or resume is None:
        return None
    if resume == "auto":
        return "auto"
    raise ValueError(f"--resume {resume!r}: expected one of {', '.join(RESUME_MODES)}")


class RLTrainer:
    """Owns the policy, the rollout side, the data order and the metrics of one RL run."""

    def __init__(self, cfg: RecipeConfig, *, resume: bool | str = False, progress: bool = True,
                 on_step: Callable[[int, dict], None] | None = None,
                 release: Callable[[], None] = release_trainer_cache):
        from transformers import AutoTokenizer

        from rstar2_cli.data.problems import load_problems
        from rstar2_cli.rl import checkpoint
        from rstar2_cli.rl.cpu_threads import TrainerThreads
        from rstar2_cli.rl.metrics import MetricsWriter
        from rstar2_cli.rl.policy import PolicyTrainer
        from rstar2_cli.rl.rollout_log import RolloutLog
        from rstar2_cli.rl.rollout_service import RolloutService
        from rstar2_cli.rl.rollout_source import rollout_source
        from rstar2_cli.rl.sampler import DataSampler
        from rstar2_cli.rl.tool_loop import ToolLoopAlarm

        self.cfg, self.progress, self.on_step = cfg, progress, on_step
        self.out_dir = Path(cfg.train.out_dir)
        self.info = rl_dist.setup_distributed()     # torchrun: this rank joins the process group
        # Bad data fails here, before any model is loaded.
        self.problems = load_problems(cfg.data.train, data_dir=cfg.data.data_dir)
        if cfg.train.eval_every > 0:
            from rstar2_cli.rl.validation import eval_set_source

            for entry in cfg.train.eval_sets:      # a missing held-out set fails now, not at step 5
                name, data = eval_set_source(entry)
                load_problems(data or name, data_dir=cfg.data.data_dir)
        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.host = plan_rollout_host(cfg.engine, os.environ)    # a bad launch env fails here too
        # before the rollout service's thread starts: it takes the process default (rl/cpu_threads.py)
        self.threads = TrainerThreads(cfg.train.cpu_threads, self.info.device, engines_here=bool(self.host.engines),
                                      max_staleness=cfg.train.max_staleness, tensor_parallel_size=self.host.tp_size)
        self.policy = PolicyTrainer(cfg.model, cfg.optim, cfg.loss, micro_batch_tokens=cfg.train.micro_batch_tokens,
                                    ppo_mini_batches=cfg.train.ppo_mini_batches, dual_clip=cfg.loss.dual_clip,
                                    info=self.info, logprob_chunk_tokens=cfg.train.logprob_chunk_tokens,
                                    max_staleness=cfg.train.max_staleness,
                                    attn_implementation=cfg.train.attn_implementation,
                                    temperature=cfg.rollout.temperature)
        if self.info.is_main:
            log.info("attention: %s", self.policy.attention.reason)
        self.sampler = DataSampler(len(self.problems), min(cfg.train.prompts_per_step, len(self.problems)),
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.step = 0
        self.nonfinite = {"total": 0, "streak": 0}   # steps with a skipped optimizer step: all, in a row
        self._engine_restarts_seen = 0                # the rollout side's restarts already logged
        self._fault_nonfinite = fault_steps(os.environ)
        self.tool_loop = ToolLoopAlarm(cfg.train.tool_loop_baseline_steps, cfg.train.tool_loop_factor)
        self.tool_loop_alarm: str | None = None           # this step's alarm line (rl/tool_loop.py)
        self.rollout_log = (RolloutLog(self.out_dir, self.problems, self.tokenizer, count=cfg.train.log_rollouts,
                                       seed=cfg.train.seed, roc_mode=cfg.roc.mode) if self.host.is_host else None)
        saved_pending = None
        engine_weights = cfg.model.path
        mode = resume_mode(resume)
        ckpt = checkpoint.latest_checkpoint(self.out_dir) if mode else None
        self.last_checkpoint: Path | None = ckpt   # what is on disk now: the start model's state
        self.saved_step = self.step                # (step 0) or the checkpoint resumed
        if mode == "latest" and ckpt is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.out_dir}")
        if ckpt is not None:
            state = checkpoint.load_checkpoint(ckpt, self.policy, self.sampler, reset_optimizer=False)
            self.step = state.step
            engine_weights = str(ckpt)   # a checkpoint folder is a plain HF model folder
            saved_pending = state.extra.get("async_pending")
            self.nonfinite.update(state.extra.get("nonfinite", {}))
            self.tool_loop.load_state_dict(state.extra.get("tool_loop", {}))
        else:
            if mode == "auto":
                log.info("--resume auto: no checkpoint under %s, starting fresh", self.out_dir)
            self._continue_stage()
        self.writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    enabled=self.info.is_main, live=progress)
        if mode:   # rows a stopped run wrote after its last checkpoint are written again by this one
            self.writer.keep_through(self.step if ckpt is not None else None)
        if self.info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "resolved_recipe.yaml").write_text(dump_recipe(cfg))
        self.rollouts = RolloutService(cfg, self.problems, self.tokenizer, self.host, self.info,
                                       model=self.policy.model, weights=engine_weights, version=self.step,
                                       progress=progress, release=release)
        self.source = rollout_source(cfg.train.max_staleness, cfg.train.steps, self.sampler, self.rollouts,
                                     first_index=self.step, partial=cfg.train.partial_rollout)
        if saved_pending is not None:
            ordinal = self.rollouts.host_ranks.index(self.info.rank) if self.host.is_host else None
            why = self.source.load_checkpoint_state(saved_pending, self.step, ordinal,
                                                      len(self.rollouts.host_ranks))
            if why:
                log.warning("resume: the %d saved rollout batch(es) are drawn again and rolled out by the "
                            "resumed weights (%s)", len(saved_pending["batches"]), why)

    def _continue_stage(self) -> None:
        """A fresh run of a stage with `init_from` continues the previous stage's AdamW state and
        LR-schedule position unless `optim.reset` (rl/stages.py); a `model.path` that is not an
        rstar2 checkpoint has none to continue (an SFT or HF model): AdamW starts fresh."""
        from rstar2_cli.rl import checkpoint
        from rstar2_cli.rl.stages import continues_optimizer

        if not continues_optimizer(self.cfg):
            return
        if not checkpoint.is_checkpoint(Path(self.cfg.model.path)):
            log.warning("init_from %s: %s is no RL checkpoint (no optimizer state); AdamW starts fresh",
                        self.cfg.init_from, self.cfg.model.path)
            return
        position = checkpoint.continue_optimizer(self.cfg.model.path, self.policy)
        if self.info.is_main:
            log.info("init_from %s: AdamW state and LR schedule continue from %s (%d LR steps taken)",
                     self.cfg.init_from, self.cfg.model.path, position)

    def close(self) -> None:
        self.source.cancel()
        self.rollouts.close()
        self.writer.close()
        self.threads.restore()

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        """One GRPO-RoC step, top to bottom in the paper's order (module docstring)."""
        from rstar2_cli.rl.metrics import StepTimer, step_metrics
        from rstar2_cli.rl.shards import share_step
        from rstar2_cli.rl.validation import validation_due
        from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

        cfg, rollouts = self.cfg, self.rollouts
        timer = StepTimer()
        # 1-3. this step's prompts, rolled out and graded by every rollout host (its node-shard)
        rolled = self.source.next_batch(self.step)
        # 4. RoC: each group of oversample*G downsampled to G; 5. advantages over the kept G; both
        # on the host that rolled the group out; this rank receives the trajectories it trains
        shard = share_step(rolled.piece, rollouts, cfg, self.step, rolled.keep, log=self.rollout_log)
        for name, seconds in shard.seconds.items():
            timer.add(name, seconds)
        advantages = shard.advantages
        if self.step + 1 in self._fault_nonfinite:     # fault injection (module docstring)
            advantages = [float("nan")] * len(advantages)
        update: dict[str, float] = {}
        if shard.kept:
            with rollouts.weights_changing():   # no engine restart reads the weights meanwhile
                # 6. the update on this rank's shard (colocated on GPU: the engines sleep meanwhile)
                with timer("train"):
                    rollouts.sleep()
                    with self.threads.alone():
                        update = self.policy.update(shard.trajectories, advantages, shard.mini_batches)
                # 7. the new weights into the engines (colocated: woken for it)
                with timer("sync"):
                    try:
                        rollouts.push_weights(self.policy)
                    except EngineRestartsExhausted:   # the update stands: the checkpoint `train` writes
                        self.step += 1                # now is this step's, and its batch is not drawn again
                        raise
        else:   # every group filtered out: nothing to learn, so no optimizer, LR or weight step
            dropped = {k[len("roc/dropped_"):]: int(v) for k, v in shard.roc.items() if k.startswith("roc/dropped_")}
            log.warning("step %d: no group left after filtering (%s): skipped, no optimizer or LR step",
                        self.step + 1, ", ".join(f"{k} {v}" for k, v in dropped.items() if v) or "no groups")
            rollouts.keep_weights()
        if shard.records is not None:     # rollout hosts: the step's sample on disk (rl/rollout_log.py)
            with timer("rollout_log"):
                self.rollout_log.write(self.step + 1, self.host.node_index, len(rollouts.host_ranks), shard.records)
            timer.add("rollout_log", shard.log_seconds)
        timer.stop()
        self.step += 1
        self.source.after_update(self.step)      # k >= 1: the new version admits batches at once
        # 8. log
        metrics = step_metrics(self.step, shard.tally, shard.roc, update, timer)
        metrics["train/skipped_empty"] = float(not shard.kept)
        metrics.update(self._count_nonfinite(update))
        # restarts during this step (the supervisor counts per process; a resumed run starts at 0)
        seen_before, self._engine_restarts_seen = self._engine_restarts_seen, rollouts.engine_restarts
        restarts = rollouts.engine_restarts - seen_before
        metrics["faults/engine_restarts"] = float(restarts)
        metrics.update(shard.per_node)
        metrics.update(self.source.overlap_metrics(shard, timer.seconds.get("sync", 0.0)))
        if validation_due(cfg, self.step):
            metrics.update(self.validate())
        self.tool_loop_alarm = self.tool_loop.observe(self.step, metrics)
        metrics["tools/loop_alarm"] = float(self.tool_loop.above)
        self.writer.write(self.step, metrics)
        if self.tool_loop_alarm:
            self.writer.note(self.tool_loop_alarm)
        if self.on_step is not None and self.info.is_main:
            self.on_step(self.step, metrics)
        return metrics

    def _count_nonfinite(self, update: dict[str, float]) -> dict[str, float]:
        """The streak of steps in a row whose optimizer step was skipped for a NaN/inf loss or
        gradient norm (a step that trained nothing neither extends nor ends it)."""
        if update.get("nonfinite_skipped", 0.0) > 0:
            self.nonfinite["total"] += 1
            self.nonfinite["streak"] += 1
            log.warning("step %d: non-finite loss (%s) or gradient norm (%s): optimizer step skipped "
                        "(%d in a row, train.max_nonfinite_steps=%d)", self.step, update.get("loss"),
                        update.get("grad_norm"), self.nonfinite["streak"], self.cfg.train.max_nonfinite_steps)
        elif update.get("optimizer_steps", 0.0) > 0:
            self.nonfinite["streak"] = 0
        return {"faults/nonfinite_steps": float(self.nonfinite["total"])}

    def _abort_if_sandbox_down(self) -> None:
        """Checkpoint and raise `RunAborted` once every call to the remote sandbox has failed for
        longer than `sandbox.outage_s` (`RolloutService.sandbox_down_for`; the same on every rank)."""
        down = self.rollouts.sandbox_down_for()
        if down > self.cfg.sandbox.outage_s:
            saved = self.save() if self.step != self.saved_step else self.last_checkpoint
            raise RunAborted(f"step {self.step}: sandbox {self.cfg.sandbox.url} down for {down:.0f}s, every call "
                             f"failing (sandbox.outage_s={self.cfg.sandbox.outage_s:g}); {saved} holds step "
                             f"{self.saved_step}")

    def validate(self) -> dict[str, float]:
        """Held-out eval of the current policy (`validation.py`): each rollout host evaluates its share
        of every set on its own engines and sandbox; every rank waits for the hosts (heartbeats:
        `rl_dist.gather_from`), rank 0 merges and returns the metrics, the other ranks {}."""
        from rstar2_cli.rl.metrics import StepTimer
        from rstar2_cli.rl.validation import merge_validation, validate_share

        timer = StepTimer()
        hosts, rollouts = self.rollouts.host_ranks, self.rollouts
        with timer("eval"):
            part = None
            if self.host.is_host:
                part = validate_share(self.cfg, rollouts.engines, rollouts.tools, self.step, self.out_dir,
                                      host=hosts.index(self.info.rank), hosts=len(hosts), progress=self.progress)
            parts = rollouts.gather_to_main(part)
            if parts is None:
                return {}
            metrics = merge_validation(self.cfg, parts, rollouts.engines, rollouts.tools, self.step, self.out_dir)
        metrics.update(timer.sections())
        return metrics

    def save(self, final: bool = False) -> Path:
        from rstar2_cli.rl import checkpoint

        target = self.out_dir / ("final" if final else f"step_{self.step:06d}")
        pending = self.source.checkpoint_state(self.rollouts.gather_from_hosts, self.host.is_host)
        extra = {"nonfinite": dict(self.nonfinite), "tool_loop": self.tool_loop.state_dict()}
        if pending is not None:
            extra["async_pending"] = pending
        try:
            checkpoint.save_checkpoint(target, self.policy, self.tokenizer, self.sampler, self.step,
                                       final=final, extra=extra, keep=self.cfg.train.keep_checkpoints)
        except checkpoint.CheckpointWriteError as e:   # a full disk: the previous checkpoint is intact
            raise RunAborted(f"step {self.step}: {e}") from None
        self.last_checkpoint, self.saved_step = target, self.step
        return target

    def train(self) -> Path:
        """Run until train.steps; checkpoint every save_every steps and at the end. Raises
        `preemption.Preempted` after the checkpoint a preemption signal asks for, and
        `RunAborted` after `train.max_nonfinite_steps` non-finite steps in a row, after a sandbox outage
        past `sandbox.outage_s`, and when an engine dies once more than `engine.max_restarts` allows
        (`rollout/engine_health.py`)."""
        from rstar2_cli.rl.preemption import PreemptionWatch, Preempted
        from rstar2_cli.rl.validation import validation_due
        from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

        watch = PreemptionWatch(self.cfg.train.preempt_grace_s).install()
        try:
            if self.step == 0 and validation_due(self.cfg, 0):
                self.writer.write(0, {"step": 0.0, **self.validate()})
            while self.step < self.cfg.train.steps:
                if watch.agreed():   # every rank, every step boundary: all stop at the same step
                    raise Preempted(self.step, self.save() if self.step != self.saved_step else self.last_checkpoint,
                                    watch.signal_name)
                failing = self.step + 1
                try:
                    self.train_step()
                except EngineRestartsExhausted as e:   # the step's rollout is abandoned, drawn again on resume
                    self.source.abandon(self.step)
                    saved = self.save() if self.step != self.saved_step else self.last_checkpoint
                    if watch.signalled is not None:   # SIGTERM to every process of a preempted job
                        raise Preempted(self.step, saved, watch.signal_name) from None
                    raise RunAborted(f"step {failing}: {e}; {saved or 'no checkpoint (no step ran)'} "
                                     f"holds step {self.step}") from None
                if self.nonfinite["streak"] >= self.cfg.train.max_nonfinite_steps:
                    saved = self.save()
                    raise RunAborted(
                        f"step {self.step}: {self.nonfinite['streak']} steps in a row with a non-finite loss or "
                        f"gradient norm (train.max_nonfinite_steps={self.cfg.train.max_nonfinite_steps}); "
                        f"{saved} holds the last finite weights")
                if self.tool_loop_alarm and self.cfg.train.stop_on_tool_loop:
                    raise RunAborted(f"{self.tool_loop_alarm} (train.stop_on_tool_loop); {self.save()} holds step "
                                     f"{self.step}")
                self._abort_if_sandbox_down()
                if self.step % self.cfg.train.save_every == 0 and self.step < self.cfg.train.steps:
                    self.save()
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


def train(cfg: RecipeConfig, *, resume: bool | str = False, progress: bool = True,
          on_step: Callable[[int, dict], None] | None = None) -> Path:
    """Run one RL stage; returns the final checkpoint folder (a plain HF model inside)."""
    return RLTrainer(cfg, resume=resume, progress=progress, on_step=on_step).train()
