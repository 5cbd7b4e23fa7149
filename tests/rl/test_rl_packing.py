"""Packed micro-batches must score every loss token exactly as if each sequence ran alone."""
from __future__ import annotations

import pytest
import torch
from rl_synthetic import build_tiny_model, make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.rl.packing import pack_sequences, plan_bins
from rstar2_cli.rl.policy import PolicyTrainer


def test_plan_bins_respects_budget_and_isolates_long_sequences():
    bins = plan_bins([30, 10, 25, 5, 90, 20], budget=50)
    lengths = [30, 10, 25, 5, 90, 20]
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert [4] in bins                                     # longer than the budget: alone
    assert all(sum(lengths[i] for i in b) <= 50 for b in bins if b != [4])


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty prompt_ids"):
        pack_sequences([([], [1, 2])], 10)


def _reference_logprobs(model, t):
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = len(t.prompt_ids)
    return logp[p - 1:-1].gather(-1, torch.tensor(t.response_ids)[:, None])[:, 0]


def test_packed_logprobs_equal_per_sequence_logprobs():
    model = build_tiny_model()
    batch = make_trajectories(10, seed=3)
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False), OptimConfig(), LossConfig(),
                           micro_batch_tokens=120, model=model)
    rows = policy._rows(batch)
    assert any(len(r.spans) >= 2 for r in rows), "the test must actually pack several sequences in a row"
    assert any(0 in t.loss_mask for t in batch), "the test must have tool-response (unscored) tokens"
    packed = policy.compute_logprobs(batch)
    for t, lp in zip(batch, packed):
        assert lp.shape == (sum(t.loss_mask),)           # loss positions only
        keep = torch.tensor(t.loss_mask) != 0
        torch.testing.assert_close(lp, _reference_logprobs(model, t)[keep], atol=1e-5, rtol=0)


def test_micro_batch_budget_does_not_change_the_update():
    """Token-level normalisation over the whole step: many small micro-batches == one big one."""
    batch = make_trajectories(8, seed=5)
    adv = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1]
    results = []
    for budget in (40, 10_000):
        policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                               OptimConfig(lr=1e-3, warmup_steps=0), LossConfig(), micro_batch_tokens=budget,
                               model=build_tiny_model())
        rows = len(policy._rows(batch))
        stats = policy.update(batch, adv)
        results.append((rows, stats, dict(policy.full_state_dict())))
    (rows_small, s_small, p_small), (rows_big, s_big, p_big) = results
    assert rows_small > 2 and rows_big == 1
    assert s_small["loss"] == pytest.approx(s_big["loss"], abs=1e-6)
    assert s_small["grad_norm"] == pytest.approx(s_big["grad_norm"], rel=1e-5)
    for name in p_big:
        torch.testing.assert_close(p_small[name], p_big[name], atol=1e-4, rtol=0)   # Adam: ~lr/|g| noise
