"""Build the policy model, sharded under torchrun, without a full fp32 copy on every rank.

Why: `from_pretrained` on every rank, then `fully_shard`, makes each rank hold the whole model in
fp32 first: 56 GB of host RAM per rank for a 14B model, 448 GB on an 8-GPU node. As in torchtune,
the sharded path builds the model on the meta device, applies FSDP2 `fully_shard` (per decoder
layer, then the root), materialises only this rank's shards (`to_empty`) and fills them from the
checkpoint's safetensors. Two ways to fill them (`LOAD_METHODS`):

  slices     every rank reads only its own rows of each tensor (safetensors `get_slice` on the
             memory-mapped file, a shared file system in multi-node runs); nothing is sent;
  broadcast  rank 0 reads the full checkpoint and `set_model_state_dict(full_state_dict=True,
             broadcast_from_rank0=True)` sends each tensor in turn; ranks keep their shard.

`benchmarks/timing/bench_load_memory.py` measures both against today's `from_pretrained` path
("full"); `slices` is the default (see docs/scale-out.md for the figures). A bf16 checkpoint
fills fp32 master weights (`copy_` casts); tied embeddings are filled once (the tied parameter is
one tensor, and FSDP2 keeps it one). Non-persistent buffers (rotary `inv_freq`) are not in the
checkpoint: they are recomputed by the model's own `_init_weights` after `to_empty`.
"""
from __future__ import annotations

import contextlib
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

LOAD_METHODS = ("slices", "broadcast", "full")
DEFAULT_LOAD_METHOD = "slices"


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no .model.layers to shard with FSDP2")
    return layers


def shard_model(model, mp_policy=None) -> None:
    """FSDP2: `fully_shard` each decoder layer, then the root (embeddings, norm, lm_head).

    `mp_policy` None means torch's own default, `MixedPrecisionPolicy()` (compute in the
    parameters' dtype). It is never handed on as None: `fully_shard` stores whatever it gets and
    its pre-forward hook reads `mp_policy.cast_forward_inputs`, so None would fail the first
    forward with an AttributeError (torch/distributed/fsdp/_fully_shard/_fsdp_state.py)."""
    policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy
    if not isinstance(policy, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy: expected a torch.distributed.fsdp.MixedPrecisionPolicy, got {policy!r}")
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def _prepare(model, gradient_checkpointing: bool):
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def place_model(model, *, sharded: bool, device: torch.device, mp_policy=None, gradient_checkpointing: bool = False,
                attn_implementation: str | None = None):
    """A materialised model (e.g. built by a test) as fp32 on `device`, FSDP2-sharded when `sharded`
    (`mp_policy` None: fp32 compute, see `shard_model`), running `attn_implementation` if given."""
    if attn_implementation is not None and model.config._attn_implementation != attn_implementation:
        model.set_attn_implementation(attn_implementation)
    model = _prepare(model.float(), gradient_checkpointing)
    if sharded:
        shard_model(model, mp_policy)
    return model.to(device)


def build_policy_model(path: str, *, sharded: bool, device: torch.device, mp_policy=None,
                       gradient_checkpointing: bool = False, method: str = DEFAULT_LOAD_METHOD,
                       attn_implementation: str = "sdpa"):
    """The fp32 policy model on `device`, FSDP2-sharded when `sharded` (a process group exists).

    `method` (sharded only): "slices" or "broadcast" (meta device, local shards only) or "full"
    (every rank loads the whole model with `from_pretrained`, then shards it: the baseline
    of benchmarks/timing/bench_load_memory.py). Unsharded runs always use `from_pretrained`.
    `mp_policy` None: fp32 compute (see `shard_model`); `attn_implementation` as models/attention.py chose."""
    if method not in LOAD_METHODS:
        raise ValueError(f"load method {method!r}: expected one of {', '.join(LOAD_METHODS)}")
    if not sharded or method == "full":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
        return place_model(model, sharded=sharded, device=device, mp_policy=mp_policy,
                           gradient_checkpointing=gradient_checkpointing)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    with contextlib.suppress(OSError):   # no generation_config.json: keep the one from config.json
        model.generation_config = GenerationConfig.from_pretrained(path)
    _prepare(model, gradient_checkpointing)
    shard_model(model, mp_policy)
    model.to_empty(device=device)
    _init_non_persistent_buffers(model)
    if method == "slices":
        fill_from_safetensors(model, Path(path))
    else:
        broadcast_from_rank0(model, Path(path))
    return model


@torch.no_grad()
def _init_non_persistent_buffers(model) -> None:
    """Recompute buffers that are not in a checkpoint (rotary inv_freq) after `to_empty`,
    through the model's own initialiser for the modules that own them."""
    for module in model.modules():
        if any(name in module._non_persistent_buffers_set for name, _ in module.named_buffers(recurse=False)):
            model._init_weights(module)


def tied_sources(model) -> dict[str, str]:
    """{tied parameter name: the checkpoint key it is stored under}, e.g. lm_head -> embed_tokens."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    if not tied and getattr(model.config, "tie_word_embeddings", False):
        tied = {"lm_head.weight": "model.embed_tokens.weight"}
    return dict(tied)


def checkpoint_files(hf_dir: Path) -> list[Path]:
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [hf_dir / n for n in names]
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no .safetensors weights")
    return files


def _local_slices(value: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(this rank's local tensor, the slices of the full tensor it holds)."""
    if not isinstance(value, DTensor):
        return value, tuple(slice(0, n) for n in value.shape)

    shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    return value.to_local(), tuple(slice(o, o + n) for n, o in zip(shape, offset))


@torch.no_grad()
def fill_from_safetensors(model, hf_dir: Path) -> None:
    """Copy this rank's part of every parameter and persistent buffer from the checkpoint in
    `hf_dir` (sharded or not), casting to the model's dtype; reads nothing else."""
    hf_dir = Path(hf_dir)
    tied = tied_sources(model)
    with ExitStack() as stack:
        where: dict[str, Any] = {}
        for f in checkpoint_files(hf_dir):
            handle = stack.enter_context(safe_open(str(f), framework="pt"))
            where.update({k: handle for k in handle.keys()})
        for name, value in model.state_dict().items():
            key = name if name in where else tied.get(name)
            if key not in where:
                raise ValueError(f"{hf_dir}: checkpoint has no tensor {name!r}")
            local, slices = _local_slices(value)
            if local.numel() == 0:
                continue
            local.copy_(where[key].get_slice(key)[slices])


def read_full_state(hf_dir: Path, model) -> dict[str, torch.Tensor]:
    """The checkpoint as one dict in its own dtype, tied names filled in (rank 0 of `broadcast`)."""
    state: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(hf_dir):
        state.update(load_file(str(f)))
    for name, source in tied_sources(model).items():
        if name not in state and source in state:
            state[name] = state[source]
    return state


def broadcast_from_rank0(model, hf_dir: Path) -> None:
    """Rank 0 reads the checkpoint; torch.distributed.checkpoint sends each tensor to all ranks,
    which keep their shard (cast to fp32 on copy)."""
    state = read_full_state(Path(hf_dir), model) if dist.get_rank() == 0 else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
