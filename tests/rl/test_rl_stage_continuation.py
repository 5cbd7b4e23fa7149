"""A stage with `init_from` continues the previous stage's AdamW moments and LR-schedule position
(the new recipe's optim settings win); `optim.reset` (stage 3) starts a fresh AdamW and warm-up."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from rl_synthetic import make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig, RecipeConfig
from rstar2_cli.rl.update.checkpoint import save_checkpoint
from rstar2_cli.rl.update.loss import group_advantages
from rstar2_cli.rl.update.policy import PolicyTrainer
from rstar2_cli.rl.run.stages import start_text
from rstar2_cli.rl.run.resume import continue_stage


def _policy(model_dir, optim: OptimConfig) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=str(model_dir), gradient_checkpointing=False), optim, LossConfig(),
                         micro_batch_tokens=80)


def _update(policy: PolicyTrainer, seed: int) -> None:
    batch = make_trajectories(4, seed=seed)
    policy.update(batch, group_advantages([t.reward + 0.5 * (i % 2) for i, t in enumerate(batch)]))


def _start(cfg: RecipeConfig) -> PolicyTrainer:
    """A fresh (not resumed) run of `cfg`: the policy built from model.path, then the trainer's
    stage-start step (`resume.continue_stage`, as `RLTrainer.__init__` calls it)."""
    policy = _policy(cfg.model.path, cfg.optim)
    continue_stage(cfg, policy, is_main=True)
    return policy


def _exp_avg(policy: PolicyTrainer) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in policy.model.named_parameters()}
    return {names[id(p)]: s["exp_avg"].clone() for p, s in policy.optimizer.state.items()}


def test_a_stage_2_run_from_a_stage_1_checkpoint_has_the_stage_1_adamw_state(tmp_path, tiny_model_dir):
    stage1 = _policy(tiny_model_dir, OptimConfig(lr=1e-3, warmup_steps=4))
    _update(stage1, 1)
    _update(stage1, 2)
    final = save_checkpoint(tmp_path / "stage1" / "final", stage1, step=2, final=True)
    moments = _exp_avg(stage1)
    assert moments

    cfg = RecipeConfig(stage=2, init_from="stage1", model=ModelConfig(path=str(final), gradient_checkpointing=False),
                       optim=OptimConfig(lr=2e-3, warmup_steps=4, weight_decay=0.0))
    stage2 = _start(cfg)
    got = _exp_avg(stage2)
    assert got.keys() == moments.keys()
    for name in moments:
        torch.testing.assert_close(got[name], moments[name], atol=0, rtol=0)
    # the schedule goes on from step 2 of the warm-up (3/4 of the new recipe's lr), with its settings
    group = stage2.optimizer.param_groups[0]
    assert stage2.scheduler.last_epoch == 2
    assert group["lr"] == pytest.approx(2e-3 * 3 / 4) and group["weight_decay"] == 0.0
    _update(stage2, 3)
    assert stage2.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3)     # warm-up done, not repeated
    assert "AdamW moments and LR-schedule position" in start_text(cfg)

    # stage 3 (optim.reset): the weights only; a fresh AdamW and warm-up
    fresh = _start(cfg.model_copy(update={"stage": 3, "optim": OptimConfig(lr=2e-3, warmup_steps=4, reset=True)}))
    assert not fresh.optimizer.state and fresh.scheduler.last_epoch == 0
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 / 4)
    # a model.path that is no RL checkpoint (an SFT model) has no optimizer state to continue
    sft = _start(cfg.model_copy(update={"model": ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=False)}))
    assert not sft.optimizer.state and sft.scheduler.last_epoch == 0
