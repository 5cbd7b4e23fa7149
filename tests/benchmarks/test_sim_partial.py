"""Partial rollouts in the overlap model: a weight update stops a running turn at once (no
drain), the turn re-prefills and continues on the new weights, tokens are counted by the version
that generated them, staleness counts from the oldest token, and priority admission serves older
batches before FCFS would."""
from __future__ import annotations

import pytest

from rstar2_cli.rollout.scheduler import LoadBalancedPolicy
from sim.overlap import OverlapConfig, PhaseTimes, Placement, simulate_overlap
from sim.rollout import ReplicaCluster, ReplicaModel
from sim.workload import TrajectoryPlan, Turn, WorkloadSpec, make_workload

G = 4
SPEC = WorkloadSpec(num_prompts=8, rollouts_per_prompt=G, prompt_tokens=(50, 150), long_turn_tokens=(200, 600),
                    short_turn_tokens=(50, 200), max_response_tokens=4096)
MODEL = ReplicaModel(kv_capacity_tokens=20_000, max_num_seqs=32)
BATCHES = [make_workload(SPEC, seed=10 + b) for b in range(6)]
PHASES = PhaseTimes(reward_s=0.5, train_s=2.0, sync_s=0.2)


def test_keep_mode_continues_the_running_turn_on_the_new_weights_at_once():
    cluster = ReplicaCluster(1, MODEL, LoadBalancedPolicy(), update_mode="keep", load_weights_s=0.1)
    i = cluster.submit(TrajectoryPlan("t", 10, [Turn(100, 0.5, 5), Turn(50)]), 0.0)
    cluster.publish(1, 0.5)                       # mid-turn: 100 tokens take ~1.5 s
    rep = cluster.reps[0]
    assert rep.weights == 1 and rep.updates == 1  # loaded at once, nothing drained
    cluster.run()
    done_before = int(0.5 / MODEL.step_time(1))
    by_version = cluster.tokens_by_version[i]
    assert by_version[0] in (done_before - 1, done_before) and sum(by_version.values()) == 150
    assert rep.continued_turns == 1 and rep.update_recomputed_tokens == 10 + by_version[0]
    assert cluster.first_version[i] == 0 and rep.aborted_tokens == 0   # staleness: the oldest token


def test_wait_mode_counts_every_token_of_a_turn_under_one_version():
    cluster = ReplicaCluster(1, MODEL, LoadBalancedPolicy(), update_mode="wait", load_weights_s=0.1)
    i = cluster.submit(TrajectoryPlan("t", 10, [Turn(100, 0.5, 5), Turn(50)]), 0.0)
    cluster.publish(1, 0.5)
    cluster.run()
    assert cluster.tokens_by_version[i] == {0: 100, 1: 50}


@pytest.mark.parametrize("k", [1, 2])
def test_partial_rollouts_keep_staleness_within_k_and_train_every_batch(k):
    res = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=3), PHASES,
                           OverlapConfig(max_staleness=k, update_mode="keep"), steps=4)
    assert max(res.staleness) <= k and res.dropped_groups == 0
    assert sum(res.staleness.values()) == 4 * len(BATCHES[0])
    assert max(res.tokens_by_staleness) <= k
    trained = sum(p.generated_tokens for b in BATCHES[:4] for p in b)
    assert sum(res.tokens_by_staleness.values()) == trained
    assert res.continued_turns > 0 and res.update_recomputed_tokens > 0


@pytest.mark.parametrize("priority", [True, False])
def test_priority_admission_serves_the_older_batchs_next_turn_before_newer_batches(priority):
    """One sequence slot; batch 0's trajectory comes back from a tool call while batch 1 waits:
    with priority its next turn goes first, with FCFS it queues behind batch 1."""
    cluster = ReplicaCluster(1, ReplicaModel(kv_capacity_tokens=20_000, max_num_seqs=1), LoadBalancedPolicy())
    old = cluster.submit(TrajectoryPlan("a", 10, [Turn(10, 0.1, 5), Turn(10)]), 0.0, priority=0)
    new = [cluster.submit(TrajectoryPlan(f"b{j}", 10, [Turn(100)]), 0.0, priority=1 if priority else 0)
           for j in range(3)]
    cluster.run()
    one = 100 * MODEL.step_time(1)
    if priority:   # after the first of batch 1 (admitted while it waited for its tool)
        assert cluster.finished_at[old] < cluster.finished_at[new[1]] and cluster.finished_at[old] < 1.2 * one + 1
    else:          # behind all of batch 1
        assert cluster.finished_at[old] > cluster.finished_at[new[2]]


def test_fcfs_overlap_keeps_the_staleness_bound():
    fifo = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=3), PHASES,
                            OverlapConfig(max_staleness=2, update_mode="keep", priority=False), steps=4)
    assert max(fifo.staleness) <= 2 and sum(fifo.staleness.values()) == 4 * len(BATCHES[0])


def _long_turn_batches(n_batches: int) -> list[list[TrajectoryPlan]]:
    """Per batch 4 groups of 2, each sample one 2,000-token turn: a turn is always running at an update."""
    return [[TrajectoryPlan(f"p{p}-s{j}", 20, [Turn(2000)]) for p in range(4) for j in range(2)]
            for _ in range(n_batches)]


def test_a_blocking_push_waits_for_the_drain_in_wait_mode_and_not_in_keep_mode():
    """WeightPusher(pause=True) returns once every replica has loaded: under "wait" that is after
    the running turns finish, under "keep" right after the load."""
    batches = _long_turn_batches(6)
    fast = PhaseTimes(reward_s=0.0, train_s=1.0, sync_s=0.2)
    runs = {mode: simulate_overlap(batches, 2, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=2), fast,
                                   OverlapConfig(max_staleness=1, update_mode=mode, blocking_push=True), steps=4)
            for mode in ("wait", "keep")}
    staged = simulate_overlap(batches, 2, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=2), fast,
                              OverlapConfig(max_staleness=1), steps=4)
    assert staged.push_wait_s == 0.0
    load = fast.sync_s                                  # each replica loads in sync_s once it may
    assert runs["keep"].push_wait_s == pytest.approx(len(runs["keep"].steps) * load, rel=1e-6)
    assert runs["wait"].push_wait_s > runs["keep"].push_wait_s + 1.0   # the drain of 2,000-token turns
    for res in runs.values():
        assert max(res.staleness) <= 1 and sum(res.staleness.values()) == 4 * 8
