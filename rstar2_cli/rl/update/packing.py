"""Lay trajectories out as micro-batches by token budget, so that no token attends across trajectories.

Two layouts (`LAYOUTS`), chosen with the attention kernel (models/attention.py):

  packed  sequences concatenated in one `[1, T]` row, `position_ids` restarting at 0 for each. For
          `flash_attention_2`: the forward gets the row's `cu_seq_lens` and max length
          (`PackedRow.varlen_kwargs`) with `attention_mask=None`, and transformers calls the
          variable-length kernel with them (`modeling_flash_attention_utils._flash_attention_forward`),
          so each sequence attends only to itself and no mask exists. Placement is first-fit decreasing.
  padded  sequences sorted by length and cut into `[B, L]` buckets (B x L <= budget), right-padded,
          `position_ids` = 0..L-1 in every row. For SDPA: with no mask and increasing position ids
          transformers skips the mask and SDPA runs its causal kernel (`masking_utils.
          _ignore_causal_mask_sdpa`); causality alone keeps each row's real tokens from seeing the
          padding after them, and padding is never scored. A packed row under SDPA would instead make
          transformers build a dense `[1, 1, T, T]` block-diagonal mask and SDPA compute all T^2
          blocks (`find_packed_sequence_indices`): `benchmarks/timing/bench_update.py` measures both.

A bucket closes when the next (shorter) sequence would leave more than `1 - MIN_FILL` of its
row as padding, which bounds the wasted linear FLOPs; `docs/benchmarks.md` has the figures the
value was chosen from. A sequence longer than the budget gets a micro-batch of its own rather than
being cut. Both layouts are deterministic. `tests/rl/test_rl_packing.py` checks that log-probs and
gradients in either layout equal per-sequence ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

LAYOUTS = ("packed", "padded")
# padded: a bucket's rows are at least this full (shortest / longest member); chosen from
# benchmarks/timing/bench_update.py's layout sweep (docs/benchmarks.md)
MIN_FILL = 0.8


@dataclass
class Span:
    index: int          # position of the sequence in the caller's list
    start: int          # offset of its first prompt token in its row
    prompt_len: int
    response_len: int
    row: int = 0        # the row of the micro-batch it sits in


@dataclass
class PackedRow:
    """One micro-batch: `[B, L]` token and position ids (B = 1 for the packed layout)."""
    input_ids: torch.Tensor      # [B, L]
    position_ids: torch.Tensor   # [B, L]
    spans: list[Span]

    def logit_positions(self) -> torch.Tensor:
        """Flat positions (row * L + column) whose logits predict the response tokens, span after span."""
        width = self.input_ids.shape[1]
        idx = [torch.arange(s.start + s.prompt_len - 1, s.start + s.prompt_len + s.response_len - 1) + s.row * width
               for s in self.spans]
        return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)

    def target_ids(self) -> torch.Tensor:
        return self.input_ids.reshape(-1)[self.logit_positions() + 1]

    @property
    def tokens(self) -> int:
        """Real (non-padding) tokens."""
        return sum(s.prompt_len + s.response_len for s in self.spans)

    def varlen_kwargs(self, device: torch.device | str) -> dict:
        """flash-attn's variable-length arguments of a packed `[1, T]` row, computed on the host.

        Why: given only restarting `position_ids`, transformers 5.19 re-derives the sequence
        boundaries in every attention call of every layer and waits on the device three times to do
        it (`modeling_flash_attention_utils._is_packed_sequence` branches on a device bool,
        `prepare_fa_kwargs_from_position_ids` runs `nonzero`, and the tensor `max_length` becomes an
        int in the kernel call). With `cu_seq_lens_q/k` and integer `max_length_q/k` it takes the
        `is_fa_with_varlen_kwargs` branch instead, which waits on nothing. `cu_seq_lens` is int32
        (the kernel's type), one copy to `device` per micro-batch."""
        if self.input_ids.shape[0] != 1:
            raise ValueError(f"varlen_kwargs: a packed [1, T] row is needed, got {list(self.input_ids.shape)}")
        lengths = [s.prompt_len + s.response_len for s in self.spans]
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        cu = torch.tensor(bounds, dtype=torch.int32).to(device)
        longest = max(lengths)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def plan_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: lists of indices whose lengths sum to <= budget (or one long item)."""
    _check_budget(budget)
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


def plan_buckets(lengths: Sequence[int], budget: int, min_fill: float = MIN_FILL) -> list[list[int]]:
    """Length-sorted buckets: each holds n sequences with n x (its longest) <= budget (or one long
    item) and no member shorter than `min_fill` x its longest; longest first within a bucket."""
    _check_budget(budget)
    if not 0.0 <= min_fill <= 1.0:
        raise ValueError(f"min_fill must be in [0, 1], got {min_fill}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    buckets: list[list[int]] = []
    for i in order:
        cur = buckets[-1] if buckets else None
        if (cur is None or (len(cur) + 1) * lengths[cur[0]] > budget
                or lengths[i] < min_fill * lengths[cur[0]]):
            buckets.append([i])
        else:
            cur.append(i)
    return buckets


def _check_budget(budget: int) -> None:
    if not isinstance(budget, int):     # a recipe's "auto" is a number once its device is known
        raise ValueError(f"micro_batch_tokens must be a number, got {budget!r} (config.check_placement sizes auto)")
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {budget}")


def _check_prompts(seqs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    for i, (p, _) in enumerate(seqs):
        if len(p) == 0:
            raise ValueError(f"sequence {i}: empty prompt_ids (the first response token needs a context)")


def pack_sequences(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], budget: int) -> list[PackedRow]:
    """(prompt_ids, response_ids) pairs -> packed `[1, T]` rows. Prompts must be non-empty."""
    _check_prompts(seqs)
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


def pad_sequences(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], budget: int,
                  min_fill: float = MIN_FILL, pad_id: int = 0) -> list[PackedRow]:
    """(prompt_ids, response_ids) pairs -> right-padded `[B, L]` buckets (`plan_buckets`).
    `pad_id` only has to be a valid token id: padding sits after every real token of its row."""
    _check_prompts(seqs)
    lengths = [len(p) + len(r) for p, r in seqs]
    rows = []
    for members in plan_buckets(lengths, budget, min_fill):
        width = lengths[members[0]]
        ids = torch.full((len(members), width), pad_id, dtype=torch.long)
        spans = []
        for b, i in enumerate(members):
            p, r = seqs[i]
            ids[b, :lengths[i]] = torch.tensor(list(p) + list(r), dtype=torch.long)
            spans.append(Span(i, 0, len(p), len(r), row=b))
        pos = torch.arange(width, dtype=torch.long).expand(len(members), width).contiguous()
        rows.append(PackedRow(ids, pos, spans))
    return rows


def micro_batches(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], budget: int, layout: str) -> list[PackedRow]:
    """The micro-batches of `seqs` in `layout` (one of `LAYOUTS`)."""
    if layout == "packed":
        return pack_sequences(seqs, budget)
    if layout == "padded":
        return pad_sequences(seqs, budget)
    raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
