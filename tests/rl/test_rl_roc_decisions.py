"""RoC records why it kept, dropped, filtered or excluded each trajectory (`Trajectory.roc_decision`), from its
own selection: the recorded decisions are exactly the result's kept groups."""
from __future__ import annotations

import numpy as np
import pytest

from rstar2_cli.config import RocConfig
from rstar2_cli.rl.selection.roc import select_for_training
from rstar2_cli.rollout.trajectory import RocDecision, Trajectory

CLEAN = "<reason>ok</reason> <answer>\\boxed{1}</answer>"


def traj(i, reward, group=0, errors=0, infra="", pid=None):
    return Trajectory(prompt_id=pid or f"p{group}", sample_index=i, group_index=group, reward=reward,
                      num_tool_calls=2, num_tool_errors=errors, text=CLEAN, num_turns=2, infra_error=infra)


@pytest.mark.parametrize("mode", ["paper", "release"])
def test_decisions_match_the_selection(mode):
    rewards = [1, 1, 1, 0, 0, 0, 1, 0]
    ts = [traj(i, r, errors=i % 3) for i, r in enumerate(rewards)]
    ts += [traj(i, 1, group=1) for i in range(8)]                     # all equal: filtered
    ts += [traj(0, 0, group=2, infra="sandbox_internal_error")] + [traj(i, i % 2, group=2) for i in range(1, 8)]
    res = select_for_training(ts, RocConfig(mode=mode), 4, lambda g: np.random.default_rng(g[0].group_index))
    kept = {id(t) for t in res.trajectories}
    for t in ts:
        d = t.roc_decision
        if t.group_index == 1:
            assert d == RocDecision("filtered", None, "group filtered: all rewards equal")
        elif t.infra_error:
            assert d == RocDecision("excluded", None, "excluded: sandbox_internal_error")
            assert t.exclusion == "sandbox_internal_error"
        else:
            assert d.decision == ("kept" if id(t) in kept else "dropped")
            assert d.as_class == ("positive" if t.reward > 0 else "negative")
            assert d.rule.startswith(f"{d.as_class} {d.decision}: ")
    assert sum(t.roc_decision.decision == "kept" for t in ts) == len(res.trajectories) == 8


def test_plain_grpo_rules_name_the_first_g():
    ts = [traj(i, i % 2) for i in range(6)]
    select_for_training(ts, RocConfig(enabled=False), 4, np.random.default_rng(0))
    assert [t.roc_decision.decision for t in ts] == ["kept"] * 4 + ["dropped"] * 2
    assert ts[0].roc_decision.rule == "negative kept: GRPO, first G=4"
