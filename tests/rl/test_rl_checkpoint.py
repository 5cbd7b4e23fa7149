"""Save -> load -> the next update and the next prompt batch are the same as without the stop; a
save before the first step leaves AdamW untouched; keep-N pruning; a failed write changes nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_synthetic import make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.rl.update.checkpoint import (
    CheckpointWriteError,
    file_index,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    read_trainer_state,
    resolve_checkpoint,
    save_checkpoint,
)
from rstar2_cli.rl.update.loss import group_advantages
from rstar2_cli.rl.update.policy import PolicyTrainer
from rstar2_cli.rl.run.sampler import DataSampler


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
    save_checkpoint(run / "step_000001", a, sampler_state=sampler.state_dict(), step=1, rng=roc_rng)
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


def test_a_save_before_the_first_step_leaves_the_optimizer_as_it_was(tmp_path, tiny_model_dir):
    """torch's get_optimizer_state_dict would create AdamW state with a zero-gradient step (step 1)
    on an optimizer that has none; the save must not, nor must resuming from such a checkpoint."""
    a, fresh = _policy(tiny_model_dir), _policy(tiny_model_dir)
    step_dir = save_checkpoint(tmp_path / "step_000000", a, step=0)
    assert not a.optimizer.state
    assert read_trainer_state(step_dir)["has_optimizer_state"] is False
    b = _policy(tiny_model_dir)
    load_checkpoint(step_dir, b)
    assert not b.optimizer.state
    got, expected = a.update(*_step_batch(1)), fresh.update(*_step_batch(1))
    for key in ("loss", "grad_norm", "lr"):
        assert got[key] == expected[key], key
    for (name, value), (_, ref) in zip(a.full_state_dict(), fresh.full_state_dict()):
        assert torch.equal(value, ref), name          # bias correction of step 1, not step 2


def test_keep_checkpoints_prunes_the_oldest_never_latest_or_final(tmp_path, tiny_model_dir):
    a = _policy(tiny_model_dir)
    a.update(*_step_batch(1))
    save_checkpoint(tmp_path / "final", a, step=1, final=True)
    for step in (2, 3, 4, 5):
        save_checkpoint(tmp_path / f"step_{step:06d}", a, step=step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["final", "step_000004", "step_000005"]
    (tmp_path / "latest").write_text("step_000004\n")     # latest older than the newest: still kept
    assert prune_checkpoints(tmp_path, 1) == []
    save_checkpoint(tmp_path / "step_000006", a, step=6, keep=0)   # 0 keeps every folder
    assert prune_checkpoints(tmp_path, 1) == [tmp_path / "step_000004", tmp_path / "step_000005"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000006"
    with pytest.raises(ValueError, match="keep=0"):
        prune_checkpoints(tmp_path, 0)


def test_a_full_disk_leaves_latest_and_the_previous_checkpoint_intact(tmp_path, tiny_model_dir):
    a = _policy(tiny_model_dir)
    a.update(*_step_batch(1))
    before = save_checkpoint(tmp_path / "step_000001", a, step=1)
    files = {p.relative_to(before): p.read_bytes() for p in before.rglob("*") if p.is_file()}
    a.update(*_step_batch(2))
    with pytest.raises(CheckpointWriteError) as failed:
        save_checkpoint(tmp_path / "step_000002", a, step=2, fail_write=True)
    message = str(failed.value)
    assert "\n" not in message and "No space left on device" in message and "step_000002" in message
    assert message.endswith(f"latest is still {before}")
    assert (tmp_path / "latest").read_text() == "step_000001\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]   # no partial folder
    assert {p.relative_to(before): p.read_bytes() for p in before.rglob("*") if p.is_file()} == files
    save_checkpoint(tmp_path / "step_000003", a, step=3)         # the next write succeeds
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000003"


def test_any_oserror_in_a_write_is_a_checkpoint_write_error(tmp_path, tiny_model_dir, monkeypatch):
    import rstar2_cli.rl.update.checkpoint as checkpoint

    a = _policy(tiny_model_dir)
    save_checkpoint(tmp_path / "step_000001", a, step=1)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "config.json")
    monkeypatch.setattr(checkpoint, "_write_hf_config", read_only)
    with pytest.raises(CheckpointWriteError, match=r"writing config: PermissionError: .*Permission denied"):
        save_checkpoint(tmp_path / "step_000002", a, step=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"


def test_the_hf_folder_splits_into_files_that_fill_from_safetensors_reads(tmp_path, tiny_model_dir, monkeypatch):
    """Weights over several files (the 5 GB split, made small here) load with from_pretrained and
    with the trainer's own sliced loader; tied aliases are left out as save_pretrained does."""
    import json

    from transformers import AutoModelForCausalLM

    import rstar2_cli.rl.update.checkpoint as checkpoint
    from rstar2_cli.rl.update.model_load import fill_from_safetensors

    a = _policy(tiny_model_dir)
    a.update(*_step_batch(1))
    monkeypatch.setattr(checkpoint, "file_index", lambda state: file_index(state, 40_000))
    step_dir = save_checkpoint(tmp_path / "step_000001", a, step=1)
    index = json.loads((step_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (step_dir / "sharded").exists()
    loaded = AutoModelForCausalLM.from_pretrained(step_dir)
    b = _policy(tiny_model_dir)
    fill_from_safetensors(b.model, step_dir)
    for name, value in a.full_state_dict():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0)
        torch.testing.assert_close(dict(b.full_state_dict())[name], value, atol=0, rtol=0)
