"""What the trainer sends to vLLM engines: the policy's parameters under their HF checkpoint
names, full shapes, in the engine's dtype.

vLLM's Qwen3 loader (`Qwen3ForCausalLM.load_weights` -> `AutoWeightsLoader`, with
`Qwen2Model.hf_to_vllm_mapper` stacking q/k/v into `qkv_proj` and gate/up into `gate_up_proj`)
takes exactly these names. With `tie_word_embeddings` its `lm_head.weight` is the embedding's
parameter and the loader skips the `lm_head.weight` name (`_get_tied_embedding_params`), so a
tied model is sent once, as `model.embed_tokens.weight`. `benchmarks/gpu/gpu_shapes_check.py` loads
this source into vLLM's own Qwen3 model built on the meta device and checks that it fills every
parameter.
"""
from __future__ import annotations

import math
from typing import Any

import torch

TIED_LM_HEAD = "lm_head.weight"


def engine_named_parameters(model: "torch.nn.Module") -> list[tuple[str, "torch.nn.Parameter"]]:
    """The parameters an engine receives, in order: every parameter once (a tied one under the
    first name `named_parameters` gives it), without `lm_head.weight` when the config ties it to
    the embedding (vLLM loads it through the embedding)."""
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    return [(n, p) for n, p in model.named_parameters() if not (tied and n == TIED_LM_HEAD)]


def tensor_bytes(shape: tuple[int, ...], dtype: "torch.dtype") -> int:
    return math.prod(shape) * dtype.itemsize


def largest_tensor(meta: list[Any]) -> tuple[str, int]:
    """(name, bytes) of the largest tensor among vLLM `ParamMeta`s (name, dtype, shape)."""
    best = max(meta, key=lambda m: tensor_bytes(m.shape, m.dtype))
    return best.name, tensor_bytes(best.shape, best.dtype)


MiB = 1 << 20
PACKED_BUFFER_ALIGN_BYTES = 64 * MiB


def check_packed_buffer(meta: list[Any], buffer_bytes: int, setting: str = "engine.ipc_buffer_mb") -> None:
    """Raise (one line, naming `setting`) unless a packed buffer of `buffer_bytes` holds the
    largest tensor: vLLM's `packed_ipc_producer` raises ValueError for any tensor larger than
    its buffer (vllm/distributed/weight_transfer/packed_tensor.py), after the engines were told
    to start the update."""
    name, largest = largest_tensor(meta)
    if largest > buffer_bytes:
        raise ValueError(f"{setting}={buffer_bytes / MiB:g}: a packed buffer of {buffer_bytes} bytes cannot hold "
                         f"{name} ({largest} bytes, vLLM refuses a tensor larger than its buffer); set at least "
                         f"{-(-largest // MiB)} or leave it unset (sized from the model)")


def packed_buffer_bytes(meta: list[Any], override_mb: int | None = None) -> int:
    """The packed weight-transfer buffer for a model: `override_mb` MiB when set (checked by
    `check_packed_buffer`), else vLLM's default (1 GiB) or, for a larger tensor (Qwen3-14B's
    embedding and lm_head, 1.45 GiB each in bf16), that tensor rounded up to 64 MiB."""
    # lazy: vLLM: imported only where it runs
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES

    if override_mb is not None:
        if override_mb < 1:
            raise ValueError(f"engine.ipc_buffer_mb={override_mb}: must be >= 1 (or unset: sized from the model)")
        check_packed_buffer(meta, override_mb * MiB)
        return override_mb * MiB
    _, largest = largest_tensor(meta)
    return max(DEFAULT_PACKED_BUFFER_SIZE_BYTES, -(-largest // PACKED_BUFFER_ALIGN_BYTES) * PACKED_BUFFER_ALIGN_BYTES)


def policy_weight_source(model: "torch.nn.Module", dtype: "torch.dtype"):
    """A vLLM `WeightSource` over the (FSDP2) policy (`engine_named_parameters`), sent in the
    engine's dtype. Iterating casts this rank's shard to `dtype` first, then all-gathers it
    (`full_tensor`, a collective: every rank iterates in the same order), so a bf16 engine moves
    half the bytes of the fp32 master weights; a plain (unsharded) parameter is only cast."""
    # lazy: vLLM: imported only where it runs
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    class PolicyWeightSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, dtype, tuple(p.shape)) for name, p in engine_named_parameters(model)]

        def __iter__(self):
            with torch.no_grad():
                for name, p in engine_named_parameters(model):
                    yield name, materialize_full_tensor(p.detach().to(dtype))

    return PolicyWeightSource()
