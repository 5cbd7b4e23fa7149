"""rollout_side.push_weights: a failure found on one host fails the push on every rank.

Two ranks are two threads; the weight pusher's gathers are a barrier both must reach (as FSDP's
collectives), and `rl_dist.all_gather_objects` an exchange between both threads. Before the
agreement, the host raised alone and the other rank waited in the gather: here the barrier times
out instead. The failure before the transfer, with real processes: test_rl_push_wake_failure.py.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.rollout_side import WeightPushFailed, push_weights
from rstar2_cli.rollout.engine_health import EngineRestartsExhausted
from rstar2_cli.rollout.fleet import EngineFleet


class TwoRanks:
    def __init__(self):
        self.gather = threading.Barrier(2, timeout=5)
        self.agree = threading.Barrier(2, timeout=5)
        self.sent: list = [None, None]
        self.local = threading.local()

    def all_gather_objects(self, obj):
        self.sent[self.local.rank] = obj
        self.agree.wait()
        out = list(self.sent)
        self.agree.wait()
        return out

    def process_info(self):
        return SimpleNamespace(rank=self.local.rank)


def _service(world: TwoRanks, rank: int, heal, push_fails: bool = False) -> EngineFleet:
    """Rank `rank`'s fleet (no replicas), its pusher's gathers a barrier, its supervisor's heal `heal`."""
    def push(policy):
        world.gather.wait()                       # the gathers: every rank must be there
        if push_fails and rank == 0:
            raise RuntimeError("engine refused the weights")

    fleet = EngineFleet([], SimpleNamespace(push=push), loop=None, version=0, max_restarts=0)
    fleet.supervisor.heal = heal
    return fleet


def _both(world: TwoRanks, services) -> list[BaseException | None]:
    raised: list[BaseException | None] = [None, None]

    def run(rank):
        world.local.rank = rank
        try:
            push_weights(services[rank], object(), is_host=rank == 0, node=rank)
        except BaseException as e:     # noqa: BLE001 - what each rank raised is the result
            raised[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return raised


@pytest.fixture
def world(monkeypatch):
    w = TwoRanks()
    monkeypatch.setattr(rl_dist, "is_distributed", lambda: True)
    monkeypatch.setattr(rl_dist, "all_gather_objects", w.all_gather_objects)
    monkeypatch.setattr(rl_dist, "process_info", w.process_info)
    return w


def test_a_dead_engine_found_at_the_push_stops_every_rank_before_the_gathers(world):
    def heal(engines):
        raise EngineRestartsExhausted("engine died; not restarted: a sharded policy")

    raised = _both(world, [_service(world, 0, heal), _service(world, 1, heal)])
    assert [type(e) for e in raised] == [EngineRestartsExhausted, EngineRestartsExhausted]
    assert str(raised[0]) == str(raised[1]) == (
        "the engine check before the weight push failed on node 0 (rank 0): EngineRestartsExhausted: engine died; "
        "not restarted: a sharded policy; stopping on every rank")


def test_a_push_that_fails_on_the_host_after_the_gathers_fails_on_every_rank(world):
    raised = _both(world, [_service(world, r, lambda engines: None, push_fails=True) for r in (0, 1)])
    assert [type(e) for e in raised] == [WeightPushFailed, WeightPushFailed]
    assert str(raised[0]) == str(raised[1]) == ("the weight push failed on node 0 (rank 0): RuntimeError: engine "
                                                "refused the weights; stopping on every rank")


def test_a_push_that_succeeds_everywhere_moves_the_version(world):
    services = [_service(world, r, lambda engines: None) for r in (0, 1)]
    assert _both(world, services) == [None, None] and [s.version for s in services] == [1, 1]
