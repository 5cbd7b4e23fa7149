"""A NaN or inf loss or gradient skips the optimizer step, leaving weights, AdamW moments and the LR
schedule as they were; `train.max_nonfinite_steps` in a row checkpoint and abort the run."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from rl_synthetic import alternating, make_trajectories, write_times_seven

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.rl.update.loss import group_advantages
from rstar2_cli.rl.update.policy import PolicyTrainer


def _policy(model_dir) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=str(model_dir), gradient_checkpointing=False),
                         OptimConfig(lr=1e-3, warmup_steps=3), LossConfig(), micro_batch_tokens=80)


def _state(policy):
    return ({k: v.clone() for k, v in policy.full_state_dict()}, copy.deepcopy(policy.optimizer.state_dict()),
            policy.scheduler.last_epoch)


def _assert_same(a, b):
    (wa, oa, la), (wb, ob, lb) = a, b
    assert la == lb
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert oa["state"].keys() == ob["state"].keys()
    for key, moments in oa["state"].items():
        for m, value in moments.items():
            assert torch.equal(value, ob["state"][key][m]), (key, m)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_step_changes_nothing_and_says_so(tiny_model_dir, bad):
    policy = _policy(tiny_model_dir)
    batch = make_trajectories(8, seed=1)
    adv = group_advantages([t.reward for t in batch[:4]]) + group_advantages([t.reward for t in batch[4:]])
    first = policy.update(batch, adv)                     # a real step: AdamW moments exist
    assert first["optimizer_steps"] == 1 and first["nonfinite_skipped"] == 0
    before = _state(policy)
    out = policy.update(batch, [bad] * len(batch))
    assert out["optimizer_steps"] == 0 and out["nonfinite_skipped"] == 1
    assert not (torch.isfinite(torch.tensor(out["loss"])) and torch.isfinite(torch.tensor(out["grad_norm"])))
    _assert_same(before, _state(policy))
    assert all(p.grad is None for p in policy.model.parameters())    # nothing left for the next step
    again = policy.update(batch, adv)                     # the next finite step trains as usual
    assert again["optimizer_steps"] == 1
    assert policy.scheduler.last_epoch == before[2] + 1


@pytest.mark.slow
@pytest.mark.vllm
def test_the_run_skips_counts_and_aborts_after_max_in_a_row(tiny_model, tmp_path):
    """Steps 1, 3 and 4 get NaN advantages (`FaultPlan.nonfinite_steps`): step 2 ends the
    first streak, and 3, 4 make two in a row = train.max_nonfinite_steps, so the run checkpoints
    step 4 and aborts; skipped steps leave the checkpointed weights and optimizer as they were."""
    from rl_synthetic import saved_optimizer_state, saved_weights, tiny_rl_recipe

    from rstar2_cli.config import load_recipe_dict
    from rstar2_cli.rl.update.checkpoint import read_trainer_state
    from rstar2_cli.rl.run.faults import RunAborted
    from rstar2_cli.rl.run.launch_entry import train

    data = write_times_seven(tmp_path / "train.jsonl", 5)
    out = tmp_path / "run"
    raw = tiny_rl_recipe(tiny_model, data, out, steps=6)
    raw["train"]["max_nonfinite_steps"] = 2
    with pytest.raises(RunAborted, match=r"step 4: 2 steps in a row .*train.max_nonfinite_steps=2.*step_000004"):
        train(load_recipe_dict(raw), progress=False, collaborators=alternating(nonfinite_steps=frozenset({1, 3, 4})))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/nonfinite_skipped"] for r in rows] == [1.0, 0.0, 1.0, 1.0]
    assert [r["train/optimizer_steps"] for r in rows] == [0.0, 1.0, 0.0, 0.0]
    assert [r["faults/nonfinite_steps"] for r in rows] == [1.0, 1.0, 2.0, 3.0]
    assert rows[0]["train/loss"] is None                   # NaN is logged as null

    def weights(step):
        return saved_weights(out / f"step_{step:06d}")

    def moments(step):
        return saved_optimizer_state(out / f"step_{step:06d}", tmp_path / f"optim{step}.pt")["state"]

    w2, w3, w4 = weights(2), weights(3), weights(4)
    assert all(torch.equal(w2[k], w3[k]) and torch.equal(w3[k], w4[k]) for k in w2)
    assert any(not torch.equal(w2[k], weights(1)[k]) for k in w2)          # step 2 trained
    m2, m4 = moments(2), moments(4)
    assert m2 and all(torch.equal(m2[k][m], m4[k][m]) for k in m2 for m in ("exp_avg", "exp_avg_sq", "step"))
    state = read_trainer_state(out / "step_000004")
    assert state["extra"]["nonfinite"] == {"total": 3, "streak": 2}
    assert state["scheduler"]["last_epoch"] == 1           # one LR step: step 2's
