"""Dispatch decisions of the load-balanced scheduler, on fake engines whose free KV fraction the test
controls."""
from __future__ import annotations

import asyncio

import pytest

from rstar2_cli.rollout.engines import GenRequest, GenResult
from rstar2_cli.rollout.scheduler import LoadBalancedPolicy, LoadBalancedScheduler, ReplicaLoad


class FakeEngine:
    def __init__(self, free: float = 1.0, capacity: int = 10_000, new_tokens: int = 4):
        self.free = free
        self.kv_capacity_tokens = capacity
        self.new_tokens = new_tokens
        self.calls: list[GenRequest] = []
        self.gate: asyncio.Event | None = None     # when set, generate waits for it
        self.fail = False

    async def generate(self, req: GenRequest) -> GenResult:
        self.calls.append(req)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("engine died")
        ids = list(range(self.new_tokens))
        return GenResult(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="length", stop_token_id=None)

    def kv_free_fraction(self) -> float:
        return self.free

    async def update_weights(self, named_tensors) -> None:
        pass

    async def reset_prefix_cache(self) -> None:
        pass

    async def close(self) -> None:
        pass


def req(n: int = 10, max_tokens: int = 100) -> GenRequest:
    return GenRequest(prompt_ids=list(range(1, n + 1)), max_tokens=max_tokens)


async def test_each_trajectory_keeps_its_replica_for_every_turn_while_loads_are_even():
    """The KV-cache promise: a later turn runs where the trajectory's earlier turns ran (its
    prefix is cached there), while the trajectories themselves are spread over the replicas."""
    engines = [FakeEngine(1.0), FakeEngine(1.0)]
    gate = asyncio.Event()
    for e in engines:
        e.gate = gate
    sched = LoadBalancedScheduler(engines)
    turn0 = {k: req() for k in "abcd"}                                        # one step's first turns
    first = [asyncio.create_task(sched.generate(r, key=k)) for k, r in turn0.items()]
    await asyncio.sleep(0)
    homes = {k: next(i for i, e in enumerate(engines) if any(c is r for c in e.calls)) for k, r in turn0.items()}
    gate.set()
    await asyncio.gather(*first)
    assert sorted(homes.values()) == [0, 0, 1, 1]
    for turn in range(1, 4):                       # each turn's prompt holds the previous turns
        for k in "abcd":
            before = [len(e.calls) for e in engines]
            await sched.generate(req(10 + 20 * turn), key=k)
            assert [len(e.calls) - n for e, n in zip(engines, before)] == [int(homes[k] == 0), int(homes[k] == 1)]
    assert sched.stats()["moves"] == 0


async def test_when_every_replica_is_nearly_full_a_turn_stays_home():
    engines = [FakeEngine(0.9), FakeEngine(0.5)]
    sched = LoadBalancedScheduler(engines, min_free=0.1)
    await sched.generate(req(), key="t")                  # home = replica 0
    engines[0].free, engines[1].free = 0.02, 0.08         # re-prefilling on 1 would only add work
    await sched.generate(req(20), key="t")
    assert [len(e.calls) for e in engines] == [2, 0]


async def test_reset_between_steps_sends_first_turns_to_the_most_free_replica_again():
    engines = [FakeEngine(0.9), FakeEngine(0.5)]
    sched = LoadBalancedScheduler(engines)
    await sched.generate(req(), key="t")                  # home = replica 0
    engines[0].free, engines[1].free = 0.7, 0.9           # 0 is 0.2 behind: within the margin, t stays
    await sched.generate(req(20), key="t")
    assert [len(e.calls) for e in engines] == [2, 0]
    sched.reset()                                         # new weights: the cached prefixes are stale
    await sched.generate(req(), key="t")
    assert [len(e.calls) for e in engines] == [2, 1]


async def test_first_turn_goes_to_the_replica_with_most_free_kv():
    engines = [FakeEngine(0.3), FakeEngine(0.9), FakeEngine(0.5)]
    sched = LoadBalancedScheduler(engines)
    out = await sched.generate(req(), key="traj-0")
    assert out.token_ids == [0, 1, 2, 3]
    assert [len(e.calls) for e in engines] == [0, 1, 0]


async def test_burst_between_stat_refreshes_is_spread_by_inflight_tokens():
    # Engines report 100% free throughout (stats not refreshed yet): only in-flight tracking
    # can keep a burst from piling onto one replica.
    engines = [FakeEngine(1.0), FakeEngine(1.0)]
    gate = asyncio.Event()
    for e in engines:
        e.gate = gate
    sched = LoadBalancedScheduler(engines)
    tasks = [asyncio.create_task(sched.generate(req(), key=f"t{i}")) for i in range(6)]
    await asyncio.sleep(0)
    assert [len(e.calls) for e in engines] == [3, 3]
    assert sched.tracker.inflight_requests == [3, 3]
    gate.set()
    await asyncio.gather(*tasks)
    assert sched.tracker.inflight_tokens == [0, 0] and sched.tracker.inflight_requests == [0, 0]


async def test_next_turn_stays_home_while_it_has_room_then_moves():
    engines = [FakeEngine(0.5), FakeEngine(0.9)]
    sched = LoadBalancedScheduler(engines, min_free=0.1, margin=0.25)
    await sched.generate(req(), key="t")                  # home = replica 1
    engines[0].free, engines[1].free = 0.8, 0.6           # home less free, but within the margin
    await sched.generate(req(20), key="t")
    assert [len(e.calls) for e in engines] == [0, 2]
    engines[0].free, engines[1].free = 0.9, 0.5           # home 0.4 behind the best: move
    await sched.generate(req(30), key="t")
    assert [len(e.calls) for e in engines] == [1, 2]
    engines[0].free, engines[1].free = 0.05, 0.12         # new home nearly full: move back
    await sched.generate(req(40), key="t")
    assert [len(e.calls) for e in engines] == [1, 3]
    assert sched.stats()["sticky_hits"] == 1 and sched.stats()["moves"] == 2


async def test_another_trajectory_is_not_pinned_by_someone_elses_home():
    engines = [FakeEngine(0.5), FakeEngine(0.9)]
    sched = LoadBalancedScheduler(engines)
    await sched.generate(req(), key="a")
    engines[0].free, engines[1].free = 0.95, 0.85
    await sched.generate(req(), key="a")                  # a stays on 1 (within margin)
    await sched.generate(req(), key="b")                  # b's first turn: most free = 0
    assert [len(e.calls) for e in engines] == [1, 2]


async def test_inflight_is_released_when_the_engine_fails():
    engines = [FakeEngine(1.0)]
    engines[0].fail = True
    sched = LoadBalancedScheduler(engines)
    with pytest.raises(RuntimeError, match="engine died"):
        await sched.generate(req(), key="t")
    assert sched.tracker.inflight_tokens == [0] and sched.tracker.inflight_requests == [0]


def test_expected_new_tokens_follow_observed_lengths():
    sched = LoadBalancedScheduler([FakeEngine(new_tokens=8)])
    assert sched.tracker.expected_new_tokens(100) == 100      # nothing seen yet: worst case
    asyncio.run(sched.generate(req(max_tokens=100)))
    assert sched.tracker.expected_new_tokens(100) == 8
    assert sched.tracker.expected_new_tokens(5) == 5


def test_replica_load_uses_the_larger_of_engine_and_inflight_usage():
    assert ReplicaLoad(engine_free=0.9, inflight_tokens=500, capacity_tokens=1000).free == pytest.approx(0.5)
    assert ReplicaLoad(engine_free=0.3, inflight_tokens=100, capacity_tokens=1000).free == pytest.approx(0.3)
    assert ReplicaLoad(engine_free=0.7, inflight_tokens=10**6, capacity_tokens=0).free == pytest.approx(0.7)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="min_free"):
        LoadBalancedPolicy(min_free=1.5)
    with pytest.raises(ValueError, match="at least one engine"):
        LoadBalancedScheduler([])
