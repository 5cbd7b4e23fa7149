"""Which weight-sync path a run takes (`choose_backend`) and what its engines need for it."""
from __future__ import annotations

import os
from typing import Any

from rstar2_cli.rollout.weight_sync.chunked import VLLMWeightSyncExtension

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


def engine_weight_sync_args(backend: str) -> dict[str, Any]:
    """The `AsyncEngineArgs` fields an engine needs to receive weights by `backend`: the chunked
    path's worker extension always (it is also the CPU path), and for "ipc"/"nccl" vLLM's
    weight-transfer engine of that backend."""
    transfer = None
    if backend in VLLM_BACKENDS:
        from vllm.config import WeightTransferConfig  # lazy: vLLM: imported only where it runs

        transfer = WeightTransferConfig(backend=backend)
        if backend == "ipc":   # IPC handles travel pickled (client.EngineSyncClient)
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    extension = f"{VLLMWeightSyncExtension.__module__}.{VLLMWeightSyncExtension.__qualname__}"
    return {"worker_extension_cls": extension, "weight_transfer_config": transfer}
