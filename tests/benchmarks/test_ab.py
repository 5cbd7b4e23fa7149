"""benchmarks/compare/ab.py, the A/B harness: the quickstart pools its seeds the way docs/benchmarks.md reports
them, bad input stops it before any run, and a folder is taken as the tree it is."""
from __future__ import annotations

import ab
import pytest


def _seed(seed: int, a_min: float, b_min: float, gap: float) -> dict:
    return {"seed": seed, "a": {"minutes": a_min}, "b": {"minutes": b_min},
            "speedup_main_pipeline": a_min / b_min, "final_accuracy_points_b_minus_a": gap}


def test_speedup_is_pooled_over_seeds_and_every_accuracy_gap_is_kept():
    out = ab.summarise([_seed(0, 4.5, 3.0, 0.0), _seed(1, 3.0, 3.0, -2.0), _seed(2, 4.5, 3.0, 1.0)])
    assert out["seeds"] == [0, 1, 2]
    assert out["speedup_pooled"] == pytest.approx(12.0 / 9.0)          # minutes summed, not ratios averaged
    assert out["speedup_per_seed"] == pytest.approx([1.5, 1.0, 1.5])
    assert out["final_accuracy_points_b_minus_a"] == [0.0, -2.0, 1.0] and out["max_abs_accuracy_gap_points"] == 2.0


def test_bad_seeds_are_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ab.main(["quickstart", "--a", "HEAD", "--seeds", "0,x", "--work", str(tmp_path)])
    assert "--seeds '0,x': expected comma-separated integers" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []                              # no worktree, no run


def test_a_folder_is_the_tree_itself(tmp_path):
    with ab.checkout(str(tmp_path), tmp_path / "work") as tree:
        assert tree == tmp_path.resolve()
    assert tmp_path.exists() and not (tmp_path / "work").exists()
