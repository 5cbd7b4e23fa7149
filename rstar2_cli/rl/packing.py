"""Pack trajectories into micro-batches by token budget: one row per micro-batch.

Why packing and not padding: agent trajectories vary from a few hundred to many thousand tokens;
padding a batch to its longest member wastes most of the compute. Sequences are concatenated in
one row with `position_ids` restarting at 0 for each; with `attention_mask=None`, transformers
(>= 4.54, `masking_utils.find_packed_sequence_indices`) turns restarting position ids into a
block-diagonal causal mask for sdpa/eager/flash attention, so no token attends across sequences.
`tests/rl/test_rl_packing.py` checks that packed logprobs equal per-sequence logprobs.

Placement is first-fit decreasing (deterministic). A sequence longer than the budget gets a
micro-batch of its own rather than being cut.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Span:
    index: int          # position of the sequence in the caller's list
    start: int          # offset of its first prompt token in the row
    prompt_len: int
    response_len: int


@dataclass
class PackedRow:
    input_ids: torch.Tensor      # [1, L]
    position_ids: torch.Tensor   # [1, L]
    spans: list[Span]

    def logit_positions(self) -> torch.Tensor:
        """Row positions whose logits predict the response tokens, span after span."""
        idx = [torch.arange(s.start + s.prompt_len - 1, s.start + s.prompt_len + s.response_len - 1)
               for s in self.spans]
        return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)

    def target_ids(self) -> torch.Tensor:
        ids = self.input_ids[0]
        tgt = [ids[s.start + s.prompt_len: s.start + s.prompt_len + s.response_len] for s in self.spans]
        return torch.cat(tgt) if tgt else torch.zeros(0, dtype=torch.long)


def plan_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: lists of indices whose lengths sum to <= budget (or one long item)."""
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return [sorted(b) for b in bins]


def pack_sequences(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], budget: int) -> list[PackedRow]:
    """(prompt_ids, response_ids) pairs -> packed rows. Prompts must be non-empty."""
    for i, (p, _) in enumerate(seqs):
        if len(p) == 0:
            raise ValueError(f"sequence {i}: empty prompt_ids (the first response token needs a context)")
    lengths = [len(p) + len(r) for p, r in seqs]
    rows = []
    for members in plan_bins(lengths, budget):
        ids: list[int] = []
        pos: list[int] = []
        spans = []
        for i in members:
            p, r = seqs[i]
            spans.append(Span(i, len(ids), len(p), len(r)))
            ids.extend(list(p) + list(r))
            pos.extend(range(len(p) + len(r)))
        rows.append(PackedRow(torch.tensor([ids], dtype=torch.long),
                              torch.tensor([pos], dtype=torch.long), spans))
    return rows
