"""Asynchronous GRPO-RoC bookkeeping: which batches run ahead, the staleness bound at training,
what a checkpoint keeps of the rollouts in flight, and the config's guard rails."""
from __future__ import annotations

import concurrent.futures

import pytest

from rstar2_cli.config import ConfigError, load_recipe_dict
from rstar2_cli.rl.async_rollouts import (
    RolloutPipeline,
    drop_stale_groups,
    idle_metrics,
    pending_from_state,
    pending_to_state,
)
from rstar2_cli.rl.sampler import DataSampler
from rstar2_cli.rollout.trajectory import Trajectory


class FakeRollouts:
    """The rollout side as the pipeline sees it: batch b rolls out at once, as one trajectory
    sampled by version b (unless `versions` says otherwise), on one host."""

    def __init__(self, versions: dict[int, int] | None = None, done: bool = True):
        self.started: list[int] = []
        self.versions, self.done = versions or {}, done

    def start(self, index, problems):
        self.started.append(index)
        f: concurrent.futures.Future = concurrent.futures.Future()
        if self.done:
            traj = Trajectory(prompt_id=f"b{index}", policy_versions=[self.versions.get(index, index)],
                              num_tool_calls=2, num_infra_tool_calls=1)
            f.set_result(([0], [traj], {"time/rollout": 1.0, "time/reward": 0.5}))
        return f

    def exchange(self, n_batch, local):
        positions, trajs, timing = local()
        return trajs, {"rollout": timing["time/rollout"], "reward": timing["time/reward"], "tools": 0.0}, {}

    def busy_seconds(self):
        return [0.0]


def _pipeline(k: int, steps: int = 10, **fake):
    rollouts = FakeRollouts(**fake)
    return RolloutPipeline(k, steps, DataSampler(1000, 2, shuffle=False), rollouts), rollouts.started


@pytest.mark.parametrize("k", [1, 2])
def test_batch_b_starts_once_version_b_minus_k_is_out_and_steps_train_them_in_order(k):
    pipe, started = _pipeline(k, steps=6)
    pipe.fill(version=0)
    assert started == list(range(k + 1))          # version 0 may sample batches 0..k
    for step in range(6):
        pipe.fill(step)
        batch = pipe.take(step)
        assert batch.index == step and batch.wait()[1][0].prompt_id == f"b{step}"
        assert max(started) == min(step + k, 5)    # never more than k ahead, never past the last step
    assert started == list(range(6)) and not pipe.pending


def test_taking_a_batch_out_of_order_is_an_error():
    pipe, _ = _pipeline(1)
    pipe.fill(0)
    with pytest.raises(RuntimeError, match="expects batch 1"):
        pipe.take(1)


def _group(group: int, versions: list[list[int]]) -> list[Trajectory]:
    return [Trajectory(prompt_id=f"p{group}", sample_index=i, group_index=group, policy_versions=v)
            for i, v in enumerate(versions)]


def test_a_group_with_one_member_staler_than_k_is_dropped_whole_and_counted():
    trajs = _group(0, [[4], [4]]) + _group(1, [[3, 4], [4]]) + _group(2, [[2], [4, 5]])
    report = drop_stale_groups(trajs, step=5, max_staleness=2)
    assert [t.group_index for t in report.kept] == [0, 0, 1, 1]
    assert (report.dropped_groups, report.dropped_trajectories, report.mixed_versions) == (1, 2, 2)
    m = report.metrics()
    # staleness counts from each trajectory's OLDEST turn
    assert [m[f"async/staleness_{j}"] for j in range(4)] == [0, 4, 1, 1]
    assert m["async/staleness_max"] == 3 and m["async/dropped_groups"] == 1


def test_a_trajectory_from_the_future_is_a_bookkeeping_error():
    with pytest.raises(RuntimeError, match="newer than the policy"):
        drop_stale_groups(_group(0, [[3]]), step=2, max_staleness=1)


def test_idle_fractions():
    m = idle_metrics(step_s=10.0, trainer_wait_s=2.0, engine_busy_s=[6.0, 8.0], weight_pause_s=0.5)
    assert m["async/trainer_idle_frac"] == pytest.approx(0.2)
    assert m["async/engine_idle_frac"] == pytest.approx(0.3)
    assert m["async/weight_pause_s"] == 0.5


def test_pending_rollouts_survive_a_checkpoint_round_trip_with_their_versions():
    import io

    import torch

    pipe, _ = _pipeline(2)
    pipe.fill(0)
    pipe.take(0)
    pipe.drain()
    snap = pipe.snapshot()
    buf = io.BytesIO()
    torch.save({"pending": pending_to_state(snap)}, buf)
    buf.seek(0)
    restored = pending_from_state(torch.load(buf, weights_only=False)["pending"])
    assert [(i, p) for i, p, _ in restored] == [(i, p) for i, p, _ in snap] == [(1, [2, 3]), (2, [4, 5])]
    assert [piece[1][0].policy_versions for _, _, piece in restored] == [[1], [2]]
    assert [piece[1] for _, _, piece in restored] == [piece[1] for _, _, piece in snap]   # every field, typed
    assert all(piece[1][0].num_infra_tool_calls == 1 for _, _, piece in restored)
    again, started = _pipeline(2)
    again.restore(restored, next_index=3)
    again.fill(1)                                    # version 1 admits batch 3 only
    assert started == [3] and again.take(1).wait()[1][0].prompt_id == "b1"


def test_snapshot_refuses_rollouts_still_running():
    pipe = RolloutPipeline(1, 4, DataSampler(8, 2), FakeRollouts(done=False))
    pipe.fill(0)
    with pytest.raises(RuntimeError, match="drain"):
        pipe.snapshot()


def test_checkpoint_state_resumes_as_saved_or_rewinds_the_sampler_to_regenerate():
    pipe, _ = _pipeline(1)
    pipe.fill(0)
    pipe.take(0)
    pipe.fill(1)                                     # batches 1 and 2 in flight after step 0
    pipe.dropped_groups_total = 3
    saved = pipe.checkpoint_state(lambda mine: [mine], is_host=True)
    assert saved["batches"] == [(1, [2, 3]), (2, [4, 5])] and saved["next_index"] == 3
    resumed, started = _pipeline(1)
    assert resumed.load_checkpoint_state(saved, step=1, host_ordinal=0, num_hosts=1) is None
    assert [b.index for b in resumed.pending] == [1, 2] and resumed.dropped_groups_total == 3
    assert resumed.take(1).wait()[1][0].policy_versions == [1] and started == []
    # two rollout hosts now, or a synchronous run: the batches are drawn again
    for k, hosts, why in ((1, 2, "1 rollout host(s) saved, 2 now"), (0, 1, "max_staleness=0")):
        other, started = _pipeline(k)
        other.sampler.next_batch(), other.sampler.next_batch(), other.sampler.next_batch()
        assert why in other.load_checkpoint_state(saved, step=1, host_ordinal=0, num_hosts=hosts)
        other.fill(1)
        assert started == [1, 2][:k + 1] and [b.problems for b in other.pending] == [[2, 3], [4, 5]][:k + 1]


def test_a_synchronous_pipeline_rolls_each_batch_out_at_its_own_step_and_logs_no_async_columns():
    pipe, started = _pipeline(0, steps=3)
    for step in range(3):
        batch = pipe.next_batch(step)
        assert started == list(range(step + 1))            # drawn and rolled out by the step itself
        assert [t.prompt_id for t in batch.trajectories] == [f"b{step}"]
        assert batch.seconds == {"rollout": 1.0, "reward": 0.5, "tools": 0.0}
        pipe.run_ahead(step + 1)                            # nothing runs ahead of the next step
        assert started == list(range(step + 1)) and not pipe.pending
        assert pipe.overlap_metrics(batch, weight_pause_s=0.1) == {}
    assert pipe.checkpoint_state(lambda mine: [mine], is_host=True) is None    # nothing in flight to keep


def test_an_asynchronous_step_runs_batches_ahead_and_drops_groups_staler_than_k():
    pipe, started = _pipeline(1, steps=4, versions={2: 0})   # batch 2 stamped by version 0: 2 behind
    batch = pipe.next_batch(0)
    assert started == [0, 1] and batch.staleness.histogram == {0: 1}
    pipe.run_ahead(1)                                       # version 1 admits batch 2 at once
    assert started == [0, 1, 2]
    m = pipe.overlap_metrics(batch, weight_pause_s=0.25)
    assert m["async/staleness_0"] == 1 and m["async/weight_pause_s"] == 0.25 and "async/step_interval_s" in m
    pipe.next_batch(1)
    pipe.run_ahead(2)
    stale = pipe.next_batch(2)
    assert stale.trajectories == [] and stale.staleness.dropped_groups == 1
    assert pipe.overlap_metrics(stale, 0.0)["async/dropped_groups_total"] == 1


def _recipe(**train):
    return {"model": {"path": "m"}, "data": {"train": "t.jsonl"}, "train": train}


def test_staleness_needs_the_off_policy_correction():
    with pytest.raises(ConfigError, match=r"train.max_staleness=1 needs an off-policy correction: loss.tis: true"):
        load_recipe_dict(_recipe(max_staleness=1))
    cfg = load_recipe_dict({**_recipe(max_staleness=1), "loss": {"tis": True, "tis_cap": 2.0}})
    assert cfg.train.max_staleness == 1
    # or the ratio taken against the engine's own log-probs (the clip then bounds the stale step)
    cfg = load_recipe_dict({**_recipe(max_staleness=1), "loss": {"old_logprobs": "rollout"}})
    assert cfg.loss.old_logprobs == "rollout" and not cfg.loss.tis
    with pytest.raises(ConfigError, match=r"loss.old_logprobs: rollout and loss.tis: true together") as e:
        load_recipe_dict({**_recipe(max_staleness=1), "loss": {"old_logprobs": "rollout", "tis": True}})
    assert "\n" not in str(e.value)
    # a temperature is scored as the engine sampled it (PolicyTrainer's logits / T); a nucleus is not
    assert load_recipe_dict({**_recipe(max_staleness=1), "loss": {"old_logprobs": "rollout"},
                             "rollout": {"temperature": 0.7}}).rollout.temperature == 0.7
    with pytest.raises(ConfigError, match=r"loss.old_logprobs: rollout with rollout.top_p=0.9"):
        load_recipe_dict({**_recipe(max_staleness=1), "loss": {"old_logprobs": "rollout"},
                          "rollout": {"top_p": 0.9}})
    assert load_recipe_dict(_recipe()).train.max_staleness == 0     # the release's synchronous step


def test_colocated_engines_on_gpus_refuse_staleness_once_the_run_knows_its_device():
    from rstar2_cli.config import check_placement

    raw = {**_recipe(max_staleness=1), "loss": {"tis": True}}
    assert load_recipe_dict(raw).engine.colocate              # the device is not known yet: not checked
    load_recipe_dict(raw, on_gpu=False)                        # CPU: the engine core runs beside the trainer
    with pytest.raises(ConfigError) as e:
        load_recipe_dict(raw, on_gpu=True)
    assert "\n" not in str(e.value)
    assert "train.max_staleness=1 with engine.colocate: true on GPUs" in str(e.value)
    assert "engine.colocate: false" in str(e.value) and "--engine-gpus" in str(e.value)
    with pytest.raises(ConfigError, match="engine.colocate: true on GPUs"):   # what each trainer process runs
        check_placement(load_recipe_dict(raw), on_gpu=True)
    check_placement(load_recipe_dict({**raw, "engine": {"colocate": False}}), on_gpu=True)
    check_placement(load_recipe_dict(_recipe()), on_gpu=True)          # k = 0 colocated: the release's set-up


@pytest.mark.parametrize("k", [0, 2])
def test_an_abandoned_step_is_drawn_again_from_the_same_sampler_position(k):
    """An engine death past engine.max_restarts: the step's batch (and those ahead) are given up
    and the sampler moved back, so a checkpoint written then resumes by drawing them again."""
    pipe, started = _pipeline(k, steps=6)
    pipe.next_batch(0)
    pipe.fill(1)
    drawn = [list(b.problems) for b in pipe.pending]
    pipe.abandon(1)
    assert not pipe.pending and pipe.next_index == 1
    pipe.fill(1)
    assert [list(b.problems) for b in pipe.pending] == drawn   # the same batches, in the same order
