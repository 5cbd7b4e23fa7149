"""GRPO-RoC selection: penalties, paper and release modes, edge cases, determinism, bias,
infrastructure failures and grouping by sampled instance."""
from __future__ import annotations

import numpy as np
import pytest

from rstar2_cli.config import RocConfig
from rstar2_cli.rl.selection.roc import (
    downsample_groups,
    error_penalty,
    format_penalty,
    penalties,
    release_error_penalty,
    release_format_penalty,
    release_turn_count,
    select_for_training,
)
from rstar2_cli.rollout.trajectory import Trajectory

CLEAN = "<reason>ok</reason> <answer>\\boxed{1}</answer>"


def traj(i: int, reward: float, calls: int = 2, errors: int = 0, text: str = CLEAN, turns: int = 2,
         pid: str = "p", group: int = 0, infra: str = "") -> Trajectory:
    return Trajectory(prompt_id=pid, sample_index=i, group_index=group, reward=reward, num_tool_calls=calls,
                      num_tool_errors=errors, text=text, num_turns=turns, infra_error=infra)


def release_text(blocks: list[str], answers: int = 1) -> str:
    """A decoded response as the release sees it: first turn (its marker is in the prompt), then
    one user turn of tool responses and one more assistant turn per block."""
    parts = ["<reason>go</reason><tool_call>{}</tool_call><|im_end|>"] if blocks else []
    for b in blocks:
        parts.append(f"\n<|im_start|>user\n<tool_response>\n{b}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                     "<reason>next</reason><|im_end|>")
    return "".join(parts) + "<answer>\\boxed{1}</answer>" * answers


def group(rewards, **kw) -> list[Trajectory]:
    return [traj(i, r, **kw) for i, r in enumerate(rewards)]


# ---------------------------------------------------------------- penalties


def test_error_penalty_is_error_fraction_and_half_without_calls():
    assert error_penalty(traj(0, 1, calls=4, errors=1)) == 0.25
    assert error_penalty(traj(0, 1, calls=0, errors=0)) == 0.5


@pytest.mark.parametrize("text,turns,expected", [
    ("no answer at all", 3, 1.0),
    (CLEAN, 2, 0.0),
    ("<answer>1</answer> then <answer>2</answer>", 2, 0.5),
    ("<answer>1</answer><answer>2</answer><answer>3</answer>", 1, 1.0),   # capped at 1
    ("<answer>1 <answer>2</answer>", 2, 1.0),                           # malformed: open != pairs
    ("<answer>1</answer>", 0, 1.0),                                      # no turns counted
])
def test_format_penalty(text, turns, expected):
    assert format_penalty(traj(0, 1, text=text, turns=turns)) == pytest.approx(expected)


# ---------------------------------------------------------------- paper mode


def test_paper_keeps_g_with_class_proportions():
    g = group([1, 0] * 3 + [1] * 4 + [0, 1] * 3)     # 10 positives, 6 negatives, 2G = 16
    res = downsample_groups([g], 8, "paper", np.random.default_rng(0))
    (kept,) = res.groups
    assert len(kept) == 8
    assert sum(t.reward == 0 for t in kept) == 3  # floor(6·8/16)
    assert sum(t.reward == 1 for t in kept) == 5
    assert [t.sample_index for t in kept] == sorted(t.sample_index for t in kept)


@pytest.mark.parametrize("mode", ["paper", "release"])
@pytest.mark.parametrize("positives,negatives,kept_pos,kept_neg", [
    (31, 1, 15, 1),      # the lone negative stays (flooring 1*16/32 to 0 would drop the group)
    (30, 2, 14, 2),      # at least two negatives where there are two (2*16/32 floors to 1)
    (1, 31, 1, 15),      # the lone positive stays
    (16, 16, 8, 8),
])
def test_both_modes_keep_at_least_two_of_each_class(mode, positives, negatives, kept_pos, kept_neg):
    g = group([1] * positives + [0] * negatives)
    res = downsample_groups([g], 16, mode, np.random.default_rng(0))
    (kept,) = res.groups
    assert (sum(t.reward == 1 for t in kept), sum(t.reward == 0 for t in kept)) == (kept_pos, kept_neg)
    assert not res.dropped


def test_paper_fewer_than_2g_keeps_about_half():
    g = group([1, 0, 1, 0, 1, 1])                 # n = 6 < 2G = 8: keep ceil(6/2) = 3
    (kept,) = downsample_groups([g], 4, "paper", np.random.default_rng(0)).groups
    assert len(kept) == 3 and sum(t.reward == 0 for t in kept) == 1


def test_paper_single_positive_survives():
    g = group([0] * 7 + [1])
    (kept,) = downsample_groups([g], 4, "paper", np.random.default_rng(3)).groups
    assert len(kept) == 4 and sum(t.reward for t in kept) == 1


def test_all_correct_and_all_wrong_groups_are_dropped():
    res = downsample_groups([group([1] * 8), group([0] * 8)], 4, "paper", np.random.default_rng(0))
    assert res.groups == [] and res.dropped["equal_reward"] == 2
    assert res.metrics["roc/groups_dropped"] == 2


def test_all_correct_without_filter_keeps_g_positives():
    res = downsample_groups([group([1] * 8)], 4, "paper", np.random.default_rng(0), reject_equal_reward=False)
    assert len(res.groups[0]) == 4


def test_no_tool_calls_still_selects():
    g = group([1, 0, 1, 0, 1, 0, 1, 0], calls=0, errors=0)
    (kept,) = downsample_groups([g], 4, "paper", np.random.default_rng(0)).groups
    assert len(kept) == 4 and penalties(kept[0]) == pytest.approx(0.5)


def test_paper_is_deterministic_for_a_seed():
    g = [traj(i, float(i % 3 != 0), calls=4, errors=i % 4) for i in range(16)]
    picks = [[t.sample_index for t in downsample_groups([g], 8, "paper", np.random.default_rng(7)).groups[0]]
             for _ in range(2)]
    assert picks[0] == picks[1]


def test_paper_prefers_low_penalty_positives():
    # positives 0-3 clean except one tool error in four calls (p = 0.25); 4-7 every call failed (p = 1.0)
    g = [traj(i, 1.0, calls=4, errors=1 if i < 4 else 4) for i in range(8)] + [traj(8 + i, 0.0) for i in range(8)]
    kept_clean = kept_dirty = 0
    for seed in range(300):
        (kept,) = downsample_groups([g], 8, "paper", np.random.default_rng(seed)).groups
        kept_clean += sum(t.sample_index < 4 for t in kept)
        kept_dirty += sum(4 <= t.sample_index < 8 for t in kept)
    # 4 positive slots out of 8 positives; weights ~4:1 keep clean ones ~3x as often
    assert kept_clean > 1.5 * kept_dirty


# ---------------------------------------------------------------- release mode


def test_release_sorts_positives_by_its_text_penalty_and_takes_negatives_in_order():
    rewards = [1 if i % 3 == 0 else 0 for i in range(32)]         # 11 positives, 21 negatives
    # the release reads penalties off the text: i % 4 of four tool responses contain "error";
    # the counters say the opposite, so a sort by them would pick other positives
    g = [traj(i, r, calls=4, errors=4 - i % 4,
              text=release_text(["NameError: x"] * (i % 4) + ["42"] * (4 - i % 4))) for i, r in enumerate(rewards)]
    (kept,) = downsample_groups([g], 16, "release").groups
    pos = [t for t in kept if t.reward == 1]
    neg = [t for t in kept if t.reward == 0]
    assert len(pos) == round(11 * 16 / 32) and len(neg) == 16 - len(pos)
    all_pos = sorted((t for t in g if t.reward == 1), key=lambda t: penalties(t, "release"))
    assert {t.sample_index for t in pos} == {t.sample_index for t in all_pos[:len(pos)]}
    kept_errors = sorted(t.sample_index % 4 for t in pos)      # 0 errors x3, 1 x2, then one with 2
    assert kept_errors == [0, 0, 0, 1, 1, 2]
    assert [t.sample_index for t in neg] == [t.sample_index for t in g if t.reward == 0][:len(neg)]


def test_release_penalty_arithmetic_is_the_releases():
    # p_err: blocks whose text contains "error" in any case; "Tool call failure" alone is not one
    assert release_error_penalty(release_text(["Traceback ... ZeroDivisionError", "42"])) == 0.5
    assert release_error_penalty(release_text(["Tool call failure\nreason: timeout", "ok"])) == 0.0
    assert release_error_penalty(release_text([])) == 0.5
    # turns: <|im_start|>assistant ... <|im_end|> spans, which misses the first turn
    two_turns = release_text(["42"], answers=2)
    assert release_turn_count(two_turns) == 1
    assert release_format_penalty(two_turns) == 1.0                 # (2 - 1) / 1
    assert format_penalty(traj(0, 1, text=two_turns, turns=2)) == 0.5  # paper: (2 - 1) / 2 turns
    assert release_format_penalty(release_text([])) == 1.0          # no counted turn at all


def test_release_keeps_minimum_two_of_each_class():
    g = group([1] * 30 + [0] * 2)                 # round(2·16/32) = 1 negative: raised to 2
    (kept,) = downsample_groups([g], 16, "release").groups
    assert sum(t.reward == 0 for t in kept) == 2 and len(kept) == 16
    g = group([0] * 31 + [1])                     # one positive: keep it (min(2, 1))
    (kept,) = downsample_groups([g], 16, "release").groups
    assert sum(t.reward == 1 for t in kept) == 1 and len(kept) == 16


def test_release_drops_short_groups_and_keeps_exact_ones():
    res = downsample_groups([group([1, 0, 1])], 4, "release")
    assert res.groups == [] and res.dropped["too_few_samples"] == 1
    res = downsample_groups([group([1, 0, 1, 0])], 4, "release")
    assert len(res.groups[0]) == 4


# ---------------------------------------------------------------- trainer entry point and metrics


def test_plain_grpo_takes_first_g_then_filters():
    ts = [traj(i, r, pid="a") for i, r in enumerate([1, 0, 1, 1, 0])] + [traj(i, 1, pid="b") for i in range(5)]
    res = select_for_training(ts, RocConfig(enabled=False), group_size=3, rng=np.random.default_rng(0))
    assert [[t.sample_index for t in g] for g in res.groups] == [[0, 1, 2]]
    assert res.dropped["equal_reward"] == 1


def test_metrics_report_tool_errors_before_and_after():
    ts = [traj(i, float(i < 4), calls=2, errors=2 if i in (0, 1) else 0, pid="a") for i in range(8)]
    res = select_for_training(ts, RocConfig(), group_size=4, rng=np.random.default_rng(0))
    m = res.metrics
    assert m["roc_before/tool_error_ratio"] == pytest.approx(4 / 16)
    assert m["roc_before/tool_error_ratio_positive"] == pytest.approx(4 / 8)
    assert m["roc_after/trajectories"] == 4
    # two clean positives get weight ~1/(0+eps) vs ~1/(1+eps): the erroring ones are (almost) never kept
    assert m["roc_after/tool_error_ratio_positive"] < m["roc_before/tool_error_ratio_positive"]
    assert m["roc/groups_kept"] == 1


def test_infrastructure_failures_leave_the_group_and_are_counted():
    ts = [traj(i, float(i % 2), pid="a") for i in range(8)]
    ts[0] = traj(0, 0.0, pid="a", infra="sandbox_internal_error")
    ts[1] = traj(1, 1.0, pid="a", infra="engine_error")
    ts[3] = traj(3, 1.0, pid="a", infra="engine_error")
    res = select_for_training(ts, RocConfig(), group_size=4, rng=np.random.default_rng(0))
    assert res.metrics["roc/infra_excluded"] == 3
    assert res.metrics["roc/infra_excluded_engine_error"] == 2
    assert res.metrics["roc/infra_excluded_sandbox_internal_error"] == 1
    assert res.metrics["roc_before/trajectories"] == 5          # before selection, after the exclusion
    assert all(not t.infra_error for t in res.trajectories)
    # a group that only had its positives hurt by the infrastructure has no signal left
    ts = [traj(i, 0.0, pid="b") for i in range(6)] + [traj(6 + i, 1.0, pid="b", infra="engine_error") for i in range(2)]
    res = select_for_training(ts, RocConfig(), group_size=4, rng=np.random.default_rng(0))
    assert res.groups == [] and res.dropped["equal_reward"] == 1


def test_infrastructure_failed_calls_do_not_count_in_p_err():
    t = traj(0, 1.0, calls=4, errors=1)
    t.num_infra_tool_calls = 1      # one call lost to the sandbox: 1 model error in 3 calls
    assert error_penalty(t) == pytest.approx(1 / 3)
    t = traj(0, 1.0, calls=2, errors=0)
    t.num_infra_tool_calls = 2      # no call the model is accountable for
    assert error_penalty(t) == 0.5


def test_a_problem_drawn_twice_is_two_groups():
    ts = ([traj(i, float(i % 2), pid="dup", group=0) for i in range(4)]
          + [traj(i, float(i < 2), pid="other", group=1) for i in range(4)]
          + [traj(i, float(i == 0), pid="dup", group=2) for i in range(4)])
    res = select_for_training(ts, RocConfig(), group_size=2, rng=np.random.default_rng(0))
    assert [(g[0].prompt_id, g[0].group_index, len(g)) for g in res.groups] == [("dup", 0, 2), ("other", 1, 2),
                                                                                   ("dup", 2, 2)]


def test_bad_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="roc mode"):
        downsample_groups([group([1, 0])], 1, "fancy")
