"""Only the model's own outcomes train: sandbox, engine and grader faults leave the batch, counted
per reason; void-turn trajectories too when the recipe opts in."""
from __future__ import annotations

import numpy as np

from rstar2_cli.config import RocConfig, load_recipe_dict
from rstar2_cli.rl.selection.roc import select_for_training
from rstar2_cli.rollout.trajectory import Trajectory


def _t(i: int, reward: float, reason: str, infra: str = "", void: int = 0) -> Trajectory:
    return Trajectory(prompt_id="p", sample_index=i, reward=reward, grade_reason=reason, infra_error=infra,
                      num_void_turns=void, num_tool_calls=1, num_turns=2, text="<answer>\\boxed{1}</answer>")


def _group() -> list[Trajectory]:
    return [_t(0, 1.0, "correct"), _t(1, 0.0, "wrong"), _t(2, 0.0, "timeout"), _t(3, 0.0, "grader_crash"),
            _t(4, 0.0, "grader_error"), _t(5, 1.0, "correct", infra="sandbox_internal_error"),
            _t(6, 0.0, "wrong", infra="engine_error"), _t(7, 0.0, "wrong", void=1)]


def test_grader_sandbox_and_engine_faults_are_left_out_and_counted_per_reason():
    res = select_for_training(_group(), RocConfig(enabled=False), group_size=8, rng=np.random.default_rng(0))
    assert [t.sample_index for t in res.trajectories] == [0, 1, 7]
    m = res.metrics
    assert m["faults/excluded"] == 5 == m["roc/infra_excluded"]
    assert {k: m[k] for k in m if k.startswith("faults/excluded_")} == {
        "faults/excluded_grader_timeout": 1, "faults/excluded_grader_crash": 1, "faults/excluded_grader_error": 1,
        "faults/excluded_sandbox_internal_error": 1, "faults/excluded_engine_error": 1}
    assert m["agent/void_turn_excluded"] == 0


def test_void_turn_trajectories_are_left_out_only_when_the_recipe_opts_in():
    cfg = load_recipe_dict({"data": {"train": "x.jsonl"}, "roc": {"enabled": False, "exclude_void_turns": True}}).roc
    res = select_for_training(_group(), cfg, group_size=8, rng=np.random.default_rng(0))
    assert [t.sample_index for t in res.trajectories] == [0, 1]
    assert res.metrics["agent/void_turn_excluded"] == 1
    assert load_recipe_dict({"data": {"train": "x.jsonl"}}).roc.exclude_void_turns is False
