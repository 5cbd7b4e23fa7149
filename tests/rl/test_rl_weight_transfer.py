"""Weight-sync backend choice and the trainer-side sender logic of vLLM's weight transfer, on CPU.

The GPU-only parts (vLLM's trainer engines, the NCCL groups, the replicas) are fakes; each fake's
signature is checked against the installed vLLM / engine class it stands in for, and the limit a
fake cannot hit (the IPC buffer size) is asserted by the fake through the same rule the real path
uses (`check_packed_buffer`, itself checked against vLLM's producer by gpu_shapes_check)."""
from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch
from api_contracts import assert_call_binds, assert_fake_methods_match, assert_same_signature
from recorders import CountingSource

from rstar2_cli.rollout.weight_sync.client import EngineSyncClient
from rstar2_cli.rollout.weight_sync.engine_side import MidUpdateError
from rstar2_cli.rollout.weight_sync.pusher import WeightPusher
from rstar2_cli.rollout.weight_sync.source import (MiB, check_packed_buffer, engine_named_parameters,
                                                   packed_buffer_bytes, policy_weight_source)


# ---------------------------------------------------------------- fakes (signatures checked below)
class FakeEngine:
    """A replica (`VLLMEngine`): records the AsyncLLM calls it is given; a resolved future per call."""

    def __init__(self, tp_size: int = 1, log: list | None = None):
        self.calls: list[tuple] = [] if log is None else log
        self.tp_size, self.inflight, self.weights_version = tp_size, 0, 0

    def submit_llm_call(self, method, *args):
        self.calls.append((method, *args))
        f: Future = Future()
        f.set_result(None)
        return f

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    async def sleep(self, level=2):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


class FakeGroup:
    """A replica's NCCL group (vLLM's `PyNcclCommunicator`): records what it is sent."""

    def __init__(self):
        self.sent: list[int] = []

    def broadcast(self, tensor, src, stream=None):
        assert src == 0
        self.sent.append(tensor.numel() * tensor.element_size())


class FakeSender:
    """A vLLM trainer engine (`TrainerWeightTransferEngine`): drives vLLM's round trip through its
    client as the real IPC sender does (start, one update per pass, finish; sender only)."""

    def __init__(self, factory, info, client, source):
        self.factory, self.info, self.client, self.source = factory, info, client, source
        self.model_update_group = FakeGroup()

    def send_weights(self):
        if self.info.backend == "ipc":     # the real producer raises for a tensor the buffer cannot hold
            check_packed_buffer(self.source.metadata(), self.info.packed_buffer_size_bytes)
        if self.info.is_sender:
            self.client.start_weight_update()
        if self.factory.fail_while_sending:
            raise ValueError("Tensor 'model.embed_tokens.weight' exceeds buffer_size_bytes")
        names = [n for n, _ in self.source]
        self.factory.sent.append((self.info, names))
        if self.info.is_sender:
            self.client.update_weights({"names": names})
            self.client.finish_weight_update()

    def shutdown(self):
        self.factory.shut += 1


class FakeFactory:
    """vLLM's `WeightTransferTrainerFactory`: records each trainer_init, returns a FakeSender."""

    def __init__(self, fail_while_sending: bool = False):
        self.inits: list[tuple] = []
        self.senders: list[FakeSender] = []
        self.sent: list[tuple] = []
        self.shut, self.fail_while_sending = 0, fail_while_sending

    def trainer_init(self, init_info, *, client, source=None):
        self.inits.append((init_info, client, source))
        self.senders.append(FakeSender(self, init_info, client, source))
        return self.senders[-1]


def test_fakes_have_the_signatures_of_what_they_stand_in_for():
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine, VLLMWeightSyncClient

    from rstar2_cli.rollout.engines import VLLMEngine

    assert_fake_methods_match(FakeEngine, VLLMEngine, ["submit_llm_call", "reset_prefix_cache", "sleep", "wake_up"])
    assert_same_signature(FakeFactory().trainer_init, WeightTransferTrainerFactory.trainer_init)
    assert_fake_methods_match(FakeSender, TrainerWeightTransferEngine, ["send_weights", "shutdown"])
    assert_same_signature(FakeGroup.broadcast, PyNcclCommunicator.broadcast)
    assert_fake_methods_match(EngineSyncClient, VLLMWeightSyncClient, [
        "init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update"])
    assert isinstance(EngineSyncClient([]), VLLMWeightSyncClient)


def test_the_real_nccl_sender_carries_what_the_fan_out_uses():
    """The nccl fan-out reads `model_update_group` and the wire params off vLLM's sender: a real
    non-sender (built on CPU: it opens no group) has them."""
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    source = policy_weight_source(_model(), torch.bfloat16)
    info = NCCLTrainerInitInfo(master_address="", master_port=0, world_size=0, rank=1, packed=True,
                               packed_buffer_size_bytes=packed_buffer_bytes(source.metadata()))
    real = WeightTransferTrainerFactory.trainer_init(info, client=EngineSyncClient([]), source=source)
    assert real.model_update_group is None and not real.is_sender
    assert (real.packed, real.packed_buffer_size_bytes) == (True, info.packed_buffer_size_bytes)


def _async_llm_calls_bind(engines):
    from vllm.v1.engine.async_llm import AsyncLLM

    for e in engines:
        for method, *args in e.calls:
            if method not in ("reset_prefix_cache", "sleep", "wake_up"):   # the VLLMEngine methods themselves
                assert_call_binds(getattr(AsyncLLM, method), *args)


def _model():
    from rl_synthetic import build_tiny_model

    return build_tiny_model()


def _names(model) -> list[str]:
    return [n for n, _ in engine_named_parameters(model)]


# ---------------------------------------------------------------- ipc
def test_ipc_host_drives_all_its_replicas_through_one_sender():
    engines, factory = [FakeEngine(), FakeEngine()], FakeFactory()
    model = _model()
    pusher = WeightPusher("ipc", model=model, engines=engines, is_host=True, engine_dtype=torch.bfloat16,
                          rank=8, trainer_factory=factory)
    (info, client, _), = factory.inits
    assert info.backend == "ipc" and info.is_sender and info.packed     # a node's host is vLLM's sender
    assert client.engines == engines
    pusher.push(policy=None)
    assert factory.sent == [(info, _names(model))]
    for e in engines:
        assert [c[0] for c in e.calls] == ["start_weight_update", "update_weights", "finish_weight_update",
                                           "reset_prefix_cache"]     # stale KV is never reused
        assert e.weights_version == 1
    _async_llm_calls_bind(engines)


def test_ipc_buffer_is_sized_from_the_largest_tensor_of_the_real_qwen3_shapes():
    from vllm.distributed.weight_transfer.base import ParamMeta
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES

    def meta(vocab, hidden):
        return [ParamMeta("model.embed_tokens.weight", torch.bfloat16, (vocab, hidden)),
                ParamMeta("model.norm.weight", torch.bfloat16, (hidden,))]

    q14, q8, q17 = meta(151936, 5120), meta(151936, 4096), meta(151936, 2048)
    assert 151936 * 5120 * 2 > DEFAULT_PACKED_BUFFER_SIZE_BYTES          # vLLM's 1 GiB cannot hold it
    assert packed_buffer_bytes(q14) == 1536 * MiB                          # 1.45 GiB rounded up to 64 MiB
    assert packed_buffer_bytes(q8) == 1216 * MiB
    assert packed_buffer_bytes(q17) == DEFAULT_PACKED_BUFFER_SIZE_BYTES
    assert packed_buffer_bytes(q14, override_mb=2048) == 2048 * MiB
    with pytest.raises(ValueError, match="engine.ipc_buffer_mb=1024.*model.embed_tokens.weight.*at least 1484") as e:
        packed_buffer_bytes(q14, override_mb=1024)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=">= 1"):
        packed_buffer_bytes(q14, override_mb=0)


def test_qwen3_14b_ipc_sender_gets_a_buffer_for_its_embedding_and_a_small_one_fails_at_start_up():
    from gpu_shapes_check import trainer_model

    model, factory = trainer_model("qwen3-14b"), FakeFactory()      # on the meta device: no memory
    WeightPusher("ipc", model=model, engines=[FakeEngine()], is_host=True, engine_dtype=torch.bfloat16, rank=0,
                 trainer_factory=factory)
    assert factory.inits[0][0].packed_buffer_size_bytes == 1536 * MiB
    engine, factory = FakeEngine(), FakeFactory()
    with pytest.raises(ValueError, match="engine.ipc_buffer_mb=1024:.*model.embed_tokens.weight"):
        WeightPusher("ipc", model=model, engines=[engine], is_host=True, engine_dtype=torch.bfloat16, rank=0,
                     trainer_factory=factory, ipc_buffer_mb=1024)      # vLLM's default, the size used before
    assert factory.inits == [] and engine.calls == []


def test_a_send_failing_mid_update_finishes_the_update_and_says_so():
    engines, factory = [FakeEngine(), FakeEngine()], FakeFactory(fail_while_sending=True)
    pusher = WeightPusher("ipc", model=_model(), engines=engines, is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, trainer_factory=factory)
    with pytest.raises(MidUpdateError, match=r"weight sync \(ipc\) failed.*ValueError.*finish.*restart") as e:
        pusher.push(policy=None)
    assert "\n" not in str(e.value)
    for engine in engines:        # never left mid-update, and not marked as holding new weights
        assert [c[0] for c in engine.calls] == ["start_weight_update", "finish_weight_update"]
        assert engine.weights_version == 0


def test_a_send_failing_before_the_update_started_raises_as_is():
    factory = FakeFactory(fail_while_sending=True)
    pusher = WeightPusher("ipc", model=_model(), engines=[], is_host=False, engine_dtype=torch.bfloat16,
                          rank=3, trainer_factory=factory)     # a non-sender never starts an update
    with pytest.raises(ValueError, match="exceeds buffer_size_bytes"):
        pusher.push(policy=None)


# ---------------------------------------------------------------- nccl
def test_nccl_one_group_per_replica_sized_by_its_tp_on_a_port_held_until_its_rendezvous():
    import errno
    import socket

    from rstar2_cli.hosts.ports import reserve_port

    engines, factory = [FakeEngine(tp_size=2), FakeEngine(tp_size=2)], FakeFactory()
    held, taken = [], []

    def reserve():
        r = reserve_port()
        held.append(r.port)
        return r

    def trainer_init(info, client, source):   # while vLLM's store binds, nobody else gets the port
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", info.master_port))
            except OSError as e:
                taken.append(e.errno == errno.EADDRINUSE)
        return real_init(info, client=client, source=source)

    real_init, factory.trainer_init = factory.trainer_init, trainer_init
    WeightPusher("nccl", model=_model(), engines=engines, is_host=True, engine_dtype=torch.bfloat16, rank=0,
                 trainer_factory=factory, port=reserve)
    infos = [(i.master_port, i.world_size, i.is_sender, i.packed, c.engines) for i, c, _ in factory.inits]
    assert infos == [(held[0], 3, True, True, [engines[0]]), (held[1], 3, True, True, [engines[1]])]
    assert taken == [True, True]
    with socket.socket() as after:        # released once the rendezvous is done
        after.bind(("127.0.0.1", held[0]))


def test_nccl_host_gathers_once_and_broadcasts_every_chunk_to_every_replica():
    engines, factory = [FakeEngine(), FakeEngine(), FakeEngine()], FakeFactory()
    model = _model()
    pusher = WeightPusher("nccl", model=model, engines=engines, is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, trainer_factory=factory)
    pusher.transport.source = counting = CountingSource(pusher.transport.source)
    pusher.push(policy=None)
    assert counting.passes == 1 and factory.sent == []           # one pass; vLLM's per-sender send unused
    full_bytes = sum(p.numel() * 2 for _, p in engine_named_parameters(model))
    assert [sum(s.model_update_group.sent) for s in factory.senders] == [full_bytes] * 3
    for e in engines:
        assert [c[0] for c in e.calls] == ["start_weight_update", "update_weights", "finish_weight_update",
                                           "reset_prefix_cache"]
        assert e.calls[1][1].update_info["names"] == _names(model)
    _async_llm_calls_bind(engines)


def test_nccl_non_host_rank_joins_one_gather_pass_whatever_the_replica_count():
    factory = FakeFactory()
    pusher = WeightPusher("nccl", model=_model(), engines=[], is_host=False, engine_dtype=torch.bfloat16,
                          rank=5, trainer_factory=factory)
    pusher.transport.source = counting = CountingSource(pusher.transport.source)
    pusher.push(policy=None)
    assert factory.inits == [] and counting.passes == 1


def test_nccl_broadcast_failure_is_reported_mid_update_without_a_hanging_finish():
    engines, factory = [FakeEngine()], FakeFactory()
    pusher = WeightPusher("nccl", model=_model(), engines=engines, is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, trainer_factory=factory)

    def broken(tensor, src, stream=None):
        raise RuntimeError("NCCL error: unhandled system error")

    factory.senders[0].model_update_group.broadcast = broken
    with pytest.raises(MidUpdateError, match=r"\(nccl\).*left mid-update.*restart"):
        pusher.push(policy=None)
    assert "finish_weight_update" not in [c[0] for c in engines[0].calls]


# ---------------------------------------------------------------- both vLLM paths
def test_push_refuses_while_generations_are_in_flight():
    engine = FakeEngine()
    pusher = WeightPusher("ipc", model=_model(), engines=[engine], is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, trainer_factory=FakeFactory())
    engine.inflight = 2
    with pytest.raises(RuntimeError, match="2 generation"):
        pusher.push(policy=None)


def test_colocated_push_wakes_weights_then_loads_then_wakes_the_kv_cache(monkeypatch):
    log: list = []
    engine = FakeEngine(log=log)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append(("empty_cache",)))
    pusher = WeightPusher("ipc", model=_model(), engines=[engine], is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, trainer_factory=FakeFactory(), colocated=True)
    pusher.sleep_engines()
    pusher.push(policy=None)
    assert [c[:2] if c[0] in ("sleep", "wake_up") else c[:1] for c in log] == [
        ("sleep", 2),                                  # level 2: weights and KV cache discarded
        ("empty_cache",), ("wake_up", ["weights"]),    # the trainer's cache freed before each wake
        ("start_weight_update",), ("update_weights",), ("finish_weight_update",),
        ("empty_cache",), ("wake_up", ["kv_cache"]), ("reset_prefix_cache",)]


def test_colocated_non_host_rank_frees_its_cache_but_calls_no_engine(monkeypatch):
    freed = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(1))
    pusher = WeightPusher("ipc", model=_model(), engines=[], is_host=False, engine_dtype=torch.bfloat16,
                          rank=1, trainer_factory=FakeFactory(), colocated=True)
    pusher.sleep_engines()
    pusher.push(policy=None)
    assert freed == [1, 1]


# ---------------------------------------------------------------- the source
def test_source_metadata_matches_iteration_in_engine_dtype():
    model = _model()
    source = policy_weight_source(model, torch.bfloat16)
    meta = source.metadata()
    pairs = list(source)
    assert [m.name for m in meta] == [n for n, _ in pairs] == [n for n, _ in model.named_parameters()]
    for m, (_, t) in zip(meta, pairs):
        assert t.dtype == m.dtype == torch.bfloat16 and tuple(t.shape) == m.shape
    assert torch.equal(pairs[0][1], dict(model.named_parameters())[pairs[0][0]].detach().bfloat16())


def test_tied_embedding_is_sent_once_under_the_name_vllm_loads():
    from rl_synthetic import TINY_QWEN3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3, tie_word_embeddings=True))
    names = [m.name for m in policy_weight_source(model, torch.float32).metadata()]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())   # tie broken by a wrapper
    assert "lm_head.weight" in dict(model.named_parameters())
    assert "lm_head.weight" not in _names(model)      # still not sent: vLLM loads it through the embedding


def test_client_fans_each_call_out_to_every_replica():
    engines = [FakeEngine(), FakeEngine()]
    client = EngineSyncClient(engines)
    client.start_weight_update()
    assert client.in_update
    client.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]],
                           "ipc_handles": [{"gpu-uuid": ("args",)}]})
    client.finish_weight_update()
    assert not client.in_update
    for e in engines:
        assert [c[0] for c in e.calls] == ["start_weight_update", "update_weights", "finish_weight_update"]
        request = e.calls[1][1]
        assert "ipc_handles" not in request.update_info            # pickled for vLLM's msgpack RPC
        assert request.update_info["ipc_handles_pickled"]
    _async_llm_calls_bind(engines)
