"""Put a vLLM replica on given GPUs: `CUDA_VISIBLE_DEVICES` for the processes it spawns.

vLLM V1 runs the model in an engine-core process that it spawns at construction, and that
process (and its tensor-parallel workers) inherits the environment at spawn. So a replica is put
on given GPUs by setting `CUDA_VISIBLE_DEVICES` to them while the engine is built, then restoring
it; the trainer process keeps its own device (`engines.VLLMEngine.from_config(gpu_ids=...)`).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def visible_gpus(gpu_ids: Sequence[int]) -> Iterator[str]:
    """Set CUDA_VISIBLE_DEVICES to `gpu_ids` for processes spawned inside the block, then restore
    it. Ids index the process's current CUDA_VISIBLE_DEVICES when set (`4,5,6,7` and ids 0,1 give
    `4,5`), else they are physical ids. Yields the value set."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in before.split(",") if d.strip()] if before else None
    chosen = []
    for g in gpu_ids:
        if g < 0:
            raise ValueError(f"gpu id {g}: must be >= 0")
        if visible is not None and g >= len(visible):
            raise ValueError(f"gpu id {g} is not one of the {len(visible)} devices in "
                             f"CUDA_VISIBLE_DEVICES={before!r}")
        chosen.append(visible[g] if visible is not None else str(g))
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    try:
        yield os.environ["CUDA_VISIBLE_DEVICES"]
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
