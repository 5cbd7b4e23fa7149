"""DataSampler: seeded per-epoch permutations that resume at the same position."""
from __future__ import annotations

import pytest

from rstar2_cli.rl.run.sampler import DataSampler


def test_each_epoch_is_a_permutation_and_batches_cross_epochs():
    s = DataSampler(10, 4, seed=1)
    batches = [s.next_batch() for _ in range(5)]             # 20 items = 2 epochs
    flat = [i for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]                            # a new order each epoch
    assert all(len(b) == 4 for b in batches)


def test_restore_continues_with_the_same_batches():
    a = DataSampler(7, 3, seed=5)
    for _ in range(4):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch() for _ in range(3)]
    b = DataSampler(7, 3, seed=5)
    b.load_state_dict(state)
    assert [b.next_batch() for _ in range(3)] == expected


def test_restore_with_another_dataset_is_refused():
    state = DataSampler(7, 3, seed=5).state_dict()
    with pytest.raises(ValueError, match="num_items"):
        DataSampler(8, 3, seed=5).load_state_dict(state)
