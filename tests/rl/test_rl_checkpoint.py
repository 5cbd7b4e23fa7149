"""Save -> load -> the next update and the next prompt batch are the same as without the stop."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_synthetic import make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.rl.checkpoint import latest_checkpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from rstar2_cli.rl.loss import group_advantages
from rstar2_cli.rl.policy import PolicyTrainer
from rstar2_cli.rl.sampler import DataSampler


def _policy(model_dir) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=str(model_dir), gradient_checkpointing=False),
                         OptimConfig(lr=1e-3, warmup_steps=3), LossConfig(), micro_batch_tokens=80,
                         ppo_mini_batches=2)


def _step_batch(seed):
    batch = make_trajectories(8, seed=seed)
    adv = group_advantages([t.reward for t in batch[:4]])
    adv += group_advantages([t.reward + 0.5 * (i % 2) for i, t in enumerate(batch[4:])])
    return batch, adv


def test_resume_reproduces_the_next_update_and_batch(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    a, sampler = _policy(tiny_model_dir), DataSampler(20, 4, seed=0)
    sampler.next_batch()
    a.update(*_step_batch(1))
    roc_rng = np.random.default_rng(11)
    save_checkpoint(run / "step_000001", a, sampler=sampler, step=1, rng=roc_rng)
    expected_batch, expected_rand, expected_roc = sampler.next_batch(), torch.rand(3), roc_rng.random(3)
    expected = a.update(*_step_batch(2))
    expected_params = dict(a.full_state_dict())

    assert latest_checkpoint(run) == resolve_checkpoint(run) == run / "step_000001"
    b, sampler_b = _policy(tiny_model_dir), DataSampler(20, 4, seed=0)
    loaded = load_checkpoint(latest_checkpoint(run), b, sampler_b)
    assert loaded.step == 1 and not loaded.final
    assert sampler_b.next_batch() == expected_batch
    assert torch.equal(torch.rand(3), expected_rand)
    assert np.array_equal(loaded.rng.random(3), expected_roc)
    got = b.update(*_step_batch(2))
    for key in ("loss", "grad_norm", "lr", "ratio_mean", "clip_frac"):
        assert got[key] == pytest.approx(expected[key], abs=1e-5), key
    for name, value in b.full_state_dict():
        torch.testing.assert_close(value, expected_params[name], atol=1e-6, rtol=0)


def test_checkpoint_folder_is_a_loadable_hf_model(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    a = _policy(tiny_model_dir)
    step_dir = save_checkpoint(tmp_path / "final", a, step=5, final=True)
    assert latest_checkpoint(tmp_path) == step_dir
    loaded = AutoModelForCausalLM.from_pretrained(step_dir)
    for name, value in a.full_state_dict():
        torch.testing.assert_close(loaded.state_dict()[name], value)
    # stage 3: weights from the checkpoint, fresh optimizer and warm-up
    c = _policy(tiny_model_dir)
    c.update(*_step_batch(1))
    load_checkpoint(step_dir, c, reset_optimizer=True)
    assert c.scheduler.get_last_lr()[0] == pytest.approx(1e-3 / 3 * 2)     # c's own schedule, not restored
    for name, value in c.full_state_dict():
        torch.testing.assert_close(value, loaded.state_dict()[name])


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        resolve_checkpoint(tmp_path)
