"""Clip-Higher loss, token-level normalisation and GRPO advantages against hand computation."""
from __future__ import annotations

import math

import pytest
import torch

from rstar2_cli.rl.update.loss import advantages_for_groups, clip_higher_loss, group_advantages, loss_stats, tis_weights
from rstar2_cli.rollout.trajectory import Trajectory

EPS_LOW, EPS_HIGH = 0.2, 0.28


def policy_loss(logp, old, adv, mask, global_tokens, eps_low, eps_high, tis=None, dual_clip=None):
    """The loss and its stats over the same tokens, as the update computes them."""
    return (clip_higher_loss(logp, old, adv, mask, global_tokens, eps_low, eps_high, tis=tis, dual_clip=dual_clip),
            loss_stats(logp, old, adv, mask, eps_low, eps_high, tis=tis))


def test_group_advantages_use_sample_std():
    adv = group_advantages([1, 0, 0, 1])
    s = math.sqrt(1 / 3)                      # Bessel-corrected std of [1, 0, 0, 1]
    assert adv == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-5)
    assert group_advantages([1.0]) == pytest.approx([1.0])           # verl: mean 0, std 1
    assert group_advantages([1, 1, 1]) == pytest.approx([0, 0, 0])


def test_advantages_are_normalised_within_each_group():
    groups = [[Trajectory("a", reward=r) for r in (1, 0)], [Trajectory("b", reward=r) for r in (1, 1, 0, 0)]]
    adv = advantages_for_groups(groups)
    assert adv[:2] == pytest.approx(group_advantages([1, 0]))
    assert adv[2:] == pytest.approx(group_advantages([1, 1, 0, 0]))


def _micro(ratios, advs, mask):
    old = torch.zeros(len(ratios), dtype=torch.float64)
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_(True)
    return logp, old, torch.tensor(advs, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)


def test_loss_matches_hand_computation_across_two_micro_batches():
    # micro-batch 1: A=+1 ratio 1.5 -> upper clip: -1.28 | A=+1 r=1.1 -> -1.1
    #                A=+1 r=0.7 -> lower bound irrelevant for A>0: -0.7 | A=-2 r=0.5 -> clipped: 2*0.8=1.6
    mb1 = _micro([1.5, 1.1, 0.7, 0.5], [1, 1, 1, -2], [1, 1, 1, 1])
    # micro-batch 2: A=-1 r=1.5 -> upper bound irrelevant for A<0: 1.5 | A=-1 r=0.9 -> 0.9 | masked tool token
    mb2 = _micro([1.5, 0.9, 2.0], [-1, -1, 0.5], [1, 1, 0])
    global_tokens = 6                         # 4 + 2 loss tokens in the whole step
    l1, s1 = policy_loss(*mb1[:2], mb1[2], mb1[3], global_tokens, EPS_LOW, EPS_HIGH)
    l2, s2 = policy_loss(*mb2[:2], mb2[2], mb2[3], global_tokens, EPS_LOW, EPS_HIGH)
    assert float(l1.detach()) == pytest.approx((-1.28 - 1.1 - 0.7 + 1.6) / 6)
    assert float(l2.detach()) == pytest.approx((1.5 + 0.9) / 6)
    (l1 + l2).backward()
    # d/dlogp of -A*ratio is -A*ratio where unclipped, 0 where the clipped branch is taken
    assert mb1[0].grad.tolist() == pytest.approx([0.0, -1.1 / 6, -0.7 / 6, 0.0])
    assert mb2[0].grad.tolist() == pytest.approx([1.5 / 6, 0.9 / 6, 0.0])
    assert (s1.clipped_high, s1.clipped_low, s1.tokens) == (1, 1, 4)
    assert (s2.clipped_high, s2.clipped_low, s2.tokens) == (0, 0, 2)
    # one big batch with the same global count gives the same loss (gradient accumulation is exact)
    cat = [torch.cat([a.detach(), b.detach()]) for a, b in zip(mb1, mb2)]
    big, _ = policy_loss(cat[0], cat[1], cat[2], cat[3], global_tokens, EPS_LOW, EPS_HIGH)
    assert float(big) == pytest.approx(float(l1.detach()) + float(l2.detach()))


def test_ratio_one_gives_minus_mean_advantage():
    logp = torch.tensor([-1.0, -2.0, -3.0])
    loss, stats = policy_loss(logp, logp.clone(), torch.tensor([1.0, -1.0, 2.0]), torch.ones(3), 3,
                              EPS_LOW, EPS_HIGH)
    assert float(loss) == pytest.approx(-(1 - 1 + 2) / 3)
    assert stats.as_metrics()["ratio_mean"] == pytest.approx(1.0)


def test_truncated_importance_weights_cap_and_scale():
    old = torch.tensor([-1.0, -2.0])
    vllm = torch.tensor([-2.0, -1.0])
    w = tis_weights(old, vllm, cap=2.0)
    assert w.tolist() == pytest.approx([2.0, math.exp(-1)])
    loss, stats = policy_loss(old.clone(), old, torch.tensor([1.0, 1.0]), torch.ones(2), 2, EPS_LOW, EPS_HIGH, tis=w)
    assert float(loss) == pytest.approx(-(2.0 + math.exp(-1)) / 2)
    assert stats.as_metrics()["tis_weight_mean"] == pytest.approx((2.0 + math.exp(-1)) / 2)


def test_dual_clip_bounds_negative_advantage_tokens():
    logp = torch.log(torch.tensor([5.0, 5.0]))
    old, adv = torch.zeros(2), torch.tensor([-1.0, 1.0])
    plain, _ = policy_loss(logp, old, adv, torch.ones(2), 2, EPS_LOW, EPS_HIGH)
    dual, _ = policy_loss(logp, old, adv, torch.ones(2), 2, EPS_LOW, EPS_HIGH, dual_clip=3.0)
    assert float(plain) == pytest.approx((5.0 - 1.28) / 2)      # A<0, ratio 5: unbounded -A·ratio
    assert float(dual) == pytest.approx((3.0 - 1.28) / 2)       # bounded by -A·c = 3


def test_zero_global_tokens_is_rejected():
    x = torch.zeros(1)
    with pytest.raises(ValueError, match="global_tokens"):
        policy_loss(x, x, x, x, 0, EPS_LOW, EPS_HIGH)
