"""The discrete-event rollout simulator: deterministic, conserves work, and on a skewed workload
the load-balanced scheduler finishes no later than the static splits."""
from __future__ import annotations

import pytest

from rstar2_cli.rollout.scheduler import LoadBalancedPolicy
from sim.baselines import ContiguousSplitPolicy, RoundRobinPolicy
from sim.rollout import ReplicaModel, simulate
from sim.workload import WorkloadSpec, make_workload

SPEC = WorkloadSpec(num_prompts=24, rollouts_per_prompt=8, prompt_tokens=(50, 150),
                    long_turn_tokens=(200, 600), short_turn_tokens=(50, 200), max_response_tokens=4096)
MODEL = ReplicaModel(kv_capacity_tokens=20_000, max_num_seqs=32)


def test_workload_is_deterministic_and_skewed():
    a, b = make_workload(SPEC, seed=3), make_workload(SPEC, seed=3)
    assert [(p.prompt_tokens, [(t.gen_tokens, t.tool_tokens) for t in p.turns]) for p in a] == \
           [(p.prompt_tokens, [(t.gen_tokens, t.tool_tokens) for t in p.turns]) for p in b]
    assert make_workload(SPEC, seed=4) != a
    long = [p for p in a if p.long]
    assert 0 < len(long) < len(a)
    assert min(len(p.turns) for p in long) > max(len(p.turns) for p in a if not p.long)
    assert all(p.generated_tokens + sum(t.tool_tokens for t in p.turns) <= SPEC.max_response_tokens for p in a)


def test_simulation_is_deterministic_and_accounts_every_token():
    plans = make_workload(SPEC, seed=0)
    r1 = simulate(plans, 4, MODEL, LoadBalancedPolicy(), max_response_tokens=SPEC.max_response_tokens)
    r2 = simulate(plans, 4, MODEL, LoadBalancedPolicy(), max_response_tokens=SPEC.max_response_tokens)
    assert r1 == r2
    assert r1.generated_tokens == sum(p.generated_tokens for p in plans)
    assert sum(r1.dispatched) == sum(len(p.turns) for p in plans)
    # no replica can decode faster than one token per step at the smallest step time
    assert r1.makespan_s >= max(p.generated_tokens for p in plans) * MODEL.step_time(1)


@pytest.mark.parametrize("seed", [0, 1])
def test_load_balanced_makespan_not_worse_than_static_on_skewed_workload(seed):
    plans = make_workload(SPEC, seed=seed)
    run = lambda pol: simulate(plans, 4, MODEL, pol, max_response_tokens=SPEC.max_response_tokens).makespan_s
    lb = run(LoadBalancedPolicy())
    assert lb <= run(RoundRobinPolicy())
    assert lb <= run(ContiguousSplitPolicy(len(plans)))


def test_round_robin_static_split_keeps_each_trajectory_on_one_replica():
    plans = make_workload(SPEC, seed=0)
    pol = RoundRobinPolicy()
    res = simulate(plans, 4, MODEL, pol, max_response_tokens=SPEC.max_response_tokens)
    assert pol.homes == {p.key: i % 4 for i, p in enumerate(plans)}
    per_replica = [sum(len(p.turns) for i, p in enumerate(plans) if i % 4 == r) for r in range(4)]
    assert res.dispatched == per_replica


def test_trajectory_larger_than_the_kv_cache_is_rejected():
    plans = make_workload(SPEC, seed=0)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        simulate(plans, 2, ReplicaModel(kv_capacity_tokens=500), RoundRobinPolicy())
