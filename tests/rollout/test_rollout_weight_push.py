"""The chunked weight path: one serialization of the weights, loaded by every replica of a host,
refused while generations are in flight unless the replicas were paused for it."""
from __future__ import annotations

import asyncio

import pytest
import torch
from api_contracts import assert_call_binds, assert_fake_methods_match

from rstar2_cli.rollout.weight_sync import chunked
from rstar2_cli.rollout.weight_sync.engine_side import MidUpdateError
from rstar2_cli.rollout.weight_sync.pusher import WeightPusher


class _Replica:
    """Stands in for a VLLMEngine: records the worker RPCs and engine calls it receives."""

    def __init__(self, inflight: int = 0, fail_on: str | None = None) -> None:
        self.inflight, self.weight_chunk_bytes, self.calls = inflight, 64, []
        self.weights_version, self.fail_on = 0, fail_on

    async def collective_rpc(self, method, *args):
        self.calls.append((method, *args))
        if method == self.fail_on:
            raise RuntimeError("worker died loading a chunk")
        return [0]

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    async def pause_for_update(self):
        self.calls.append(("pause_for_update",))

    async def resume_after_update(self):
        self.calls.append(("resume_after_update",))


class _Policy:
    """Stands in for PolicyTrainer: the full state it hands to host ranks, nothing elsewhere."""

    def __init__(self, named) -> None:
        self.named, self.keeps = named, []

    def full_state_for_engines(self, keep: bool):
        self.keeps.append(keep)
        return list(self.named) if keep else []


def test_the_fake_replica_has_the_engine_signatures_and_its_rpcs_exist_on_the_worker():
    from rstar2_cli.rollout.engines import VLLMEngine

    assert_fake_methods_match(_Replica, VLLMEngine, ["collective_rpc", "reset_prefix_cache", "pause_for_update",
                                                     "resume_after_update"])
    replica = _Replica()
    asyncio.run(chunked.load_chunks([replica], iter([("w", torch.zeros(2))])))
    for method, *args in replica.calls:         # what VLLMEngine.collective_rpc asks each worker to run
        assert_call_binds(getattr(chunked.VLLMWeightSyncExtension, method), *args)


def _counting_pack(monkeypatch) -> list[bytes]:
    packed = []
    real_pack = chunked.pack_weight_chunks

    def counting_pack(named, chunk_bytes):
        for blob in real_pack(named, chunk_bytes):
            packed.append(blob)
            yield blob

    monkeypatch.setattr(chunked, "pack_weight_chunks", counting_pack)
    return packed


def _loaded(packed: list[bytes]) -> list[tuple]:
    return ([("rstar2_begin_weight_update",)] + [("rstar2_load_weight_chunk", b) for b in packed]
            + [("rstar2_finish_weight_update",), ("reset_prefix_cache",)])


async def test_each_chunk_is_packed_once_and_every_replica_loads_it_in_order(monkeypatch):
    packed = _counting_pack(monkeypatch)
    replicas = [_Replica() for _ in range(3)]
    named = [(f"w{i}", torch.full((16,), float(i))) for i in range(4)]  # 64 bytes each: one chunk each
    await chunked.push_weights(replicas, iter(named))
    assert len(packed) == 4
    assert all(r.calls == _loaded(packed) for r in replicas)
    assert all(r.weights_version == 1 for r in replicas)


async def test_a_replica_with_generations_in_flight_refuses_the_update():
    replicas = [_Replica(), _Replica(inflight=2)]
    with pytest.raises(RuntimeError, match="2 generation"):
        await chunked.push_weights(replicas, iter([("w", torch.zeros(2))]))
    assert all(r.calls == [] for r in replicas)


async def test_a_paused_replica_takes_the_update_with_requests_queued():
    replicas = [_Replica(), _Replica(inflight=2)]       # asynchronous RL: paused, turns waiting
    await chunked.push_weights(replicas, iter([("w", torch.zeros(2))]), paused=True)
    assert all(r.calls[-1] == ("reset_prefix_cache",) and r.weights_version == 1 for r in replicas)


def test_chunked_pusher_on_a_host_loads_its_replicas_between_pause_and_resume(monkeypatch):
    packed = _counting_pack(monkeypatch)
    replicas = [_Replica(), _Replica(inflight=1)]       # a turn queued while paused
    policy = _Policy([(f"w{i}", torch.full((16,), float(i))) for i in range(2)])
    pusher = WeightPusher("chunked", model=None, engines=replicas, is_host=True,
                          engine_dtype=torch.float32, rank=0, pause=True)
    pusher.push(policy)
    assert policy.keeps == [True] and len(packed) == 2
    assert all(r.calls == [("pause_for_update",)] + _loaded(packed) + [("resume_after_update",)] for r in replicas)
    assert all(r.weights_version == 1 for r in replicas)


def test_chunked_pusher_off_a_host_joins_the_gather_and_keeps_nothing():
    policy = _Policy([("w", torch.zeros(2))])
    pusher = WeightPusher("chunked", model=None, engines=[], is_host=False,
                          engine_dtype=torch.float32, rank=3)
    pusher.push(policy)
    assert policy.keeps == [False]


def test_chunked_pusher_refuses_while_generations_are_in_flight():
    replica = _Replica(inflight=3)
    pusher = WeightPusher("chunked", model=None, engines=[replica], is_host=True,
                          engine_dtype=torch.float32, rank=0)
    with pytest.raises(RuntimeError, match="3 generation"):
        pusher.push(_Policy([("w", torch.zeros(2))]))
    assert replica.calls == [] and replica.weights_version == 0


async def test_a_chunk_failing_mid_update_finishes_the_update_on_every_replica():
    replicas = [_Replica(), _Replica(fail_on="rstar2_load_weight_chunk")]
    named = [(f"w{i}", torch.full((16,), float(i))) for i in range(3)]
    with pytest.raises(MidUpdateError, match=r"\(chunked\).*RuntimeError: worker died.*restart") as e:
        await chunked.push_weights(replicas, iter(named))
    assert "\n" not in str(e.value)
    for r in replicas:       # none left mid-update, none marked as holding new weights
        assert r.calls[0][0] == "rstar2_begin_weight_update" and r.calls[-1] == ("rstar2_finish_weight_update",)
        assert r.weights_version == 0
