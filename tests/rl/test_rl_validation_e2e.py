"""A tiny `rstar2 rl` run with validation every step and one step that has nothing to learn:
the held-out points reach metrics.jsonl and curves.png, and the empty step moves neither the
weights nor the LR schedule."""
from __future__ import annotations

import json

import pytest

from rl_synthetic import alternating_grades, tiny_rl_recipe
from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.run.rollout_side import Collaborators

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_validation_points_and_an_empty_step_in_a_tiny_run(tiny_model, tmp_path, monkeypatch):
    import torch

    import rstar2_cli.reward as reward
    from rstar2_cli.reward import GradeResult
    from rstar2_cli.rl.run.trainer import RLTrainer

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(4)))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                               for i in range(2)))
    calls = {"n": 0}

    def training_grades(trajs, reward_cfg):   # batch 1: all wrong (every group filtered); later: alternate
        calls["n"] += 1
        alternating_grades(trajs, reward_cfg)
        for t in trajs if calls["n"] == 1 else ():
            t.reward, t.grade_reason = 0.0, "wrong"

    # the held-out sets are graded by eval's grader (eval/family.py): every other sample correct
    monkeypatch.setattr(reward, "grade_batch", lambda pairs, **kw: [
        GradeResult.of("correct" if i % 2 == 0 else "wrong", "x") for i in range(len(pairs))])
    raw = tiny_rl_recipe(tiny_model, data, tmp_path / "run", steps=2)
    raw["roc"]["reject_equal_reward"] = True
    raw["train"].update(eval_every=1, eval_sets=[str(heldout)], eval_samples=2, save_every=10)
    cfg = load_recipe_dict(raw)
    trainer = RLTrainer(cfg, progress=False, collaborators=Collaborators(grade=training_grades))
    seen = []

    def on_step(step, metrics):
        params = [p.detach().clone() for p in trainer.policy.model.parameters()]
        seen.append((step, metrics, trainer.policy.scheduler.last_epoch, params))

    trainer.on_step = on_step
    start = [p.detach().clone() for p in trainer.policy.model.parameters()]
    trainer.train()

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1.0, 2.0]            # eval_before_train, then every step
    for r in rows:
        assert r["eval/heldout/samples_per_problem"] == 2 and r["eval/heldout/problems"] == 2
        assert r["eval/heldout/accuracy"] == pytest.approx(0.5) and r["eval/accuracy"] == r["eval/heldout/accuracy"]
        assert r["eval/heldout/response_tokens_mean"] > 0
    assert (tmp_path / "run" / "eval" / "step_000000" / "heldout" / "results.json").is_file()
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    # step 1: every group had equal rewards -> skipped: no optimizer step, no LR step
    (s1, m1, lr_epoch_1, p1), (s2, m2, lr_epoch_2, p2) = seen
    assert m1["train/skipped_empty"] == 1.0 and m1["roc/groups_kept"] == 0 and "train/loss" not in m1
    assert lr_epoch_1 == 0 and all(torch.equal(a, b) for a, b in zip(start, p1))
    assert m2["train/skipped_empty"] == 0.0 and lr_epoch_2 == 1
    assert any(not torch.equal(a, b) for a, b in zip(p1, p2))
