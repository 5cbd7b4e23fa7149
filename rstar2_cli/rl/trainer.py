"""The GRPO-RoC step loop: rollouts -> reward -> RoC -> advantages -> update -> sync -> log.

One step, in the paper's order:
  1. sample `prompts_per_step` prompts (a resumable seeded sampler);
  2. roll out oversample*G trajectories per prompt through the agent loop (vLLM + sandbox);
  3. grade every trajectory with the isolated binary outcome grader;
  4. downsample each group to G with RoC (or keep the first G: plain GRPO);
  5. group-normalised advantages over the kept G;
  6. the policy update (FSDP2 when launched under torchrun);
  7. push the new weights into the engines;
  8. log metrics (JSONL, live table, optional TensorBoard/wandb; curves.png at the end); every
     `train.eval_every` steps (and before the first) the held-out sets are evaluated on the
     trainer's own engine and sandbox (`validation.py`) and logged with the step.
A step whose groups are all filtered out (equal rewards, infrastructure failures) is skipped:
no optimizer step, no LR step, no weight sync; it is logged with `train/skipped_empty` = 1.

Placement (`rollout_hosts.py`): the local rank 0 of every node is that node's rollout host. It
starts the node's vLLM replicas on the GPUs the launch plan names (`RSTAR2_ENGINE_GPU_IDS`,
`RSTAR2_ENGINE_TP`; without them `engine.replicas` replicas on its default device) and a sandbox
(the embedded pool, or `sandbox.url`: the Redis cluster), then each step rolls out and grades its
interleaved node-shard of the prompts through its own load-balanced scheduler. The hosts
broadcast their shards and every rank reassembles them in the global prompt order, so RoC,
advantages and the update see the same list on every rank as with a single host; each rank then
trains on its interleaved shard of the kept trajectories. Sampling seeds depend on the step, the
prompt id and the sample index only, so which node rolls a prompt out changes nothing. After the
update each host pushes the weights into its engines (`rollout/weight_sync/`: vLLM's
weight transfer on GPU, ipc or nccl; chunked safetensors on CPU), every rank joining the gathers.
Checkpoints and metrics stay on rank 0. On one process (CPU quickstart, single GPU) rank 0 is the
only host and nothing is sent anywhere.

Asynchronous GRPO-RoC (`train.max_staleness` = k >= 1, docs/async-rl.md): steps 1-3 of batch
s+1 .. s+k run on the rollout loop's own thread while step s trains (`rl/async_rollouts.py`:
in-order admission, the staleness bound, the rollouts in flight in checkpoints); the update
pauses the engines between requests (`WeightPusher(pause=True)`). k = 0 runs the loop above
unchanged.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rstar2_cli.config import RecipeConfig, dump_recipe
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.rollout_hosts import host_ranks, plan_rollout_host, reassemble
from rstar2_cli.rollout.trajectory import Trajectory
from rstar2_cli.rollout.weight_sync.engine_side import run_on_loop

log = logging.getLogger(__name__)


def _empty_piece(positions: list[int]):
    """What a host with no prompts in this batch contributes to the exchange."""
    return positions, [], {"time/rollout": 0.0, "time/reward": 0.0}


class RLTrainer:
    """Owns the policy, the engines, the sandbox and the data order of one RL run."""

    def __init__(self, cfg: RecipeConfig, *, resume: bool = False, progress: bool = True,
                 on_step: Callable[[int, dict], None] | None = None):
        from transformers import AutoTokenizer

        from rstar2_cli.data.problems import load_problems
        from rstar2_cli.rl import checkpoint
        from rstar2_cli.rl.metrics import MetricsWriter
        from rstar2_cli.rl.policy import PolicyTrainer
        from rstar2_cli.rl.sampler import DataSampler

        self.cfg, self.progress, self.on_step = cfg, progress, on_step
        self.out_dir = Path(cfg.train.out_dir)
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
        self.rng = np.random.default_rng(cfg.train.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.host = plan_rollout_host(cfg.engine, os.environ)    # a bad launch env fails here too
        self.policy = PolicyTrainer(cfg.model, cfg.optim, cfg.loss, micro_batch_tokens=cfg.train.micro_batch_tokens,
                                    ppo_mini_batches=cfg.train.ppo_mini_batches, dual_clip=cfg.loss.dual_clip)
        self.info = self.policy.info
        roles = rl_dist.all_gather_objects((self.host.node_index, self.host.is_host))
        self.host_ranks = host_ranks(roles, self.host.num_nodes)
        self.sampler = DataSampler(len(self.problems), min(cfg.train.prompts_per_step, len(self.problems)),
                                   seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.step = 0
        self.max_staleness = cfg.train.max_staleness
        if self.max_staleness and cfg.engine.colocate and self.info.device.type == "cuda":
            raise ValueError(f"train.max_staleness={self.max_staleness} with engine.colocate: true: colocated "
                             "engines sleep while the trainer runs, so nothing can overlap; set "
                             "engine.colocate: false and give the engines their own GPUs (--engine-gpus)")
        saved_pending = None
        engine_weights = cfg.model.path
        if resume:
            ckpt = checkpoint.latest_checkpoint(self.out_dir)
            if ckpt is None:
                raise FileNotFoundError(f"--resume: no checkpoint under {self.out_dir}")
            state = checkpoint.load_checkpoint(ckpt, self.policy, self.sampler,
                                               reset_optimizer=False)
            self.step = state.step
            self.rng = state.rng if state.rng is not None else self.rng
            engine_weights = str(ckpt)   # a checkpoint folder is a plain HF model folder
            saved_pending = state.extra.get("async_pending")
        self.writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    enabled=self.info.is_main, live=progress)
        self.engines: list = []
        self.scheduler = None
        self.tools = None
        self.loop = asyncio.new_event_loop()
        self.pipeline = None
        self._mark: tuple[float, list[float]] | None = None    # async: idle fractions count from here
        self._loop_thread: threading.Thread | None = None
        if self.max_staleness:     # rollouts of later steps run on this loop's own thread
            self._loop_thread = threading.Thread(target=self.loop.run_forever, name="rstar2-rollouts", daemon=True)
            self._loop_thread.start()
        if self.info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "resolved_recipe.yaml").write_text(dump_recipe(cfg))
        from rstar2_cli.rollout.weight_sync.backends import choose_backend

        self.weight_transfer = choose_backend(cfg.engine.weight_transfer, on_gpu=self.info.device.type == "cuda",
                                              colocate=cfg.engine.colocate)
        if self.host.is_host:
            if self.host.warning:
                log.warning(self.host.warning)
            self._start_rollout_side(engine_weights)
        self.weights_out = self._weight_pusher()    # every rank: the gathers are collectives
        if self.max_staleness:
            from rstar2_cli.rl.async_rollouts import RolloutPipeline

            self.pipeline = RolloutPipeline(self.max_staleness, cfg.train.steps, self.sampler, self._start_batch,
                                            first_index=self.step)
            if saved_pending is not None and not self.pipeline.load_checkpoint_state(
                    saved_pending, self.step, self.host_ranks.index(self.info.rank) if self.host.is_host else None,
                    len(self.host_ranks)):
                log.warning("resume: the %d saved rollout batch(es) do not fit this run (%d rollout hosts saved, "
                            "%d now): regenerated from the saved data order", len(saved_pending["batches"]),
                            len(saved_pending["hosts"]), len(self.host_ranks))
        elif saved_pending is not None and saved_pending["batches"]:
            from rstar2_cli.rl.async_rollouts import rewind_for_regeneration

            rewind_for_regeneration(self.sampler, saved_pending)   # resumed synchronously: regenerated
            log.warning("resume: %d rollout batch(es) saved by an asynchronous run are regenerated by the "
                        "synchronous loop (train.max_staleness=0)", len(saved_pending["batches"]))

    # ------------------------------------------------------------------ set-up / tear-down
    def _start_rollout_side(self, weights: str) -> None:
        from rstar2_cli.rollout.engines import VLLMEngine, default_max_model_len
        from rstar2_cli.rollout.scheduler import LoadBalancedScheduler

        cfg, slots = self.cfg, self.host.engines
        max_len = default_max_model_len(cfg.rollout.max_response_tokens, cfg.engine.max_model_len)
        engine_cfg = cfg.engine
        if self.host.tp_size != engine_cfg.tensor_parallel_size:   # the launch plan's TP wins
            engine_cfg = engine_cfg.model_copy(update={"tensor_parallel_size": self.host.tp_size})
        first = self.host.node_index * len(slots)     # global replica index under a uniform plan
        self.engines = [VLLMEngine.from_config(weights, engine_cfg, max_model_len=max_len,
                                               seed=cfg.train.seed + first + i, gpu_ids=slot.gpu_ids,
                                               weight_transfer=self.weight_transfer)
                        for i, slot in enumerate(slots)]
        for e in self.engines:       # resumed: the engines hold the checkpoint's weights, version `step`
            e.weights_version = self.step   # (AReaL #1342: a restored engine left at version 0)
        self.scheduler = LoadBalancedScheduler(self.engines)
        if cfg.sandbox.url:
            from sandbox.client import RemoteSandbox

            self.tools = RemoteSandbox(cfg.sandbox.url)
        else:
            from sandbox import Limits, Sandbox

            self.tools = Sandbox(workers=cfg.sandbox.workers, isolation=cfg.sandbox.isolation,
                                 limits=Limits(timeout=cfg.rollout.tool_timeout, cpu_time=cfg.rollout.tool_timeout,
                                               memory_mb=cfg.sandbox.memory_mb))
        self._run(self.tools.start())

    def _weight_pusher(self):
        from rstar2_cli.rl.policy import compute_dtype
        from rstar2_cli.rollout.weight_sync.pusher import WeightPusher

        return WeightPusher(self.weight_transfer, model=self.policy.model, engines=self.engines,
                            is_host=self.host.is_host, rank=self.info.rank,
                            engine_dtype=compute_dtype("auto", self.info.device), loop=self.loop,
                            pause=bool(self.max_staleness), ipc_buffer_mb=self.cfg.engine.ipc_buffer_mb,
                            colocated=self.cfg.engine.colocate and self.info.device.type == "cuda")

    def _run(self, coro):
        """Run a coroutine on the rollout loop and wait for it (see weight_sync.engine_side.run_on_loop)."""
        return run_on_loop(self.loop, coro)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.cancel()
        self.weights_out.close()

        async def _close():
            for e in self.engines:
                await e.close()
            if self.tools is not None:
                await self.tools.close()

        if self.host.is_host:
            self._run(_close())
        if self._loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=60)
        self.loop.close()
        self.writer.close()

    # ------------------------------------------------------------------ one step
    async def _rollout(self, index: int, batch: list, positions: list[int] | None,
                       occurrence: list[int] | None) -> tuple[list[Trajectory], float]:
        """Roll out `batch` (this node's shard of batch `index`: `positions` in the batch and how
        many times each problem was drawn before them, so duplicates differ across nodes too)."""
        from rstar2_cli.rollout.agent_loop import run_agent_loop

        cfg = self.cfg
        t0 = time.perf_counter()
        trajs = await run_agent_loop(
            [(p.id, p.problem, p.answer) for p in batch], cfg.rollouts_per_prompt, self.scheduler,
            self.tools, self.tokenizer, cfg.rollout, seed=cfg.train.seed * 1_000_003 + index,
            progress=self.progress and not self.max_staleness,   # batches in flight at once: no bars
            group_indices=positions, occurrence=occurrence)
        return trajs, time.perf_counter() - t0

    def _grade(self, trajs: list[Trajectory]) -> float:
        from rstar2_cli.reward import grade_batch

        cfg = self.cfg
        t0 = time.perf_counter()
        grades = grade_batch([(t.text, t.gold) for t in trajs], timeout=cfg.reward.timeout, mode=cfg.reward.mode,
                             workers=cfg.reward.workers)
        for t, g in zip(trajs, grades):
            t.reward, t.extracted, t.grade_reason = g.reward, g.extracted, g.reason
        return time.perf_counter() - t0

    def _shard(self, batch: list) -> tuple[list[int], list, list[int]]:
        """This node's positions in `batch`, its problems, and their earlier draws in the batch."""
        from rstar2_cli.rollout.agent_loop import occurrences

        positions = self.host.prompt_positions(len(batch))
        drawn_before = occurrences([p.id for p in batch])
        return positions, [batch[i] for i in positions], [drawn_before[i] for i in positions]

    def _rollout_and_grade_sync(self, batch: list):
        positions, mine, drawn = self._shard(batch)
        if not positions:
            return _empty_piece(positions)
        trajs, t_rollout = self._run(self._rollout(self.step, mine, positions, drawn))
        return positions, trajs, {"time/rollout": t_rollout, "time/reward": self._grade(trajs)}

    def _start_batch(self, index: int, problem_indices: list[int]):
        """Asynchronous runs: start this host's rollout + grading of batch `index` on the rollout
        thread; returns its future (None on ranks that are not rollout hosts)."""
        if not self.host.is_host:
            return None
        positions, mine, drawn = self._shard([self.problems[i] for i in problem_indices])

        async def produce():
            if not positions:
                return _empty_piece(positions)
            trajs, t_rollout = await self._rollout(index, mine, positions, drawn)
            t_reward = await asyncio.to_thread(self._grade, trajs)
            return positions, trajs, {"time/rollout": t_rollout, "time/reward": t_reward}

        return asyncio.run_coroutine_threadsafe(produce(), self.loop)

    def _rollout_all_nodes(self, n_batch: int, local: Callable[[], Any]
                           ) -> tuple[list[Trajectory], dict[str, float], dict[str, float]]:
        """Every host contributes its node-shard (`local()`: positions, graded trajectories,
        timing); every rank gets all trajectories in the global prompt order, the slowest host's
        rollout and reward times, and (more than one node) how many trajectories each node rolled
        out."""
        piece: Any = None
        if self.host.is_host:
            try:
                piece = local()
            except Exception as e:
                if not rl_dist.is_distributed():
                    raise
                log.exception("rollout failed on this node")
                piece = f"node {self.host.node_index}: {e!r}"   # tell the other ranks, then fail
            else:
                for t in piece[1]:
                    t.extra["node"] = self.host.node_index
        pieces = rl_dist.broadcast_from_each(piece, self.host_ranks)
        errors = [p for p in pieces if isinstance(p, str)]
        if errors:
            raise RuntimeError(f"rollout failed on {errors[0]}")
        trajs = reassemble([(p[0], p[1]) for p in pieces], n_batch, self.cfg.rollouts_per_prompt)
        timing = {k: max(p[2][k] for p in pieces) for k in ("time/rollout", "time/reward")}
        timing["time/tools"] = float(sum(t.tool_time for t in trajs)) / max(1, len(trajs))
        per_node = ({f"rollout/trajectories_node{n}": float(len(p[1])) for n, p in enumerate(pieces)}
                    if len(pieces) > 1 else {})
        return trajs, timing, per_node

    def _sync_weights(self) -> float:
        t0 = time.perf_counter()
        self.weights_out.push(self.policy)    # collective under FSDP; hosts load their engines
        return time.perf_counter() - t0

    def train_step(self) -> dict[str, float]:
        from rstar2_cli.rl.dist import shard_for_rank
        from rstar2_cli.rl.loss import advantages_for_groups
        from rstar2_cli.rl.metrics import step_metrics
        from rstar2_cli.rl.roc import select_for_training
        from rstar2_cli.rl.validation import validation_due

        cfg = self.cfg
        t_start = time.perf_counter()
        async_metrics: dict[str, float] = {}
        if self.pipeline is None:
            batch = [self.problems[i] for i in self.sampler.next_batch()]               # 1
            trajs, timing, per_node = self._rollout_all_nodes(                           # 2, 3
                len(batch), lambda: self._rollout_and_grade_sync(batch))
        else:                            # 1-3 ran ahead, while earlier steps trained
            trajs, timing, per_node, async_metrics = self._take_rolled_out_batch()
        roc = select_for_training(trajs, cfg.roc, cfg.train.group_size, self.rng)       # 4
        kept, advantages = roc.trajectories, advantages_for_groups(roc.groups)          # 5
        update: dict[str, float] = {}
        if kept:
            t_train = time.perf_counter()
            self.weights_out.sleep_engines()   # colocated on GPU: level 2, the push brings the weights back
            mine = shard_for_rank(list(zip(kept, advantages)), self.info.rank, self.info.world_size)
            update = self.policy.update([m[0] for m in mine], [m[1] for m in mine])      # 6
            timing["time/train"] = time.perf_counter() - t_train
            timing["time/sync"] = self._sync_weights()      # 7 (colocated: wakes weights, pushes, wakes KV)
        else:   # every group filtered out: nothing to learn, so no optimizer, LR or weight step
            log.warning("step %d: no group left after filtering (%s): skipped, no optimizer or LR step",
                        self.step + 1, ", ".join(f"{k} {v}" for k, v in roc.dropped.items()) or "no groups")
            if self.pipeline is not None:     # unchanged weights are also the next step's version
                for e in self.engines:
                    e.weights_version += 1
        timing["time/step"] = time.perf_counter() - t_start
        self.step += 1
        if self.pipeline is not None:         # the new version admits the next batch at once
            self.pipeline.fill(self.step)
            async_metrics.update(self._idle_metrics(timing, async_metrics))
        metrics = step_metrics(self.step, trajs, roc, update, timing,
                               max_response_tokens=cfg.rollout.max_response_tokens)     # 8
        metrics["train/skipped_empty"] = float(not kept)
        metrics.update(per_node)
        metrics.update(async_metrics)
        if validation_due(cfg, self.step):
            metrics.update(self.validate())
        self.writer.write(self.step, metrics)
        if self.on_step is not None and self.info.is_main:
            self.on_step(self.step, metrics)
        return metrics

    def _take_rolled_out_batch(self) -> tuple[list[Trajectory], dict[str, float], dict[str, float], dict[str, float]]:
        """This step's batch from the pipeline (rolled out by versions >= step - k), its stale
        groups dropped; the trainer's wait for it is its idle time."""
        from rstar2_cli.rl.async_rollouts import drop_stale_groups

        if self._mark is None:
            self._mark = (time.perf_counter(), [e.busy_seconds() for e in self.engines])
        self.pipeline.fill(self.step)
        t0 = time.perf_counter()
        pending = self.pipeline.take(self.step)
        trajs, timing, per_node = self._rollout_all_nodes(len(pending.problems), pending.wait)
        waited = time.perf_counter() - t0
        report = drop_stale_groups(trajs, self.step, self.max_staleness)
        if report.dropped_groups:
            log.warning("step %d: %d group(s) staler than train.max_staleness=%d dropped", self.step + 1,
                        report.dropped_groups, self.max_staleness)
        self.pipeline.dropped_groups_total += report.dropped_groups
        metrics = report.metrics()
        metrics["async/dropped_groups_total"] = float(self.pipeline.dropped_groups_total)
        metrics["async/trainer_wait_s"] = waited
        return report.kept, timing, per_node, metrics

    def _idle_metrics(self, timing: dict[str, float], async_metrics: dict[str, float]) -> dict[str, float]:
        """Idle fractions over the wall time since the previous step ended (so the held-out
        evals and checkpoints between steps, which rollouts overlap too, are counted)."""
        from rstar2_cli.rl.async_rollouts import idle_metrics

        since, busy_before = self._mark
        now, busy_now = time.perf_counter(), [e.busy_seconds() for e in self.engines]
        self._mark = (now, busy_now)
        out = idle_metrics(now - since, async_metrics["async/trainer_wait_s"],
                           [b - a for a, b in zip(busy_before, busy_now)], timing.get("time/sync", 0.0))
        out["async/step_interval_s"] = now - since
        return out

    def validate(self) -> dict[str, float]:
        """Held-out eval of the current policy on rank 0's engine and sandbox (`validation.py`);
        other ranks get {} (rank 0 is node 0's rollout host)."""
        from rstar2_cli.rl.validation import run_validation

        if not (self.info.is_main and self.host.is_host):
            return {}
        t0 = time.perf_counter()
        metrics = run_validation(self.cfg, self.engines[0], self.tools, self.step, self.out_dir,
                                 progress=self.progress)
        metrics["time/eval"] = time.perf_counter() - t0
        return metrics

    def save(self, final: bool = False) -> Path:
        from rstar2_cli.rl import checkpoint

        target = self.out_dir / ("final" if final else f"step_{self.step:06d}")
        extra = None
        if self.pipeline is not None:
            extra = {"async_pending": self.pipeline.checkpoint_state(
                lambda mine: rl_dist.broadcast_from_each(mine, self.host_ranks), self.host.is_host)}
        checkpoint.save_checkpoint(target, self.policy, self.tokenizer, self.sampler, self.step, self.rng,
                                   final=final, extra=extra)
        return target

    def train(self) -> Path:
        """Run until train.steps; checkpoint every save_every steps and at the end."""
        from rstar2_cli.rl.validation import validation_due

        try:
            if self.step == 0 and validation_due(self.cfg, 0):
                self.writer.write(0, {"step": 0.0, **self.validate()})
            while self.step < self.cfg.train.steps:
                self.train_step()
                if self.step % self.cfg.train.save_every == 0 and self.step < self.cfg.train.steps:
                    self.save()
            return self.save(final=True)
        finally:
            try:
                self.writer.plot()
            except Exception as e:   # a missing plotting backend must not hide the run's own outcome
                log.warning("curves.png not written: %r", e)
            self.close()


def train(cfg: RecipeConfig, *, resume: bool = False, progress: bool = True,
          on_step: Callable[[int, dict], None] | None = None) -> Path:
    """Run one RL stage; returns the final checkpoint folder (a plain HF model inside)."""
    return RLTrainer(cfg, resume=resume, progress=progress, on_step=on_step).train()
