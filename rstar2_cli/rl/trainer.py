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
update the weights are gathered one parameter at a time; each host pushes them into its engines.
Checkpoints and metrics stay on rank 0. On one process (CPU quickstart, single GPU) rank 0 is the
only host and nothing is sent anywhere.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rstar2_cli.config import RecipeConfig, dump_recipe
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.rollout_hosts import host_ranks, plan_rollout_host, reassemble
from rstar2_cli.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


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
        self.writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    enabled=self.info.is_main, live=progress)
        self.engines: list = []
        self.scheduler = None
        self.tools = None
        self.loop = asyncio.new_event_loop()
        if self.info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "resolved_recipe.yaml").write_text(dump_recipe(cfg))
        if self.host.is_host:
            if self.host.warning:
                log.warning(self.host.warning)
            self._start_rollout_side(engine_weights)

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
                                               seed=cfg.train.seed + first + i, gpu_ids=slot.gpu_ids)
                        for i, slot in enumerate(slots)]
        self.scheduler = LoadBalancedScheduler(self.engines)
        if cfg.sandbox.url:
            from sandbox.client import RemoteSandbox

            self.tools = RemoteSandbox(cfg.sandbox.url)
        else:
            from sandbox import Limits, Sandbox

            self.tools = Sandbox(workers=cfg.sandbox.workers, isolation=cfg.sandbox.isolation,
                                 limits=Limits(timeout=cfg.rollout.tool_timeout, cpu_time=cfg.rollout.tool_timeout,
                                               memory_mb=cfg.sandbox.memory_mb))
        self.loop.run_until_complete(self.tools.start())

    def close(self) -> None:
        async def _close():
            for e in self.engines:
                await e.close()
            if self.tools is not None:
                await self.tools.close()

        if self.host.is_host:
            self.loop.run_until_complete(_close())
        self.loop.close()
        self.writer.close()

    # ------------------------------------------------------------------ one step
    def _rollout_and_grade(self, batch: list, positions: list[int] | None = None,
                           occurrence: list[int] | None = None) -> tuple[list[Trajectory], dict[str, float]]:
        """Roll out and grade `batch` (this node's shard: `positions` in the step's batch and how
        many times each problem was drawn before them, so duplicates differ across nodes too)."""
        from rstar2_cli.reward import grade_batch
        from rstar2_cli.rollout.agent_loop import run_agent_loop

        cfg = self.cfg
        t0 = time.perf_counter()
        trajs = self.loop.run_until_complete(run_agent_loop(
            [(p.id, p.problem, p.answer) for p in batch], cfg.rollouts_per_prompt, self.scheduler,
            self.tools, self.tokenizer, cfg.rollout, seed=cfg.train.seed * 1_000_003 + self.step,
            progress=self.progress, group_indices=positions, occurrence=occurrence))
        t1 = time.perf_counter()
        grades = grade_batch([(t.text, t.gold) for t in trajs], timeout=cfg.reward.timeout, mode=cfg.reward.mode,
                             workers=cfg.reward.workers)
        for t, g in zip(trajs, grades):
            t.reward, t.extracted, t.grade_reason = g.reward, g.extracted, g.reason
        t2 = time.perf_counter()
        return trajs, {"time/rollout": t1 - t0, "time/reward": t2 - t1}

    def _rollout_all_nodes(self, batch: list) -> tuple[list[Trajectory], dict[str, float], dict[str, float]]:
        """Every host rolls out its node-shard of `batch`; every rank gets all trajectories in
        the global prompt order, the slowest host's rollout and reward times, and (more than one
        node) how many trajectories each node rolled out."""
        from rstar2_cli.rollout.agent_loop import occurrences

        piece: Any = None
        if self.host.is_host:
            positions = self.host.prompt_positions(len(batch))
            drawn_before = occurrences([p.id for p in batch])
            try:
                trajs, timing = (self._rollout_and_grade([batch[i] for i in positions], positions,
                                                         [drawn_before[i] for i in positions]) if positions
                                 else ([], {"time/rollout": 0.0, "time/reward": 0.0}))
            except Exception as e:
                if not rl_dist.is_distributed():
                    raise
                log.exception("rollout failed on this node")
                piece = f"node {self.host.node_index}: {e!r}"   # tell the other ranks, then fail
            else:
                for t in trajs:
                    t.extra["node"] = self.host.node_index
                piece = (positions, trajs, timing)
        pieces = rl_dist.broadcast_from_each(piece, self.host_ranks)
        errors = [p for p in pieces if isinstance(p, str)]
        if errors:
            raise RuntimeError(f"rollout failed on {errors[0]}")
        trajs = reassemble([(p[0], p[1]) for p in pieces], len(batch), self.cfg.rollouts_per_prompt)
        timing = {k: max(p[2][k] for p in pieces) for k in ("time/rollout", "time/reward")}
        timing["time/tools"] = float(sum(t.tool_time for t in trajs)) / max(1, len(trajs))
        per_node = ({f"rollout/trajectories_node{n}": float(len(p[1])) for n, p in enumerate(pieces)}
                    if len(pieces) > 1 else {})
        return trajs, timing, per_node

    def _engines(self, method: str, *args) -> None:
        """Call sleep/wake_up on this host's engines (a no-op unless colocated on GPU)."""
        if not self.host.is_host or not self.cfg.engine.colocate:
            return

        async def call():
            for e in self.engines:
                await getattr(e, method)(*args)

        self.loop.run_until_complete(call())

    def _sync_weights(self) -> float:
        t0 = time.perf_counter()
        named = self.policy.full_state_for_engines(keep=self.host.is_host)   # collective under FSDP
        if self.host.is_host:  # one serialization, every engine loading on its own loop thread
            from rstar2_cli.rollout.engines import push_weights

            self.loop.run_until_complete(push_weights(self.engines, named))
        return time.perf_counter() - t0

    def train_step(self) -> dict[str, float]:
        from rstar2_cli.rl.dist import shard_for_rank
        from rstar2_cli.rl.loss import advantages_for_groups
        from rstar2_cli.rl.metrics import step_metrics
        from rstar2_cli.rl.roc import select_for_training
        from rstar2_cli.rl.validation import validation_due

        cfg = self.cfg
        t_start = time.perf_counter()
        batch = [self.problems[i] for i in self.sampler.next_batch()]                   # 1
        trajs, timing, per_node = self._rollout_all_nodes(batch)                         # 2, 3
        roc = select_for_training(trajs, cfg.roc, cfg.train.group_size, self.rng)       # 4
        kept, advantages = roc.trajectories, advantages_for_groups(roc.groups)          # 5
        update: dict[str, float] = {}
        if kept:
            t_train = time.perf_counter()
            self._engines("sleep")       # colocated on GPU: free KV cache and weights for training
            mine = shard_for_rank(list(zip(kept, advantages)), self.info.rank, self.info.world_size)
            update = self.policy.update([m[0] for m in mine], [m[1] for m in mine])      # 6
            timing["time/train"] = time.perf_counter() - t_train
            self._engines("wake_up", ["weights"])
            timing["time/sync"] = self._sync_weights()                                  # 7
            self._engines("wake_up", ["kv_cache"])
        else:   # every group filtered out: nothing to learn, so no optimizer, LR or weight step
            log.warning("step %d: no group left after filtering (%s): skipped, no optimizer or LR step",
                        self.step + 1, ", ".join(f"{k} {v}" for k, v in roc.dropped.items()) or "no groups")
        timing["time/step"] = time.perf_counter() - t_start
        self.step += 1
        metrics = step_metrics(self.step, trajs, roc, update, timing,
                               max_response_tokens=cfg.rollout.max_response_tokens)     # 8
        metrics["train/skipped_empty"] = float(not kept)
        metrics.update(per_node)
        if validation_due(cfg, self.step):
            metrics.update(self.validate())
        self.writer.write(self.step, metrics)
        if self.on_step is not None and self.info.is_main:
            self.on_step(self.step, metrics)
        return metrics

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
        checkpoint.save_checkpoint(target, self.policy, self.tokenizer, self.sampler, self.step, self.rng,
                                   final=final)
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
            self.writer.plot()
            self.close()


def train(cfg: RecipeConfig, *, resume: bool = False, progress: bool = True,
          on_step: Callable[[int, dict], None] | None = None) -> Path:
    """Run one RL stage; returns the final checkpoint folder (a plain HF model inside)."""
    return RLTrainer(cfg, resume=resume, progress=progress, on_step=on_step).train()
