"""`RLTrainer.train_step` itself, on CPU and without engines: the rollout service is replaced by a
recorder that hands back synthetic graded trajectories, and everything else in the step (the
rollout pipeline, RoC, advantages, the policy update, the weight push, the metrics row) is the
trainer's own code. The engines and the sandbox are covered by test_rl_trainer_e2e.py."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json

import pytest
import torch
from rl_synthetic import build_tiny_model, make_trajectories, tiny_rl_recipe

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig, load_recipe_dict
from rstar2_cli.rl.metrics import read_metrics
from rstar2_cli.rl.policy import PolicyTrainer
from rstar2_cli.rl.rollout_source import SyncRollouts
from rstar2_cli.rl.sampler import DataSampler
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache


class RecordingRollouts:
    """The public surface of `RolloutService`, recording each call. Every trajectory is stamped
    with the version the "engines" hold when its batch starts (pushes and skipped steps add one,
    as on the real engines); `grade(i)` is the reward of the i-th trajectory of a batch."""

    grade = staticmethod(lambda i: float(i % 2))

    def __init__(self, cfg, problems, tokenizer, host, info, *, model, weights, version, progress,
                 release=release_trainer_cache):
        self.cfg, self.problems, self.version, self.host, self.info = cfg, problems, version, host, info
        self.calls: list[tuple] = []
        self.engines, self.tools, self.host_ranks = [], None, [0]
        RecordingRollouts.last = self

    def roll_out(self, index, problem_indices):
        n = self.cfg.rollouts_per_prompt
        trajs = make_trajectories(n * len(problem_indices), seed=index)
        for i, t in enumerate(trajs):
            p = self.problems[problem_indices[i // n]]
            t.prompt_id, t.sample_index, t.group_index = p.id, i % n, i // n
            t.reward, t.policy_versions = self.grade(i), [self.version]
        self.calls.append(("start", index, list(problem_indices)))
        return list(range(len(problem_indices))), trajs, {"time/rollout": 0.5, "time/reward": 0.25}

    def start(self, index, problem_indices):
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self.roll_out(index, problem_indices))
        return future

    def settle(self, result):
        return result()

    def gather_from_hosts(self, mine):
        return [mine]

    def busy_seconds(self):
        return [0.0]

    def sleep(self):
        self.calls.append(("sleep",))

    engine_restarts = 0

    def weights_changing(self):
        return contextlib.nullcontext()


    def push_weights(self, policy):
        self.calls.append(("push", {k: v.clone() for k, v in policy.full_state_dict()}))
        self.version += 1

    def keep_weights(self):
        self.calls.append(("keep",))
        self.version += 1

    def close(self):
        self.calls.append(("close",))


@pytest.fixture
def make_trainer(tiny_model, tmp_path, monkeypatch):
    import rstar2_cli.rl.rollout_service as rollout_service
    from rstar2_cli.rl.trainer import RLTrainer

    monkeypatch.setattr(rollout_service, "RolloutService", RecordingRollouts)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(7)))

    def make(**train):
        raw = tiny_rl_recipe(tiny_model, data, tmp_path / "run", steps=3)
        raw["train"].update(train)
        raw["roc"]["reject_equal_reward"] = True
        if train.get("max_staleness"):
            raw["loss"] = {"tis": True, "tis_cap": 2.0}
        seen: list[tuple[int, dict]] = []
        trainer = RLTrainer(load_recipe_dict(raw), progress=False, on_step=lambda s, m: seen.append((s, m)))
        return trainer, RecordingRollouts.last, seen

    return make


def test_the_recorder_is_built_as_the_rollout_service_is():
    from api_contracts import assert_same_signature

    from rstar2_cli.rl.rollout_service import RolloutService

    assert_same_signature(RecordingRollouts.__init__, RolloutService.__init__)


def test_a_step_draws_rolls_out_selects_updates_pushes_and_logs_in_that_order(make_trainer, tmp_path):
    trainer, rollouts, seen = make_trainer()
    rollouts.start = lambda *args: pytest.fail("k = 0 started a rollout future")   # a direct call only
    before = {k: v.clone() for k, v in trainer.policy.full_state_dict()}
    m = trainer.train_step()
    # 1-3: exactly the sampler's first batch, rolled out by the step itself (k = 0: nothing ahead)
    order = DataSampler(7, 2, seed=3)
    assert rollouts.calls[0] == ("start", 0, order.next_batch())
    assert trainer.sampler.state_dict() == order.state_dict() and isinstance(trainer.source, SyncRollouts)
    # 4-7: RoC keeps G = 2 of each group of 4, then sleep -> update -> push (which wakes the engines)
    assert [c[0] for c in rollouts.calls] == ["start", "sleep", "push"]
    pushed = rollouts.calls[2][1]
    after = dict(trainer.policy.full_state_dict())
    assert all(torch.equal(pushed[k], v) for k, v in after.items())        # the updated weights went out
    assert any(not torch.equal(before[k], v) for k, v in after.items())
    assert m["roc/groups_kept"] == 2 and m["rollout/trajectories"] == 8 and m["train/optimizer_steps"] == 1
    assert m["train/skipped_empty"] == 0.0 and trainer.policy.scheduler.last_epoch == 1
    assert m["faults/engine_restarts"] == 0.0                              # the rollout side's count
    # 8: one row, the step's phases timed under the usual keys, no async/ column at k = 0
    assert (m["time/rollout"], m["time/reward"], m["time/tools"]) == (0.5, 0.25, 0.0)
    assert {"time/train", "time/sync", "time/step"} <= set(m) and m["time/step"] >= m["time/train"] + m["time/sync"]
    assert not any(k.startswith("async/") for k in m)
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row == {**m, "step": 1} and seen == [(1, m)] and trainer.step == 1
    trainer.close()
    assert rollouts.calls[-1] == ("close",)


def test_a_step_with_nothing_to_learn_moves_no_weights_and_keeps_the_version(make_trainer):
    trainer, rollouts, _ = make_trainer()
    rollouts.grade = lambda i: 1.0                     # equal rewards: every group filtered out
    before = {k: v.clone() for k, v in trainer.policy.full_state_dict()}
    m = trainer.train_step()
    assert [c[0] for c in rollouts.calls] == ["start", "keep"] and rollouts.version == 1
    assert m["train/skipped_empty"] == 1.0 and m["roc/groups_kept"] == 0 and "train/loss" not in m
    assert trainer.policy.scheduler.last_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.full_state_dict())
    rollouts.grade = staticmethod(lambda i: float(i % 2))
    order = DataSampler(7, 2, seed=3)
    order.next_batch()
    m = trainer.train_step()                           # the next batch in the data order, not stale
    assert rollouts.calls[2] == ("start", 1, order.next_batch()) and m["train/skipped_empty"] == 0.0


def test_an_asynchronous_step_starts_the_next_batch_right_after_its_update(make_trainer):
    trainer, rollouts, _ = make_trainer(max_staleness=1)
    m = trainer.train_step()
    names = [c[:2] if c[0] == "start" else c[:1] for c in rollouts.calls]
    # batches 0 and 1 start at version 0; batch 2 as soon as version 1 is pushed, before the log
    assert names == [("start", 0), ("start", 1), ("sleep",), ("push",), ("start", 2)]
    assert m["async/staleness_0"] == 8 and m["async/dropped_groups"] == 0
    m2 = trainer.train_step()            # batch 1 was sampled by version 0, trained at step 1
    assert m2["async/staleness_1"] == 8 and m2["async/staleness_max"] == 1


def test_an_engine_lost_at_the_push_checkpoints_the_trained_step(make_trainer, tmp_path):
    """The update ran before the push found the engines gone: the abort's checkpoint holds the
    updated weights under the step that made them, so a resume neither trains that batch twice
    nor labels new weights with the old step."""
    from rstar2_cli.rl import checkpoint
    from rstar2_cli.rl.trainer import RunAborted
    from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

    trainer, rollouts, _ = make_trainer()

    def dead_push(policy):
        raise EngineRestartsExhausted("replica 0 died 4 times (engine.max_restarts=3)")

    rollouts.push_weights = dead_push
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
