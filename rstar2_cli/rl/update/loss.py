"""GRPO advantages and the Clip-Higher policy-gradient loss (rStar2-Agent: no KL, no entropy term).

Why token-level normalisation over the WHOLE step: the loss is sum(per-token loss) / (number of
loss tokens in the step, across micro-batches and ranks). Each micro-batch divides by that same
global count, so gradient accumulation over micro-batches and data parallelism give exactly the
gradient of one big batch, and long trajectories are not down-weighted (DAPO's token-mean).

Advantages follow the release (verl ``compute_grpo_outcome_advantage``):
A_i = (r_i − mean) / (std + 1e-6) over the kept group, with the SAMPLE std (``torch.std``,
Bessel-corrected); a group of one gets mean 0 and std 1 as in verl.

Optional truncated importance sampling (TIS) reweights each token by
min(exp(old − rollout), cap) to correct the mismatch between the engine that sampled (vLLM) and
the trainer's own old logprobs; off by default, detached (a weight, not a gradient path). With
`train.max_staleness` >= 1 it is required and is the off-policy correction as well: `rollout` is
then the behaviour policy (weights up to k steps old) and `old` the proximal policy (this step's
weights), i.e. decoupled PPO (AReaL) with a truncated rather than masked behaviour weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

ADVANTAGE_EPS = 1e-6


def group_advantages(rewards: Sequence[float], eps: float = ADVANTAGE_EPS) -> list[float]:
    """(r − mean) / (sample std + eps) over one group."""
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float64)
    if r.numel() == 0:
        return []
    if r.numel() == 1:
        mean, std = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    else:
        mean, std = r.mean(), r.std()
    return ((r - mean) / (std + eps)).tolist()


def advantages_for_groups(groups: Sequence[Sequence[Any]]) -> list[float]:
    """One advantage per trajectory, groups flattened in order (matches RocResult.trajectories)."""
    return [a for g in groups for a in group_advantages([t.reward for t in g])]


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """min(exp(old − rollout), cap), detached."""
    return torch.exp(old_logprobs.detach() - rollout_logprobs.detach()).clamp(max=cap)


@dataclass
class LossStats:
    """Token-weighted sums over one micro-batch; divide by `tokens` (or add them up first)."""
    tokens: float = 0.0
    clipped_low: float = 0.0    # A < 0 and ratio < 1 − eps_low: the lower clip is active
    clipped_high: float = 0.0   # A > 0 and ratio > 1 + eps_high: the upper clip is active
    ratio_sum: float = 0.0
    entropy_sum: float = 0.0
    tis_weight_sum: float = 0.0
    tis_capped: float = 0.0     # tokens whose TIS weight hit the cap

    def __iadd__(self, other: "LossStats") -> "LossStats":
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def as_metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {"clip_frac_low": self.clipped_low / n, "clip_frac_high": self.clipped_high / n,
                "clip_frac": (self.clipped_low + self.clipped_high) / n,
                "ratio_mean": self.ratio_sum / n, "entropy": self.entropy_sum / n,
                "tis_weight_mean": self.tis_weight_sum / n, "tis_capped_frac": self.tis_capped / n,
                "loss_tokens": self.tokens}


def clip_higher_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     loss_mask: torch.Tensor, global_tokens: float, eps_low: float, eps_high: float,
                     tis: torch.Tensor | None = None, dual_clip: float | None = None) -> torch.Tensor:
    """Clip-Higher PPO loss, summed over masked tokens and divided by `global_tokens`.

    All tensors are per token and the same shape (advantages already broadcast per token).
    per-token loss = max(−A·ratio, −A·clip(ratio, 1 − eps_low, 1 + eps_high)) [· tis].
    `dual_clip` = c bounds the loss of A < 0 tokens by −A·c (verl's clip_ratio_c, 3.0 by default
    there, so active in the release run); None (the paper's description) leaves it out.
    A sum of per-token terms, so it may be evaluated piece by piece over the tokens and the pieces
    added up (the chunked log-prob head does, rl/update/logprobs.py); `loss_stats` reports on the same tokens.
    """
    if global_tokens <= 0:
        raise ValueError(f"global_tokens must be > 0, got {global_tokens}")
    mask = loss_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    adv = advantages.to(logprobs.dtype)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    if tis is not None:
        per_token = per_token * tis.detach().to(per_token.dtype)
    return (per_token * mask).sum() / global_tokens


@torch.no_grad()
def loss_stats(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               loss_mask: torch.Tensor, eps_low: float, eps_high: float, tis: torch.Tensor | None = None,
               entropy: torch.Tensor | None = None, tis_cap: float | None = None) -> LossStats:
    """Token-weighted sums (clip fractions, ratio, entropy, TIS) over the tokens of `clip_higher_loss`.

    `entropy` (per token, for logging) only enters these sums; `tis_cap`: the cap `tis` was
    truncated at (only counted, in `LossStats.tis_capped`)."""
    mask = loss_mask.to(logprobs.dtype)
    r = torch.exp(logprobs.detach() - old_logprobs.detach())
    adv = advantages.to(logprobs.dtype)
    return LossStats(
        tokens=float(mask.sum()),
        clipped_low=float(((adv < 0) & (r < 1.0 - eps_low)).to(mask.dtype).mul(mask).sum()),
        clipped_high=float(((adv > 0) & (r > 1.0 + eps_high)).to(mask.dtype).mul(mask).sum()),
        ratio_sum=float((r * mask).sum()),
        entropy_sum=float((entropy * mask).sum()) if entropy is not None else 0.0,
        tis_weight_sum=float((tis * mask).sum()) if tis is not None else float(mask.sum()),
        tis_capped=float(((tis >= tis_cap) * mask).sum()) if tis is not None and tis_cap is not None else 0.0,
    )

