"""Asynchronous GRPO-RoC bookkeeping: which batches run ahead, the staleness bound at training,
what a checkpoint keeps of the rollouts in flight, and the config's guard rails."""
from __future__ import annotations

import concurrent.futures

import pytest

from rstar2_cli.config import ConfigError, load_recipe_dict
from rstar2_cli.rl.run.async_rollouts import (
    Piece,
    RolloutPipeline,
    drop_stale_groups,
    idle_metrics,
    pending_from_state,
    pending_to_state,
)
from rstar2_cli.rl.run.sampler import DataSampler
from rstar2_cli.rollout.trajectory import Trajectory


class FakeRollouts:
    """The batch source as the pipeline sees it (`rollout_ahead.RolloutAhead`): batch b rolls out
    at once, as one trajectory sampled by version b (unless `versions` says otherwise), on one host."""

    def __init__(self, versions: dict[int, int] | None = None, done: bool = True):
        self.started: list[int] = []
        self.versions, self.done = versions or {}, done

    def start(self, index, problems):
        self.started.append(index)
        f: concurrent.futures.Future = concurrent.futures.Future()
        if self.done:
            traj = Trajectory(prompt_id=f"b{index}", policy_versions=[self.versions.get(index, index)],
                              num_tool_calls=2, num_infra_tool_calls=1)
            f.set_result(Piece([0], [traj], {"time/rollout": 1.0, "time/reward": 0.5}))
        return f

    def busy_seconds(self):
        return [0.0]


def _pipeline(k: int, steps: int = 10, **fake):
    rollouts = FakeRollouts(**fake)
    pipe = RolloutPipeline(k, steps, DataSampler(1000, 2, shuffle=False), rollouts, first_index=0, partial=False)
    return pipe, rollouts.started


def _train(pipe, step):
    """What the ahead-of-time source does with a step's batch on its (one) host: drop its stale
    groups; the hosts' reports (here one) become the async columns."""
    piece = pipe.wait(pipe.next_batch(step))
    kept, report = pipe.drop_stale(piece.trajectories, step)
    return kept, report, [report]


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


def test_checkpoint_state_resumes_as_saved_or_draws_the_batches_again():
    pipe, _ = _pipeline(1)
    pipe.fill(0)
    pipe.take(0)
    pipe.fill(1)                                     # batches 1 and 2 in flight after step 0
    pipe.dropped_groups_total = 3
    saved = pipe.checkpoint_state(lambda mine: [mine], is_host=True)
    assert saved["batches"] == [(1, [2, 3]), (2, [4, 5])] and saved["next_index"] == 3
    # the checkpoint's own sampler position is before them: what any resumed run loads first
    resumed, started = _pipeline(1)
    resumed.sampler.load_state_dict(saved["sampler_before"])
    assert resumed.load_checkpoint_state(saved, step=1, host_ordinal=0, num_hosts=1) is None
    assert [b.index for b in resumed.pending] == [1, 2] and resumed.dropped_groups_total == 3
    assert resumed.take(1).wait()[1][0].policy_versions == [1] and started == []
    assert resumed.sampler.state_dict() == pipe.sampler.state_dict()     # after them, as saved
    # two rollout hosts now: the batches are drawn again
    other, started = _pipeline(1)
    other.sampler.load_state_dict(saved["sampler_before"])
    assert "1 rollout host(s) saved, 2 now" in other.load_checkpoint_state(saved, step=1, host_ordinal=0, num_hosts=2)
    other.fill(1)
    assert started == [1, 2] and [b.problems for b in other.pending] == [[2, 3], [4, 5]]
    # a synchronous run reads only the sampler position: batch 1's problems are drawn again next
    rewound = DataSampler(1000, 2, shuffle=False)
    rewound.load_state_dict(saved["sampler_before"])
    assert rewound.next_batch() == [2, 3]
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        RolloutPipeline(0, 3, DataSampler(8, 2), FakeRollouts())


def test_an_asynchronous_step_runs_batches_ahead_and_drops_groups_staler_than_k():
    pipe, started = _pipeline(1, steps=4, versions={2: 0})   # batch 2 stamped by version 0: 2 behind
    _, report, shard = _train(pipe, 0)
    assert started == [0, 1] and report.staleness.histogram == {0: 1}
    pipe.after_update(1)                                    # version 1 admits batch 2 at once
    assert started == [0, 1, 2]
    m = pipe.overlap_metrics(shard, weight_pause_s=0.25)
    assert m["async/staleness_0"] == 1 and m["async/weight_pause_s"] == 0.25 and "async/step_interval_s" in m
    _train(pipe, 1)
    pipe.after_update(2)
    kept, report, shard = _train(pipe, 2)
    assert kept == [] and report.staleness.dropped_groups == 1
    assert pipe.overlap_metrics(shard, 0.0)["async/dropped_groups_total"] == 1


def test_the_hosts_staleness_reports_merge_into_the_one_host_columns():
    from rstar2_cli.rl.run.async_rollouts import merge_reports

    trajs = _group(0, [[4], [4]]) + _group(1, [[3, 4], [4]]) + _group(2, [[2], [4, 5]])
    whole = drop_stale_groups(trajs, step=5, max_staleness=2)
    parts = [drop_stale_groups(part, step=5, max_staleness=2) for part in (trajs[:2], trajs[2:])]
    assert merge_reports(parts).metrics() == whole.metrics()


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

    raw = {**_recipe(max_staleness=1, micro_batch_tokens=4096), "loss": {"tis": True}}   # a number: not sized on GPU
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
    release = _recipe(micro_batch_tokens=4096)
    check_placement(load_recipe_dict(release), on_gpu=True)          # k = 0 colocated: the release's set-up


def test_an_abandoned_step_is_drawn_again_from_the_same_sampler_position():
    """An engine death past engine.max_restarts: the step's batch (and those ahead) are given up
    and the sampler moved back, so a checkpoint written then resumes by drawing them again."""
    source, started = _pipeline(2, steps=6)
    source.next_batch(0)
    source.fill(1)
    drawn = [list(b.problems) for b in source.pending]
    source.abandon(1)
    assert not source.pending and source.next_index == 1
    source.fill(1)
    assert [list(b.problems) for b in source.pending] == drawn   # the same batches, in the same order
