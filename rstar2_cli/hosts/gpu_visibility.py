"""Which GPUs a spawned process sees, set the same way for CUDA and ROCm.

A vLLM replica runs in an engine-core process that inherits the environment at spawn, so it is
put on given GPUs by setting the visibility variables around its construction. On ROCm there are
two that must agree: HIP honours both `HIP_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES`, and vLLM's
ROCm platform raises "Inconsistent GPU visibility env vars" at import when both are set and
differ (`_sync_hip_cuda_env_vars` in vllm/platforms/rocm.py; an empty value counts as unset, and
a lone HIP value is copied to CUDA). A node whose launcher exports `HIP_VISIBLE_DEVICES=0,...,7`
and an engine given `CUDA_VISIBLE_DEVICES=2,3` alone would therefore fail to start. So both are
set to the same ids, and both restored afterwards.

`ROCR_VISIBLE_DEVICES` (SLURM sets it for AMD GPUs) is the layer below: the ROCm runtime filters
devices by it first, and HIP/CUDA ids index the devices it leaves. vLLM compares only HIP and
CUDA, so it is left as it is, and the ids given here are positions among what it leaves visible.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping, Sequence

VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def visibility_limit(env: MutableMapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the limit this process runs under, CUDA_VISIBLE_DEVICES first, or None
    when neither is set; raises ValueError, naming both, when both are set and differ."""
    env = os.environ if env is None else env
    cuda, hip = (env.get(name) or None for name in VISIBILITY_VARS)
    if cuda is not None and hip is not None and cuda != hip:
        raise ValueError(f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} differ: vLLM's ROCm "
                         "platform refuses to start; set only one, or the same ids")
    if cuda is not None:
        return "CUDA_VISIBLE_DEVICES", cuda
    return ("HIP_VISIBLE_DEVICES", hip) if hip is not None else None


@contextlib.contextmanager
def visible_gpus(gpu_ids: Sequence[int], env: MutableMapping[str, str] | None = None) -> Iterator[str]:
    """Set CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES to `gpu_ids` for processes spawned inside
    the block, then restore both. Ids index the process's current visible devices when limited
    (`4,5,6,7` and ids 0,1 give `4,5`), else they are device ids. Yields the value set."""
    env = os.environ if env is None else env
    limit = visibility_limit(env)
    visible = [d.strip() for d in limit[1].split(",") if d.strip()] if limit else None
    chosen = []
    for g in gpu_ids:
        if g < 0:
            raise ValueError(f"gpu id {g}: must be >= 0")
        if limit is not None and g >= len(visible):
            raise ValueError(f"gpu id {g} is not one of the {len(visible)} devices in {limit[0]}={limit[1]!r}")
        chosen.append(visible[g] if visible is not None else str(g))
    value = ",".join(chosen)
    before = {name: env.get(name) for name in VISIBILITY_VARS}
    for name in VISIBILITY_VARS:
        env[name] = value
    try:
        yield value
    finally:
        for name, old in before.items():
            if old is None:
                env.pop(name, None)
            else:
                env[name] = old


def local_gpu_memory() -> tuple[float, str] | None:
    """(GiB, device name) of this node's first GPU, or None without one (a login node)."""
    try:
        import torch  # lazy: torch (~1 s); a login node plans without it, or has none
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.total_memory / 2**30, props.name
