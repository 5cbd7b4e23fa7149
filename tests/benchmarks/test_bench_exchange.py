"""benchmarks/timing/bench_exchange.py compares the old and the new exchange on the same synthetic batch."""
from __future__ import annotations

from types import SimpleNamespace

import bench_exchange


def test_small_shapes_receive_under_a_2_world_size_th_of_the_old_exchange():
    args = SimpleNamespace(prompts=16, rollouts=8, ranks=8, nodes=2, min_len=256, max_len=1024)
    out = bench_exchange.measure(args)
    assert out["kept"] == 16 * 4 and out["old_bytes_per_rank_max"] > 1_000_000
    assert out["ratio"] <= 1 / (2 * args.ranks)
