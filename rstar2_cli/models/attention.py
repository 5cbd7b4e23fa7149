"""Which attention kernel the policy model runs, and the micro-batch layout that goes with it.

Why together: a layout is only free of cross-trajectory work with the right kernel.
`flash_attention_2` takes one packed `[1, T]` row as variable-length sequences (the policy passes
each row's `cu_seq_lens` and max length, computed on the host, so transformers neither derives them
from `position_ids` nor waits on the device; no mask is built), so it gets the `packed` layout.
SDPA has no variable-length entry point: a packed row makes transformers build a dense
`[1, 1, T, T]` block-diagonal mask, and SDPA then computes all T^2 blocks and cannot use its
flash backend on GPU. SDPA therefore always gets length-bucketed `padded` rows with no mask
(rl/update/packing.py). flex_attention was measured too and is not offered: torch 2.13 has no
flex_attention backward on CPU ("FlexAttention does not support backward on CPU"), and on GPU
flash-attn's variable-length kernel does the same work without compiling a block mask.

`auto`: `flash_attention_2` when the device is CUDA or ROCm (torch reports both as "cuda"), the
flash-attn package is importable there (transformers' `is_flash_attn_2_available`) and the
compute dtype is bf16/fp16 (the kernel has no fp32 path); otherwise `sdpa`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import is_flash_attn_2_available

ATTN_IMPLEMENTATIONS = ("auto", "flash_attention_2", "sdpa")
LAYOUT_OF = {"flash_attention_2": "packed", "sdpa": "padded"}


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str     # transformers attn_implementation
    layout: str             # rl/update/packing.py LAYOUTS
    reason: str             # one line, for the run log

    @property
    def takes_varlen_kwargs(self) -> bool:
        """Whether each packed row's forward gets its `cu_seq_lens` and max lengths
        (`PackedRow.varlen_kwargs`): only flash-attn reads them; SDPA and eager run as they are."""
        return self.implementation == "flash_attention_2" and self.layout == "packed"


def choose_attention(requested: str, device_type: str, dtype: torch.dtype, flash_available: bool) -> AttentionChoice:
    """The kernel and layout for `requested` (one of ATTN_IMPLEMENTATIONS); raises on a kernel
    that cannot run here, naming why. Pure: the caller says whether flash-attn is importable."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"train.attn_implementation {requested!r}: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    half = dtype in (torch.bfloat16, torch.float16)
    flash_ok = device_type == "cuda" and flash_available and half
    if requested == "flash_attention_2" and not flash_ok:
        why = ("needs a CUDA/ROCm device" if device_type != "cuda" else
               "needs the flash-attn package (pip install flash-attn)" if not flash_available else
               f"has no {dtype} kernel: set model.dtype to bfloat16 or auto")
        raise ValueError(f"train.attn_implementation 'flash_attention_2': {why}")
    if requested == "flash_attention_2" or (requested == "auto" and flash_ok):
        return AttentionChoice("flash_attention_2", "packed",
                               "flash-attn varlen over packed rows (cu_seqlens from position_ids, no mask)")
    why = (
        "requested"
        if requested == "sdpa"
        else "no CUDA/ROCm device"
        if device_type != "cuda"
        else "flash-attn not importable"
        if not flash_available
        else f"compute dtype {dtype} (flash-attn needs bf16/fp16)"
    )
    return AttentionChoice("sdpa", "padded", f"sdpa ({why}) over length-bucketed padded rows, causal kernel, no mask")


def flash_attention_available() -> bool:
    """Whether transformers can run flash_attention_2 here (the package imports, on CUDA or ROCm)."""
    return bool(is_flash_attn_2_available())


def resolve_attention(requested: str, device: torch.device, dtype: torch.dtype) -> AttentionChoice:
    """`choose_attention` for this process's device and the installed packages."""
    flash = device.type == "cuda" and flash_attention_available()
    return choose_attention(requested, device.type, dtype, flash)
