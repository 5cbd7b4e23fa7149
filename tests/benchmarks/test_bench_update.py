"""benchmarks/timing/bench_update.py measures the two layouts it names on the quickstart's toy model."""
from __future__ import annotations

import bench_update


def test_toy_case_runs_each_layout_on_the_quickstarts_model():
    shape = bench_update.model_shape("toy", 8192)
    assert (shape.hidden, shape.layers, shape.vocab) == (128, 2, 1024)      # QuickstartSettings defaults
    packed = bench_update.run_case("toy", 1024, "packed", steps=1, warmup=0, qwen_vocab=8192)
    chosen = bench_update.run_case("toy", 1024, "chosen", steps=1, warmup=0, qwen_vocab=8192)
    assert (packed["attention"], packed["layout"]) == ("sdpa", "packed")
    assert (chosen["attention"], chosen["layout"]) == ("sdpa", "padded")     # CPU: no flash-attn
    assert packed["tokens"] == chosen["tokens"] and packed["useful_flops"] == chosen["useful_flops"]
    assert packed["computed_tokens"] == packed["tokens"] <= chosen["computed_tokens"] <= 1.25 * chosen["tokens"]
    assert all(s[0] == 1 for s in packed["shapes"]) and any(s[0] > 1 for s in chosen["shapes"])
