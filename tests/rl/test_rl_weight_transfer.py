"""Weight-sync backend choice and the trainer-side sender logic of vLLM's weight transfer, on CPU
with fakes for the GPU-only parts (vLLM's trainer engines, the replicas)."""
from __future__ import annotations

import os
from concurrent.futures import Future

import pytest
import torch

from rstar2_cli.rollout.weight_transfer import (EngineSyncClient, WeightPusher, choose_backend, engine_weight_sync_args,
                                                policy_weight_source)


@pytest.mark.parametrize("requested, on_gpu, colocate, expected", [
    ("auto", False, True, "chunked"), ("auto", True, True, "ipc"), ("auto", True, False, "nccl"),
    ("chunked", True, True, "chunked"), ("nccl", True, False, "nccl"), ("ipc", True, True, "ipc"),
])
def test_backend_follows_engine_placement(requested, on_gpu, colocate, expected):
    assert choose_backend(requested, on_gpu=on_gpu, colocate=colocate) == expected


@pytest.mark.parametrize("requested, on_gpu, colocate, fragment", [
    ("ipc", False, True, "needs GPUs"), ("ipc", True, False, "needs engine.colocate=true"),
    ("nccl", True, True, "needs engine.colocate=false"), ("rdma", True, True, "expected one of"),
])
def test_impossible_backend_is_one_line_error(requested, on_gpu, colocate, fragment):
    with pytest.raises(ValueError, match=fragment) as e:
        choose_backend(requested, on_gpu=on_gpu, colocate=colocate)
    assert "\n" not in str(e.value) and "engine.weight_transfer" in str(e.value)


class FakeEngine:
    """A replica: records the AsyncLLM calls it is given; a resolved future per call."""

    def __init__(self, tp_size: int = 1):
        self.calls: list[tuple] = []
        self.tp_size, self.inflight, self.weights_version = tp_size, 0, 0

    def submit_llm_call(self, method, *args):
        self.calls.append((method, *args))
        f: Future = Future()
        f.set_result(None)
        return f

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


class FakeFactory:
    """Stands in for vLLM's WeightTransferTrainerFactory: records each trainer_init."""

    def __init__(self):
        self.inits: list[tuple] = []

    def trainer_init(self, info, *, client, source):
        factory = self

        class Sender:
            def send_weights(self):
                factory.sent.append((info, [n for n, _ in source]))

            def shutdown(self):
                factory.shut += 1

        self.inits.append((info, client, source))
        return Sender()

    sent: list = []
    shut = 0


def _model():
    from rl_synthetic import build_tiny_model

    return build_tiny_model()


def test_ipc_host_drives_all_its_replicas_through_one_sender():
    engines, factory = [FakeEngine(), FakeEngine()], FakeFactory()
    factory.sent = []
    pusher = WeightPusher("ipc", model=_model(), engines=engines, is_host=True, replicas_per_node=2,
                          engine_dtype=torch.bfloat16, rank=8, trainer_factory=factory)
    (info, client, _), = factory.inits
    assert info.backend == "ipc" and info.is_sender and info.packed     # a node's host is vLLM's sender
    assert client.engines == engines
    pusher.push(policy=None)
    assert len(factory.sent) == 1
    assert all(e.calls == [("reset_prefix_cache",)] for e in engines)   # stale KV is never reused


def test_non_host_rank_joins_the_gathers_but_talks_to_no_engine():
    for backend, replicas in (("ipc", 1), ("nccl", 3)):
        factory = FakeFactory()
        factory.sent = []
        pusher = WeightPusher(backend, model=_model(), engines=[], is_host=False, replicas_per_node=replicas,
                              engine_dtype=torch.bfloat16, rank=5, trainer_factory=factory)
        assert len(factory.inits) == replicas
        assert all(not info.is_sender and client.engines == [] for info, client, _ in factory.inits)
        pusher.push(policy=None)
        assert len(factory.sent) == replicas          # the same number of gather passes as the host


def test_nccl_one_group_per_replica_sized_by_its_tp():
    engines, factory = [FakeEngine(tp_size=2), FakeEngine(tp_size=2)], FakeFactory()
    ports = iter([41001, 41002])
    WeightPusher("nccl", model=_model(), engines=engines, is_host=True, replicas_per_node=2,
                 engine_dtype=torch.bfloat16, rank=0, trainer_factory=factory, port=lambda: next(ports))
    infos = [(i.master_port, i.world_size, i.is_sender, c.engines) for i, c, _ in factory.inits]
    assert infos == [(41001, 3, True, [engines[0]]), (41002, 3, True, [engines[1]])]


def test_push_refuses_while_generations_are_in_flight():
    engine = FakeEngine()
    pusher = WeightPusher("ipc", model=_model(), engines=[engine], is_host=True, replicas_per_node=1,
                          engine_dtype=torch.bfloat16, rank=0, trainer_factory=FakeFactory())
    engine.inflight = 2
    with pytest.raises(RuntimeError, match="2 generation"):
        pusher.push(policy=None)


def test_source_metadata_matches_iteration_in_engine_dtype():
    model = _model()
    source = policy_weight_source(model, torch.bfloat16)
    meta = source.metadata()
    pairs = list(source)
    assert [m.name for m in meta] == [n for n, _ in pairs] == [n for n, _ in model.named_parameters()]
    for m, (_, t) in zip(meta, pairs):
        assert t.dtype == m.dtype == torch.bfloat16 and tuple(t.shape) == m.shape
    assert torch.equal(pairs[0][1], dict(model.named_parameters())[pairs[0][0]].detach().bfloat16())


def test_tied_embedding_is_sent_once_under_the_checkpoint_name():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from rl_synthetic import TINY_QWEN3

    model = Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3, tie_word_embeddings=True))
    names = [m.name for m in policy_weight_source(model, torch.float32).metadata()]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_client_fans_each_call_out_to_every_replica():
    engines = [FakeEngine(), FakeEngine()]
    client = EngineSyncClient(engines)
    client.start_weight_update()
    client.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]],
                           "ipc_handles": [{"gpu-uuid": ("args",)}]})
    client.finish_weight_update()
    for e in engines:
        assert [c[0] for c in e.calls] == ["start_weight_update", "update_weights", "finish_weight_update"]
        request = e.calls[1][1]
        assert "ipc_handles" not in request.update_info            # pickled for vLLM's msgpack RPC
        assert request.update_info["ipc_handles_pickled"]


@pytest.mark.parametrize("backend", ["chunked", "ipc", "nccl"])
def test_engine_args_name_the_worker_extension_and_vllms_transfer_backend(backend, monkeypatch):
    import importlib

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    args = engine_weight_sync_args(backend)
    module, _, name = args["worker_extension_cls"].rpartition(".")
    assert hasattr(getattr(importlib.import_module(module), name), "rstar2_load_weight_chunk")
    transfer = args["weight_transfer_config"]
    assert (transfer is None) if backend == "chunked" else (transfer.backend == backend)
    # only ipc payloads travel pickled (EngineSyncClient), so only ipc engines accept them
    assert (os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1") == (backend == "ipc")
