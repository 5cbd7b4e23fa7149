"""The rollout/training overlap model: k=0 is the synchronous step, staleness stays within k,
stale groups are dropped and counted, weight updates never land inside a turn, and sticky
routing keeps a trajectory on one replica."""
from __future__ import annotations

import pytest

from rstar2_cli.rollout.scheduler import LoadBalancedPolicy, LoadTracker, ReplicaLoad
from sim.baselines import StickyLeastLoadedPolicy
from sim.overlap import OverlapConfig, PhaseTimes, Placement, simulate_overlap
from sim.rollout import ReplicaCluster, ReplicaModel, simulate
from sim.workload import TrajectoryPlan, Turn, WorkloadSpec, make_workload

G = 4
SPEC = WorkloadSpec(num_prompts=8, rollouts_per_prompt=G, prompt_tokens=(50, 150), long_turn_tokens=(200, 600),
                    short_turn_tokens=(50, 200), max_response_tokens=4096)
MODEL = ReplicaModel(kv_capacity_tokens=20_000, max_num_seqs=32)
BATCHES = [make_workload(SPEC, seed=10 + b) for b in range(6)]
PHASES = PhaseTimes(reward_s=1.0, train_s=6.0, sync_s=0.5)


def test_k0_colocated_is_the_synchronous_step():
    res = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4), PHASES)
    policy, tracker, t = LoadBalancedPolicy(), LoadTracker(4), 0.0
    for s, batch in enumerate(BATCHES):
        policy.reset()
        rollout = simulate(batch, 4, MODEL, policy, max_response_tokens=8192, tracker=tracker).makespan_s
        assert res.steps[s].start_s == pytest.approx(t + rollout, rel=1e-12)
        t += rollout + PHASES.reward_s + PHASES.train_s + PHASES.sync_s
        assert res.steps[s].end_s == pytest.approx(t, rel=1e-12)
    assert res.staleness == {0: len(BATCHES) * len(BATCHES[0])}
    assert res.dropped_groups == 0


@pytest.mark.parametrize("consume", ["in_order", "completion"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_staleness_never_exceeds_k(k, consume):
    res = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=3), PHASES,
                           OverlapConfig(max_staleness=k, consume=consume), steps=4)
    assert max(res.staleness) <= k
    assert sum(res.staleness.values()) == 4 * len(BATCHES[0])          # every step trained a full batch
    if consume == "in_order":
        assert res.dropped_groups == 0                                  # batch b starts at version >= b - k
    starts = [r.start_s for r in res.steps]
    assert starts == sorted(starts) and all(a.end_s <= b.start_s for a, b in zip(res.steps, res.steps[1:]))


def test_overlap_with_k1_beats_the_synchronous_step_when_rollout_dominates():
    cheap = PhaseTimes(reward_s=0.5, train_s=2.0, sync_s=0.2)
    sync = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4), cheap)
    k1 = simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=3), cheap,
                          OverlapConfig(max_staleness=1))
    assert k1.step_time_s(warmup=2) < sync.step_time_s(warmup=2)
    assert k1.trainer_idle_fraction < sync.trainer_idle_fraction


def _long_tail_batches(n_batches: int) -> list[list[TrajectoryPlan]]:
    """Per batch 4 groups of 2; group 0 of every batch is far slower than the rest."""
    out = []
    for b in range(n_batches):
        plans = []
        for p in range(4):
            turns = [Turn(400, 5.0, 10)] * 6 + [Turn(400)] if p == 0 else [Turn(40)]
            plans += [TrajectoryPlan(f"p{p}-s{j}", 20, list(turns), long=p == 0) for j in range(2)]
        out.append(plans)
    return out


def _chain_floor_s(plan: TrajectoryPlan, model: ReplicaModel) -> float:
    """The least time a trajectory can take: every token at batch-1 speed, plus its tool waits."""
    return sum(t.gen_tokens * model.step_time(1) + t.tool_latency_s for t in plan.turns)


@pytest.mark.parametrize("k", [1, 2])
def test_in_order_admission_gives_each_batch_k_steps_for_its_longest_chain(k):
    """The bound behind docs/async-rl.md S3.3: batch b is submitted when step b-k-1 ends and
    trained when step b starts, so that window must hold its slowest trajectory's chain of turns.
    In the steady state the window is (k+1) periods minus one training step: P >= (C + T) / (k+1)."""
    batches = _long_tail_batches(6)
    fast = PhaseTimes(reward_s=0.1, train_s=1.0, sync_s=0.1)
    res = simulate_overlap(batches, 2, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=2), fast,
                           OverlapConfig(max_staleness=k), steps=5)
    for b in range(k + 1, 5):
        window = res.steps[b].start_s - res.steps[b - k - 1].end_s
        assert window >= max(_chain_floor_s(p, MODEL) for p in batches[b])


def test_completion_order_drops_stale_groups_and_counts_them():
    batches = _long_tail_batches(10)
    fast = PhaseTimes(reward_s=0.0, train_s=0.5, sync_s=0.0)
    res = simulate_overlap(batches, 2, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=2), fast,
                           OverlapConfig(max_staleness=1, consume="completion"), steps=6)
    assert res.dropped_groups > 0
    assert res.dropped_trajectories == 2 * res.dropped_groups
    assert sum(r.dropped_groups for r in res.steps) <= res.dropped_groups
    assert max(res.staleness) <= 1
    assert sum(res.staleness.values()) == 6 * 4 * 2
    # in data order the same workload drops nothing: each step waits for its slow group
    in_order = simulate_overlap(batches, 2, MODEL, LoadBalancedPolicy(), Placement(4, engine_gpus=2), fast,
                                OverlapConfig(max_staleness=1), steps=6)
    assert in_order.dropped_groups == 0 and in_order.total_s > res.total_s


def _one_turn_cluster(mode: str) -> tuple[ReplicaCluster, int]:
    cluster = ReplicaCluster(1, MODEL, LoadBalancedPolicy(), update_mode=mode, load_weights_s=0.1)
    i = cluster.submit(TrajectoryPlan("t", 10, [Turn(100, 0.5, 5), Turn(50)]), 0.0)
    return cluster, i


def test_wait_mode_finishes_the_running_turn_with_old_weights():
    cluster, i = _one_turn_cluster("wait")
    cluster.publish(1, 0.5)                       # mid-turn: 100 tokens take ~1.5 s
    cluster.run()
    assert (cluster.first_version[i], cluster.last_version[i]) == (0, 1)
    assert cluster.reps[0].aborted_tokens == 0 and cluster.reps[0].updates == 1


def test_abort_mode_regenerates_the_turn_with_new_weights():
    cluster, i = _one_turn_cluster("abort")
    cluster.publish(1, 0.5)
    cluster.run()
    assert (cluster.first_version[i], cluster.last_version[i]) == (1, 1)
    assert 0 < cluster.reps[0].aborted_tokens < 100
    assert cluster.finished_at[i] > 0.5 + 0.1 + 150 * MODEL.step_time(1)


class _Recording(StickyLeastLoadedPolicy):
    def __init__(self):
        super().__init__()
        self.choices: list[tuple[str, int, list[float]]] = []

    def choose(self, loads, key=None):
        r = super().choose(loads, key)
        self.choices.append((key, r, [x.load for x in loads]))
        return r


def test_sticky_least_loaded_keeps_a_trajectory_on_one_replica():
    plans = make_workload(SPEC, seed=0)
    pol = _Recording()
    simulate(plans, 4, MODEL, pol)
    replicas: dict[str, set[int]] = {}
    for key, r, _ in pol.choices:
        replicas.setdefault(key, set()).add(r)
    assert all(len(v) == 1 for v in replicas.values()) and len(replicas) == len(plans)
    assert len(pol.choices) == sum(len(p.turns) for p in plans)
    first = {}
    for key, r, loads in pol.choices:              # a new trajectory goes to the least-loaded replica
        if key not in first:
            first[key] = r
            assert loads[r] == min(loads)


def test_sticky_policy_does_not_move_a_trajectory_off_a_full_replica():
    pol = StickyLeastLoadedPolicy()
    idle, full = ReplicaLoad(1.0, 0, 1000), ReplicaLoad(0.0, 5000, 1000)
    assert pol.choose([idle, full], "a") == 0
    assert pol.choose([full, idle], "a") == 0     # LoadBalancedPolicy would move it
    assert pol.choose([full, idle], "b") == 1
    assert LoadBalancedPolicy().choose([full, idle]) == 1


def test_placement_and_config_errors_are_one_line():
    with pytest.raises(ValueError, match="engine_gpus"):
        Placement(64, tensor_parallel=4, engine_gpus=30)
    with pytest.raises(ValueError, match="no GPU"):
        Placement(8, engine_gpus=8)
    with pytest.raises(ValueError, match="own GPUs"):
        simulate_overlap(BATCHES, G, MODEL, LoadBalancedPolicy(), Placement(4), PHASES, OverlapConfig(max_staleness=1))
    with pytest.raises(ValueError, match="max_staleness"):
        OverlapConfig(max_staleness=-1)
    assert Placement(64, 4, engine_gpus=48).replicas == 12 and Placement(64, 4, engine_gpus=48).trainer_gpus == 16
