"""Stage-3 hard subset: keep problems the policy does not solve in every sample."""
from __future__ import annotations

import pytest

from rstar2_cli.data.hard_subset import select_hard


def test_keeps_problems_not_always_solved():
    counts = {"easy": (8, 8), "hard": (3, 8), "unsolved": (0, 8), "almost": (7, 8)}
    assert select_hard(counts) == ["almost", "hard", "unsolved"]


def test_lower_threshold_and_short_totals():
    counts = {"a": (5, 8), "b": (4, 8), "few_all": (4, 4), "few_some": (3, 4)}
    assert select_hard(counts, threshold_solved=5) == ["b", "few_some"]


@pytest.mark.parametrize("bad", [(9, 8), (-1, 8), (0, 0)])
def test_invalid_counts_raise(bad):
    with pytest.raises(ValueError, match="invalid pass count"):
        select_hard({"p": bad})
