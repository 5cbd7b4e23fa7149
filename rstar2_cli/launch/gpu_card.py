"""The GPU an RL launch's memory plan is made for (`memory_plan.py`): the card's memory as torch
reports it, from this node's GPU, a `--gpu-memory` preset or a number, and which one was taken.

Why apart from the plan's formulas: what the card has is read from the machine and the command
line; what the run needs is worked out from the model and the recipe.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from rstar2_cli.hosts.gpu_visibility import local_gpu_memory

# Presets for --gpu-memory: what torch reports as the GPU's memory (`get_device_properties(0).total_memory`,
# the figure vLLM's gpu_memory_utilization is a fraction of), in GiB, rounded down to 0.1:
# * h100, H100 80GB: 81,559 MiB in nvidia-smi, 79.1-79.2 GiB to torch, on a lent H100 (torch 2.11 cu130).
# * h200, H200 141GB: 143,771 MiB in nvidia-smi, 150,109,880,320 B = 139.80 GiB to torch (total_memory and
#   mem_get_info alike), on a lent H200 (torch 2.11 cu130).
# * mi300x, MI300X 192GB: totalGlobalMem 205,822,885,888 B = 191.69 GiB (hipDeviceProp_t, which torch's
#   total_memory reads; rocm-smi's "VRAM Total Memory (B)" and torch.cuda.mem_get_info's total agree), as
#   published in MI300X device reports.
GPU_MEMORY_PRESETS = {"mi300x": 191.6, "h100": 79.1, "h200": 139.8}
DEFAULT_GPU = "mi300x"                # the paper's GPUs

class MemoryPlanError(ValueError):
    """An unusable memory option; the message is one line."""


def parse_gpu_memory(value: str | float) -> float:
    """GiB per GPU from a preset name (mi300x, h100, h200; any case) or a number."""
    text = str(value).strip().lower()
    if text in GPU_MEMORY_PRESETS:
        return GPU_MEMORY_PRESETS[text]
    try:
        gib = float(text)
    except ValueError:
        raise MemoryPlanError(f"--gpu-memory {value!r}: give GiB per GPU or one of "
                              f"{', '.join(GPU_MEMORY_PRESETS)}") from None
    if not gib > 0:
        raise MemoryPlanError(f"--gpu-memory {value!r}: must be > 0 GiB")
    return gib


class GpuMemory(NamedTuple):
    """The GPU a plan is made for: GiB as torch reports them, a name, and a one-line note when the
    plan did not take the card from this node's GPU or from --gpu-memory as given."""
    gib: float
    name: str                         # a preset, "custom" (a number given) or the visible device's name
    note: str | None


def resolve_gpu_memory(option: str | None, *, dry_run: bool = True) -> GpuMemory:
    """The GPU to plan for. A launch on a node with a GPU plans for that GPU (its total memory as
    torch reports it, rounded down to 0.1 GiB), since that is what its trainers get; a dry run plans
    for --gpu-memory (a preset or GiB) when given, else the visible GPU, else DEFAULT_GPU, saying so."""
    local = local_gpu_memory()
    here = None if local is None else GpuMemory(math.floor(local[0] * 10) / 10, local[1], None)
    if option is None or (here is not None and not dry_run):
        if here is not None:
            ignored = None if option is None else (f"memory: --gpu-memory {option} left aside: this launch runs "
                                                   f"on this node's GPU, {here.name} ({here.gib:g} GiB)")
            return here._replace(note=ignored)
        gib, presets = GPU_MEMORY_PRESETS[DEFAULT_GPU], "|".join(sorted(GPU_MEMORY_PRESETS))
        return GpuMemory(gib, DEFAULT_GPU, f"memory: no GPU is visible here and no --gpu-memory was given: planned "
                                           f"for an {DEFAULT_GPU.upper()} ({gib:g} GiB); plan for yours with "
                                           f"--gpu-memory {presets}|GiB")
    name = str(option).strip().lower()
    return GpuMemory(parse_gpu_memory(option), name if name in GPU_MEMORY_PRESETS else "custom", None)
