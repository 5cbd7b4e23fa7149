"""The trainer's chain on one step: RoC selection -> advantages -> policy update -> metrics row."""
from __future__ import annotations

import numpy as np
from rl_synthetic import build_tiny_model, make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig, RocConfig
from rstar2_cli.rl.dist import shard_for_rank
from rstar2_cli.rl.loss import advantages_for_groups
from rstar2_cli.rl.metrics import MetricsWriter, StepTimer, read_metrics, step_metrics
from rstar2_cli.rl.policy import PolicyTrainer
from rstar2_cli.rl.roc import select_for_training


def test_one_step_chain_updates_the_model_and_logs(tmp_path):
    rollouts = make_trajectories(16, seed=4)            # 4 prompts x 4 rollouts (2G with G = 2)
    for i, t in enumerate(rollouts):
        t.reward = float(i % 2)
        t.num_tool_calls, t.num_tool_errors = 2, int(i % 3 == 0)
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                           OptimConfig(warmup_steps=0, lr=1e-3), LossConfig(), micro_batch_tokens=128,
                           model=build_tiny_model())
    before = {k: v.clone() for k, v in policy.full_state_dict()}
    timer = StepTimer()
    with timer("roc"):
        roc = select_for_training(rollouts, RocConfig(), group_size=2, rng=np.random.default_rng(0))
    kept = roc.trajectories
    assert len(kept) == 8 and all(len(g) == 2 for g in roc.groups)
    adv = advantages_for_groups(roc.groups)
    with timer("train"):
        stats = policy.update(shard_for_rank(kept, 0, 1), shard_for_rank(adv, 0, 1))
    assert stats["trajectories"] == 8 and stats["loss_tokens"] == sum(sum(t.loss_mask) for t in kept)
    assert any((v - before[k]).abs().max() > 0 for k, v in policy.full_state_dict())
    writer = MetricsWriter(tmp_path)
    writer.write(1, step_metrics(1, rollouts, roc, stats, timer))
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row["train/loss_tokens"] == stats["loss_tokens"] and row["roc/groups_kept"] == 4
    assert "throughput/train_loss_tokens_per_s" in row


def test_an_update_without_loss_tokens_takes_no_optimizer_or_lr_step():
    rollouts = make_trajectories(4, seed=1)
    for t in rollouts:
        t.loss_mask = [0] * len(t.response_ids)       # nothing the policy sampled
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                           OptimConfig(warmup_steps=5, lr=1e-3), LossConfig(), micro_batch_tokens=128,
                           model=build_tiny_model())
    before = {k: v.clone() for k, v in policy.full_state_dict()}
    stats = policy.update(rollouts, [1.0, -1.0, 1.0, -1.0])
    assert stats["optimizer_steps"] == 0 and policy.scheduler.last_epoch == 0
    assert all((v - before[k]).abs().max() == 0 for k, v in policy.full_state_dict())
