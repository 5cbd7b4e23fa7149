"""rollout_side.push_weights: a failure found on one host fails the push on every rank.

Two ranks are two threads; the weight pusher's gathers are a barrier both must reach (as FSDP's
collectives), and `rl_dist.agree_max` the max over both threads. Before the agreement, the host
raised alone and the other rank waited in the gather: here the barrier times out instead.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.rollout_side import push_weights
from rstar2_cli.rollout.engine_health import EngineRestartsExhausted
from rstar2_cli.rollout.fleet import EngineFleet


class TwoRanks:
    def __init__(self):
        self.gather = threading.Barrier(2, timeout=5)
        self.agree = threading.Barrier(2, timeout=5)
        self.flags = [0.0, 0.0]
        self.local = threading.local()

    def agree_max(self, values):
        self.flags[self.local.rank] = values[0]
        self.agree.wait()
        out = [max(self.flags)]
        self.agree.wait()
        return out


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
            push_weights(services[rank], object(), is_host=rank == 0)
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
    monkeypatch.setattr(rl_dist, "agree_max", w.agree_max, raising=False)
    return w


def test_a_dead_engine_found_at_the_push_stops_every_rank_before_the_gathers(world):
    def heal(engines):
        raise EngineRestartsExhausted("engine died; not restarted: a sharded policy")

    raised = _both(world, [_service(world, 0, heal), _service(world, 1, heal)])
    assert [type(e) for e in raised] == [EngineRestartsExhausted, EngineRestartsExhausted]
    assert "engine died" in str(raised[0]) and "another rank" in str(raised[1])


def test_a_push_that_fails_on_the_host_after_the_gathers_fails_on_every_rank(world):
    raised = _both(world, [_service(world, r, lambda engines: None, push_fails=True) for r in (0, 1)])
    assert [type(e) for e in raised] == [RuntimeError, RuntimeError]
    assert "refused" in str(raised[0]) and "the weight push failed on another rank" in str(raised[1])


def test_a_push_that_succeeds_everywhere_moves_the_version(world):
    services = [_service(world, r, lambda engines: None) for r in (0, 1)]
    assert _both(world, services) == [None, None] and [s.version for s in services] == [1, 1]
