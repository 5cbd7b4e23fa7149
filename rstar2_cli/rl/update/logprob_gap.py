"""Each logged trajectory's gap between the engine's and the trainer's log-probs.

What: for a trajectory the update trained, over its loss tokens (loss_mask 1), `mean_abs` =
mean |trainer log-prob - engine log-prob| and `max_abs` the largest of them, with `tokens` the
count: the step metric `train/logprob_abs_diff_vllm` (`PolicyTrainer.update`) taken per
trajectory, from the same values (the update's own log-probs, or the no-grad pass before it, and
the engine's sampling log-probs: no extra forward). The step metric is the token-weighted mean of
the per-trajectory `mean_abs`.

Where the pieces are: the rollout host picks and renders its log records (`rollout_log.py`)
before the exchange (`exchange.py`); each training rank's update returns the gaps of the
trajectories it trained (`PolicyTrainer.update(...).gaps`, keyed by `gap_label`). After the update,
`fill_logprob_gaps` (a collective every rank calls) joins the two: the hosts broadcast the labels
of their records, every rank answers with the gaps it holds for them (an all-gather of those few
entries only), and each host sets its records' `logprob_gap` before it writes its file.

A label is (prompt_id, sample index): what a trained trajectory keeps through the exchange
(`exchange.pack`'s `label`). A problem drawn twice in one batch (a batch that crosses an epoch,
`rl/run/sampler.py`) gives two trajectories with one label; neither can be told apart, so both keep
a null gap. Only records with an advantage (RoC kept them: the update trained them) are joined;
the others, and trained ones without the engine's log-probs, keep null.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rollout.trajectory import Trajectory

Label = tuple[str, int]
# {"mean_abs": float, "max_abs": float, "tokens": int}; None: two trained trajectories share the label
Gap = dict[str, float] | None


def gap_label(t: Trajectory) -> Label:
    """A trained trajectory's label (module docstring)."""
    return str(t.prompt_id), int(t.sample_index)


def record_label(record: Mapping[str, Any]) -> Label:
    """A rollout-log record's label (`rollout_log.RolloutLog.record`'s prompt_id and sample)."""
    return str(record["prompt_id"]), int(record["sample"])


def trajectory_gap(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(sum |trainer - engine| * mask, mask sum, max |trainer - engine| where mask > 0) over one
    trajectory's loss positions; tensors of equal shape, any device."""
    diff = (trainer.detach().float() - engine.detach().float().to(trainer.device)).abs()
    mask = mask.to(diff.device, diff.dtype)
    on = mask > 0
    return float((diff * mask).sum()), float(mask.sum()), float(diff[on].max()) if bool(on.any()) else 0.0


def add_gap(gaps: dict[Label, Gap], t: Trajectory, abs_sum: float, tokens: float, max_abs: float) -> None:
    """Record `t`'s gap in `gaps` (a second trajectory with its label: None, see the module docstring)."""
    if tokens <= 0:
        return
    label = gap_label(t)
    gaps[label] = None if label in gaps else {"mean_abs": abs_sum / tokens, "max_abs": max_abs, "tokens": int(tokens)}


def engine_gaps(members: Sequence[tuple[Trajectory, Any]], ref: torch.Tensor, vllm_diff: list[float],
                gaps: dict[Label, Gap]) -> None:
    """|trainer - engine| log-probs of a packed row's members ((trajectory, its `TokenTensors`) in
    row order; `ref`: the trainer's log-probs at the row's loss positions): summed into `vllm_diff`
    (the step metric's [sum, tokens]) and per trajectory into `gaps`. A member without the
    engine's log-probs adds nothing."""
    ref = ref.detach().float().cpu()       # one copy per row; the members' slices are views of it
    offset = 0
    for t, tensors in members:
        n = tensors.mask.numel()
        if tensors.rollout is not None:
            abs_sum, tokens, max_abs = trajectory_gap(ref[offset:offset + n], tensors.rollout, tensors.mask)
            vllm_diff[0] += abs_sum
            vllm_diff[1] += tokens
            add_gap(gaps, t, abs_sum, tokens, max_abs)
        offset += n


def fill_logprob_gaps(records: list[dict[str, Any]] | None, gaps: Mapping[Label, Gap], *, hosts: Sequence[int],
                      rank: int) -> list[dict[str, Any]] | None:
    """Set `logprob_gap` of this host's rollout-log `records` from the gaps of every rank.

    A collective: every rank calls it, at the same point of the step, after the update.
    `records`: this rank's records if it is a rollout host (`StepShard.records`; [] when it logs
    nothing), None on every other rank. `gaps`: this rank's per-trajectory gaps of the step
    (`PolicyTrainer.update(...).gaps`; {} where the rank trained nothing). `hosts`: the
    rollout hosts' ranks, in node order (`rollouts.host_ranks`); `rank`: this rank's.
    Returns `records`, each with `logprob_gap` a `{"mean_abs", "max_abs", "tokens"}` dict or None
    (module docstring); None on ranks that are not hosts. Without a process group it is the plain
    join of `records` and `gaps`.

    Traffic: one broadcast of each host's labels (a few hundred at `train.log_rollouts` 4), then,
    unless no host logs anything, one all-gather of the gaps that match them; nothing when no
    trajectory is logged."""
    trained = [r for r in records or [] if r.get("advantage") is not None]
    wanted: list[list[Label]] = rl_dist.broadcast_from_each(sorted({record_label(r) for r in trained}), list(hosts))
    found: dict[Label, list[Gap]] = defaultdict(list)
    if any(wanted):
        mine = [[(label, gaps[label]) for label in labels if label in gaps] for labels in wanted]
        everyone = rl_dist.all_gather_objects(mine)
        if records is not None:
            if rank not in hosts:
                raise ValueError(f"rank {rank} holds rollout-log records but is not a rollout host {list(hosts)}")
            h = list(hosts).index(rank)
            for per_host in everyone:
                for label, gap in per_host[h]:
                    found[label].append(gap)
    if records is None:
        return None
    seen: dict[Label, int] = defaultdict(int)
    for r in trained:
        seen[record_label(r)] += 1
    for r in records:
        label = record_label(r)
        hits = found.get(label, []) if r.get("advantage") is not None else []
        r["logprob_gap"] = hits[0] if len(hits) == 1 and seen[label] == 1 else None
    return records
