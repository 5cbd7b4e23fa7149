"""`RLTrainer.train_step` itself, on CPU: the trainer with its real rollout side (fleet, scheduler,
agent loop, weight pusher, sandbox client) over engines that answer at once (`fake_replica.py`),
and a grader the test sets (`Collaborators(grade=...)`): the order of the step's phases, what a
step with nothing to learn does, that the synchronous step starts no thread, the asynchronous
step's order, and an engine lost at the push. The real engines and sandbox are covered by
test_rl_trainer_e2e.py."""
from __future__ import annotations

import json
import threading

import pytest
import torch
from fake_replica import FakeReplica
from rl_synthetic import build_tiny_model, make_trajectories, tiny_rl_recipe

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig, load_recipe_dict
from rstar2_cli.rl.logs.writer import read_metrics
from rstar2_cli.rl.update.policy import PolicyTrainer
from rstar2_cli.rl.run.rollout_side import Collaborators
from rstar2_cli.rl.run.sampler import DataSampler


class Recorder:
    """The step's events in order: the engines' (start, sleep, wake, weight loads), the grader's
    (which prompts it graded) and the release; `reward(i)` is the i-th trajectory's of a batch."""

    def __init__(self):
        self.events: list[tuple] = []
        self.reward = lambda i: float(i % 2)
        self.threads: list[set[str]] = []     # the live threads' names, each time the grader ran

    def grade(self, trajs, reward):
        self.threads.append({t.name for t in threading.enumerate()})
        self.events.append(("grade", [t.prompt_id for t in trajs]))
        for i, t in enumerate(trajs):
            t.reward, t.extracted, t.grade_reason = self.reward(i), "x", "correct" if self.reward(i) else "wrong"

    def collaborators(self, *, colocated: bool) -> Collaborators:
        return Collaborators(make_engine=FakeReplica.from_config, grade=self.grade,
                             release=lambda: self.events.append(("release",)),
                             engines_sleep=lambda cfg, device: colocated)

    def names(self) -> list[str]:
        return [e[0] if e[0] != "wake_up" else f"wake_{e[1]}" for e in self.events]


@pytest.fixture
def make_trainer(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from rstar2_cli.rl.run.trainer import RLTrainer

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(7)))
    recorder = Recorder()
    monkeypatch.setattr(FakeReplica, "log", recorder.events)
    monkeypatch.setattr(FakeReplica, "tokenizer", AutoTokenizer.from_pretrained(tiny_model))

    def make(colocated: bool = True, **train):
        raw = tiny_rl_recipe(tiny_model, data, tmp_path / "run", steps=3)
        raw["train"].update(train)
        raw["roc"]["reject_equal_reward"] = True
        raw["sandbox"] = {"url": "http://127.0.0.1:9"}      # a client only: the fake engines call no tool
        if train.get("max_staleness"):
            raw["loss"] = {"tis": True, "tis_cap": 2.0}
        seen: list[tuple[int, dict]] = []
        trainer = RLTrainer(load_recipe_dict(raw), progress=False, on_step=lambda s, m: seen.append((s, m)),
                              collaborators=recorder.collaborators(colocated=colocated))
        recorder.events.clear()
        return trainer, recorder, seen

    return make


def _ids(trainer, batch):
    return [trainer.problems[i].id for i in batch for _ in range(4)]    # oversample x G = 4 per prompt


def test_a_step_draws_rolls_out_grades_selects_updates_pushes_and_logs_in_that_order(make_trainer, tmp_path):
    trainer, recorder, seen = make_trainer()
    before = {k: v.clone() for k, v in trainer.policy.full_state_dict()}
    m = trainer.train_step()
    # 1-3: exactly the sampler's first batch, rolled out and graded by the step itself
    order = DataSampler(7, 2, seed=3)
    assert recorder.events[0] == ("grade", _ids(trainer, order.next_batch()))
    assert trainer.sampler.state_dict() == order.state_dict()
    # 4-8: RoC keeps G = 2 of each group of 4, then the update (the engines asleep), then the push:
    # the weights woken and loaded, then the KV cache
    cycle = ["sleep", "release", "wake_weights", "load_weights", "release", "wake_kv_cache"]
    assert recorder.names() == ["grade", *cycle]
    after = dict(trainer.policy.full_state_dict())
    (engine,) = trainer.side.fleet.engines
    assert engine.loaded and all(torch.equal(engine.loaded[k], after[k]) for k in engine.loaded)
    assert any(not torch.equal(before[k], v) for k, v in after.items())    # the updated weights went out
    assert engine.weights_version == 1 == trainer.side.fleet.version
    assert m["roc/groups_kept"] == 2 and m["rollout/trajectories"] == 8 and m["train/optimizer_steps"] == 1
    assert m["train/skipped_empty"] == 0.0 and trainer.policy.scheduler.last_epoch == 1
    assert m["faults/engine_restarts"] == 0.0
    # 9: one row, the step's phases timed under the usual keys, no async/ column
    assert {"time/rollout", "time/reward", "time/tools", "time/train", "time/sync", "time/step"} <= set(m)
    assert m["time/step"] >= m["time/rollout"] + m["time/train"] + m["time/sync"]
    assert not any(k.startswith("async/") for k in m)
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row == {**m, "step": 1} and seen == [(1, m)] and trainer.step == 1
    trainer.close()


def test_the_synchronous_step_starts_no_thread(make_trainer):
    """The roll-out runs on the trainer's own thread: no loop thread, no future, and no thread
    started during a step (the engines' own loop threads are vLLM's, started with them)."""
    trainer, recorder, _ = make_trainer(colocated=False)
    alive = {t.name for t in threading.enumerate()}
    ran_on: list[threading.Thread] = []
    generate = FakeReplica.generate

    async def recording(self, req):
        ran_on.append(threading.current_thread())
        return await generate(self, req)

    FakeReplica.generate = recording
    try:
        trainer.train_step()
        trainer.train_step()
    finally:
        FakeReplica.generate = generate
    assert ran_on and all(t is threading.main_thread() for t in ran_on)
    assert all(names <= alive for names in recorder.threads)
    assert {t.name for t in threading.enumerate()} <= alive and "rstar2-rollouts" not in alive
    trainer.close()


def test_a_step_with_nothing_to_learn_moves_no_weights_and_keeps_the_version(make_trainer):
    trainer, recorder, _ = make_trainer()
    recorder.reward = lambda i: 1.0                     # equal rewards: every group filtered out
    before = {k: v.clone() for k, v in trainer.policy.full_state_dict()}
    m = trainer.train_step()
    assert recorder.names() == ["grade"] and trainer.side.fleet.version == 1
    assert trainer.side.fleet.engines[0].weights_version == 1
    assert m["train/skipped_empty"] == 1.0 and m["roc/groups_kept"] == 0 and "train/loss" not in m
    assert trainer.policy.scheduler.last_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.full_state_dict())
    recorder.reward = lambda i: float(i % 2)
    order = DataSampler(7, 2, seed=3)
    order.next_batch()
    m = trainer.train_step()                           # the next batch in the data order, not stale
    assert recorder.events[1] == ("grade", _ids(trainer, order.next_batch())) and m["train/skipped_empty"] == 0.0
    trainer.close()


def test_an_asynchronous_step_starts_the_next_batch_right_after_its_update(make_trainer):
    trainer, recorder, _ = make_trainer(colocated=False, max_staleness=1)
    m = trainer.train_step()
    order = DataSampler(7, 2, seed=3)
    batches = [order.next_batch() for _ in range(3)]
    # batches 0 and 1 roll out at version 0; batch 2 as soon as version 1 is loaded, by version 1
    graded = [e for e in recorder.events if e[0] == "grade"]
    assert graded[:2] == [("grade", _ids(trainer, b)) for b in batches[:2]]
    assert recorder.names()[:3] == ["grade", "grade", "load_weights"]
    assert [b.index for b in trainer.source.pipeline.pending] == [1, 2]
    assert {v for t in trainer.source.pipeline.pending[1].wait().trajectories for v in t.policy_versions} == {1}
    assert m["async/staleness_0"] == 8 and m["async/dropped_groups"] == 0
    m2 = trainer.train_step()            # batch 1 was sampled by version 0, trained at step 1
    assert m2["async/staleness_1"] == 8 and m2["async/staleness_max"] == 1
    trainer.close()


def test_an_engine_lost_at_the_push_checkpoints_the_trained_step(make_trainer, tmp_path):
    """The update ran before the push found the engines gone: the abort's checkpoint holds the
    updated weights under the step that made them, so a resume neither trains that batch twice
    nor labels new weights with the old step."""
    from rstar2_cli.rl.update import checkpoint
    from rstar2_cli.rl.run.faults import RunAborted
    from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

    trainer, _, _ = make_trainer(colocated=False)

    def dead_push(policy):
        raise EngineRestartsExhausted("replica 0 died 4 times (engine.max_restarts=3)")

    trainer.side.fleet.pusher.push = dead_push
    with pytest.raises(RunAborted, match="holds step 1"):
        trainer.train()
    saved = checkpoint.latest_checkpoint(tmp_path / "run")
    assert saved is not None and saved.name == "step_000001"
    order = DataSampler(7, 2, seed=3)
    order.next_batch()                    # batch 0 trained: the resumed run draws batch 1 next
    assert trainer.sampler.state_dict() == order.state_dict()
    assert trainer.policy.scheduler.last_epoch == 1


def test_an_update_without_loss_tokens_takes_no_optimizer_or_lr_step():
    rollouts = make_trajectories(4, seed=1)
    for t in rollouts:
        t.loss_mask = [0] * len(t.response_ids)       # nothing the policy sampled
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                           OptimConfig(warmup_steps=5, lr=1e-3), LossConfig(), micro_batch_tokens=128,
                           model=build_tiny_model())
    before = {k: v.clone() for k, v in policy.full_state_dict()}
    stats = policy.update(rollouts, [1.0, -1.0, 1.0, -1.0])
    assert stats["optimizer_steps"] == 0 and policy.scheduler.last_epoch == 0
    assert all((v - before[k]).abs().max() == 0 for k, v in policy.full_state_dict())
