"""Partial rollouts: a turn stopped by a weight update keeps its tokens with the versions that
sampled them, staleness counts from the oldest token, the loss corrects each token by its own
behaviour log-prob, and a checkpoint keeps the per-token versions."""
from __future__ import annotations

import asyncio
import io
import math
from types import SimpleNamespace

import pytest
import torch
from rl_synthetic import build_tiny_model

from rstar2_cli.config import ConfigError, LossConfig, ModelConfig, OptimConfig, RolloutConfig, load_recipe_dict
from rstar2_cli.rl.run.async_rollouts import (drop_stale_groups, finish_partial, partial_counts, pending_from_state,
                                          pending_to_state)
from rstar2_cli.rl.update.policy import PolicyTrainer, loss_positions
from rstar2_cli.rollout.agent_loop import record_versions, run_agent_loop
from rstar2_cli.rollout.engines import GenResult, version_spans
from rstar2_cli.rollout.trajectory import RocDecision, Trajectory, TurnRecord


def _recipe(**train):
    return {"model": {"path": "m"}, "data": {"train": "t.jsonl"}, "loss": {"tis": True}, "train": train}


def test_partial_rollout_needs_staleness_and_says_so_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_recipe_dict(_recipe(partial_rollout=True))
    assert "\n" not in str(e.value) and "train.partial_rollout: true needs train.max_staleness >= 1" in str(e.value)
    assert load_recipe_dict(_recipe(partial_rollout=True, max_staleness=1)).train.partial_rollout
    assert not load_recipe_dict(_recipe(max_staleness=1)).train.partial_rollout     # off by default


def _span(version, start, end):
    return SimpleNamespace(version=version, start=start, end=end)


def test_vllm_weight_version_spans_become_version_runs():
    # vLLM labels tokens "default" until the first update_weight_version: the request's own version
    assert version_spans([_span("default", 0, 3), _span("4", 3, 7)], version=3) == [(0, 3), (3, 4)]
    assert version_spans([_span("2", 0, 0), _span("3", 0, 5)], version=2) == [(0, 3)]   # empty span skipped
    assert version_spans(None, version=1) == []


def test_a_turn_continued_across_an_update_records_versions_and_its_recompute():
    t = Trajectory(prompt_id="p", prompt_ids=[1] * 10)
    first = GenResult([5] * 4, [-0.1] * 4, "stop", 5, policy_version=2, version_spans=[(0, 2)])
    record_versions(t, first, start=0, context_tokens=10)
    t.response_ids += first.token_ids + [9, 9]          # the turn, then two tool tokens
    t.loss_mask += [1] * 4 + [0, 0]
    second = GenResult([6] * 5, [-0.2] * 5, "stop", 6, policy_version=2, version_spans=[(0, 2), (3, 3)])
    record_versions(t, second, start=6, context_tokens=16)
    t.response_ids += second.token_ids
    t.loss_mask += [1] * 5
    assert t.policy_versions == [2, 2] and t.version_spans == [[0, 2], [9, 3]]
    assert t.token_versions() == [2] * 9 + [3] * 2
    assert t.tokens_per_version() == {2: 7, 3: 2}
    assert t.continued_turns == 1 and t.recompute_tokens == 16 + 3   # context + 3 tokens sampled before
    assert t.policy_version == 2


def test_a_group_whose_oldest_loss_token_is_too_old_is_dropped_and_counted():
    fresh = Trajectory(prompt_id="a", group_index=0, policy_versions=[3], version_spans=[[0, 3]],
                       response_ids=[1, 2], loss_mask=[1, 1])
    # its turn started on version 1 and continued on 3: the oldest token is 2 behind step 3
    spanning = Trajectory(prompt_id="b", group_index=1, policy_versions=[1], version_spans=[[0, 1], [1, 3]],
                          response_ids=[1, 2, 3], loss_mask=[1, 1, 1], continued_turns=1, recompute_tokens=7)
    sibling = Trajectory(prompt_id="b", sample_index=1, group_index=1, policy_versions=[3], version_spans=[[0, 3]],
                         response_ids=[4], loss_mask=[1])
    report = drop_stale_groups([fresh, spanning, sibling], step=3, max_staleness=1)
    assert report.kept == [fresh] and report.dropped_groups == 1 and report.dropped_trajectories == 2
    assert report.mixed_versions == 1
    m = finish_partial(partial_counts(report.kept, 3), report)
    assert m["async/dropped_groups_frac"] == 0.5 and m["async/tokens_staleness_0"] == 2.0
    assert m["async/tokens_staleness_1"] == 0.0 and m["async/continued_turns"] == 0.0
    kept = drop_stale_groups([fresh, spanning, sibling], step=3, max_staleness=2)
    m = finish_partial(partial_counts(kept.kept, 3), kept)
    assert m["async/tokens_staleness_2"] == 1.0 and m["async/tokens_staleness_0"] == 5.0
    assert m["async/continued_turns"] == 1.0 and m["async/recompute_tokens"] == 7.0


class SpanningEngine:
    """A generator whose every first turn is stopped by an update after 2 tokens: the rest comes
    from version 1. Records the request priorities."""

    def __init__(self):
        self.priorities = []

    async def generate(self, req, key=None):
        self.priorities.append(req.priority)
        return GenResult([7, 7, 7, 2], [-0.5, -0.5, -0.25, -0.25], "stop", 2, policy_version=0,
                         version_spans=[(0, 0), (2, 1)])


def test_the_agent_loop_keeps_each_tokens_version_and_sends_the_batch_priority():
    from rstar2_cli.models.tiny import build_tokenizer, default_corpus

    tok = build_tokenizer(default_corpus(0), 512)
    engine = SpanningEngine()
    cfg = RolloutConfig(max_turns=1, max_response_tokens=32, tools_in_prompt=False)
    trajs = asyncio.run(run_agent_loop([("p0", "1+1?", "2")], 2, engine, None, tok, cfg, progress=False,
                                       priority=5))
    assert engine.priorities == [5, 5]
    for t in trajs:
        assert t.version_spans == [[0, 0], [2, 1]] and t.policy_version == 0
        assert t.logprobs == [-0.5, -0.5, -0.25, -0.25] and t.continued_turns == 1
        assert t.recompute_tokens == len(t.prompt_ids) + 2


def test_checkpointed_pending_batches_keep_per_token_versions():
    t = Trajectory(prompt_id="p", policy_versions=[1], version_spans=[[0, 1], [4, 2]], continued_turns=1,
                   recompute_tokens=30, response_ids=[1] * 6, loss_mask=[1] * 6, logprobs=[-0.1] * 6)
    state = pending_to_state([(3, [7], ([0], [t], {"time/rollout": 1.0}))])
    (index, problems, piece), = pending_from_state(state)
    back = piece[1][0]
    assert (index, problems) == (3, [7])
    assert back.token_versions() == t.token_versions() == [1] * 4 + [2] * 2
    assert (back.continued_turns, back.recompute_tokens, back.policy_version) == (1, 30, 1)


def test_checkpointed_pending_batches_keep_the_stages_typed_notes():
    """What the agent loop and the selection note on a trajectory comes back typed from a checkpoint
    (the rollout log reads the turn records' spans, the step metrics the repeated calls)."""
    t = Trajectory(prompt_id="p", response_ids=[1] * 6, loss_mask=[1, 1, 0, 0, 1, 1], instance_key="p#0",
                   sampling_seed=11, rollout_node=1, tool_outcomes=["runtime_error"], num_repeated_code_calls=1,
                   turn_records=[TurnRecord("assistant", [0, 2], tool_code="boom()"),
                                 TurnRecord("tool", [2, 4], status="error"), TurnRecord("assistant", [4, 6])],
                   exclusion="sandbox_internal_error", roc_decision=RocDecision("excluded", None, "excluded: x"))
    buf = io.BytesIO()
    torch.save(pending_to_state([(3, [7], ([0], [t], {}))]), buf)
    buf.seek(0)
    (_, _, piece), = pending_from_state(torch.load(buf, weights_only=False))
    back = piece[1][0]
    assert back == t
    assert back.turn_records[1].status == "error" and back.roc_decision.as_class is None


def test_truncated_is_weights_each_token_by_its_own_behaviour_logprob():
    """One trajectory whose first 3 loss tokens came from version 0 and the rest from version 1:
    min(pi_prox / mu_token, cap) per token, by hand."""
    torch.manual_seed(0)
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                           OptimConfig(lr=1e-3, warmup_steps=0), LossConfig(tis=True, tis_cap=2.0),
                           micro_batch_tokens=256, model=build_tiny_model(), max_staleness=1)
    t = Trajectory(prompt_id="p", prompt_ids=[3, 4, 5], response_ids=[10, 11, 12, 13, 14, 15, 16],
                   loss_mask=[1, 1, 1, 0, 1, 1, 1], policy_versions=[0], version_spans=[[0, 0], [4, 1]],
                   reward=1.0)
    prox = policy.compute_logprobs([t])[0].tolist()          # the proximal policy: this step's weights
    # behaviour log-probs: version 0's tokens 0.3 below the proximal ones, version 1's 0.1 above,
    # the last one 1.0 below (its weight e^1 > 2 is truncated at the cap)
    shift = [-0.3, -0.3, -0.3, 0.1, 0.1, -1.0]
    behaviour = [p + d for p, d in zip(prox, shift)]
    t.logprobs = behaviour[:3] + [0.0] + behaviour[3:]
    tensors = policy._token_tensors(t, 1.0, torch.tensor(prox))
    assert loss_positions(t).tolist() == [True, True, True, False, True, True, True]
    weights = policy._tis(tensors.old, tensors.rollout).tolist()
    hand = [math.exp(0.3)] * 3 + [math.exp(-0.1)] * 2 + [2.0]
    assert weights == pytest.approx(hand, rel=1e-5)
    stats = policy.update([t], [1.0])
    assert stats["tis_weight_mean"] == pytest.approx(sum(hand) / 6, rel=1e-4)
    assert stats["tis_capped_frac"] == pytest.approx(1 / 6)
    # the ratio against the proximal policy is 1 at the first step: loss = -A * mean(weight)
    assert stats["loss"] == pytest.approx(-sum(hand) / 6, rel=1e-3)
