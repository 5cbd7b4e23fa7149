"""Prompt batches from a seeded permutation per epoch, resumable by position.

Why not a torch DataLoader: resuming must continue with exactly the prompts the interrupted run
would have used next. The whole state is (epoch, offset) plus the seed: epoch e's order is
`default_rng([seed, e]).permutation(n)`, so a restored sampler yields the same next batch.
A batch that reaches the end of an epoch is completed from the start of the next one.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class DataSampler:
    def __init__(self, num_items: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if num_items < 1:
            raise ValueError(f"DataSampler: num_items must be >= 1, got {num_items}")
        if batch_size < 1:
            raise ValueError(f"DataSampler: batch_size must be >= 1, got {batch_size}")
        self.num_items, self.batch_size, self.seed, self.shuffle = num_items, batch_size, seed, shuffle
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)

    def next_batch(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch_size:
            order = self._order(self.epoch)
            take = order[self.offset: self.offset + self.batch_size - len(out)]
            out.extend(int(i) for i in take)
            self.offset += len(take)
            if self.offset >= self.num_items:
                self.epoch, self.offset = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"num_items": self.num_items, "batch_size": self.batch_size, "seed": self.seed,
                "shuffle": self.shuffle, "epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_items", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"DataSampler: checkpoint has {key}={state[key]!r}, this run has "
                                 f"{getattr(self, key)!r}; the data order would not match")
        # batch_size may change on resume (a new prompts_per_step): the position is what matters
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
