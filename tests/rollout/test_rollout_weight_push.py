"""push_weights: one serialization of the weights, loaded by every replica of a host."""
from __future__ import annotations

import pytest
import torch

from rstar2_cli.rollout import engines


class _Replica:
    """Stands in for a VLLMEngine: records the worker RPCs it receives."""

    def __init__(self, inflight: int = 0) -> None:
        self._inflight, self._weight_chunk_bytes, self.calls = inflight, 64, []
        self.weights_version = 0

    async def _rpc(self, method, *args):
        self.calls.append((method, *args))
        return [0]

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


async def test_each_chunk_is_packed_once_and_every_replica_loads_it_in_order(monkeypatch):
    packed = []
    real_pack = engines.pack_weight_chunks

    def counting_pack(named, chunk_bytes):
        for blob in real_pack(named, chunk_bytes):
            packed.append(blob)
            yield blob

    monkeypatch.setattr(engines, "pack_weight_chunks", counting_pack)
    replicas = [_Replica() for _ in range(3)]
    named = [(f"w{i}", torch.full((16,), float(i))) for i in range(4)]  # 64 bytes each: one chunk each
    await engines.push_weights(replicas, iter(named))
    assert len(packed) == 4
    expected = ([("rstar2_begin_weight_update",)] + [("rstar2_load_weight_chunk", b) for b in packed]
                + [("rstar2_finish_weight_update",), ("reset_prefix_cache",)])
    assert all(r.calls == expected for r in replicas)
    assert all(r.weights_version == 1 for r in replicas)


async def test_a_replica_with_generations_in_flight_refuses_the_update():
    replicas = [_Replica(), _Replica(inflight=2)]
    with pytest.raises(RuntimeError, match="2 generation"):
        await engines.push_weights(replicas, iter([("w", torch.zeros(2))]))
    assert all(r.calls == [] for r in replicas)


async def test_a_paused_replica_takes_the_update_with_requests_queued():
    replicas = [_Replica(), _Replica(inflight=2)]       # asynchronous RL: paused, turns waiting
    await engines.push_weights(replicas, iter([("w", torch.zeros(2))]), paused=True)
    assert all(r.calls[-1] == ("reset_prefix_cache",) and r.weights_version == 1 for r in replicas)
