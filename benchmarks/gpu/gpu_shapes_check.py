"""The GPU-only weight-sync code paths, run as far as they go without CUDA, on a model's real shapes.

    python benchmarks/gpu/gpu_shapes_check.py --model qwen3-14b
    python benchmarks/gpu/gpu_shapes_check.py --model qwen3-1.7b qwen3-8b --replicas-per-node 4
    python benchmarks/gpu/gpu_shapes_check.py --model qwen3-14b --ipc-buffer-mb 1024   # vLLM's default: fails

The model (its real config, written below; no download) is built on the meta device twice: as the
trainer builds it (transformers, fp32, FSDP2 `fully_shard` per decoder layer and root over a
1-rank gloo process group, rl/model_load.shard_model) and as a vLLM engine builds it (vLLM's own
`Qwen3ForCausalLM` from a `VllmConfig`, TP 1). Nothing is allocated but the attention check's one CPU
mask (T x T bools, 0.27 GB at 16K tokens). One line per check:

  attention the micro-batch layout the trainer picks (models/attention.py): SDPA over padded buckets of a
           stage-2-like batch makes transformers' `create_causal_mask` build no mask (SDPA's causal
           kernel), where one packed row of the same trajectories would get a dense T x T mask; with
           flash-attn, packed rows for its varlen kernel
  fsdp     the wrapping (every decoder layer and the root are FSDP modules, every parameter a
           Shard(0) DTensor, names unchanged, a tied embedding still one parameter), and a meta
           forward of one decoder layer in bf16. FSDP2 refuses meta parameters at its lazy init
           (_fsdp_param_group._validate_no_meta_params), so that forward runs on the unsharded layer.
  names    the trainer's weight source (rollout/weight_sync/source.py: names, shapes, bf16, tied
           weights) loaded into vLLM's model through vLLM's own reload path, as the ipc and nccl
           engines load it (initialize_layerwise_reload, load_weights, finalize_layerwise_reload):
           every vLLM parameter is filled, no layer is partly filled, and what is not sent is a
           registered buffer (rotary cos/sin cache, attention scales), which vLLM's level-2 sleep
           keeps; and the reload leaves those buffers in place.
  sleep    (once) what vLLM's level-2 sleep keeps: CuMemBackend.suspend(2), run with a recording
           allocator, backs up neither the "weights" nor the "kv_cache" pool; Worker.sleep copies
           named_buffers() to host at level 2 and wake_up(["weights"]) copies them back.
  ipc      the buffer our code allocates (`packed_buffer_bytes`, or --ipc-buffer-mb) run through
           vLLM's `packed_ipc_producer` (its CUDA allocation and IPC export replaced by meta): it
           must take every tensor; and our size rule agrees with vLLM's at the largest tensor.
  nccl     one send (`nccl.send_to_replicas`) to --replicas-per-node replica groups: one pass over
           the source, each replica's group receives exactly the chunks vLLM's worker-side
           `packed_nccl_broadcast_consumer` expects (run on meta with recording groups); bytes
           all-gathered per rank per step before (one fp32 pass per replica) and after (one bf16 pass).

Exit status 1 if any check fails. What this cannot reach (CUDA allocation, IPC handles, NCCL
itself, TP > 1 shards) is benchmarks/gpu/gpu_rl_smoke.py's.
"""
from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import tempfile
import traceback
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recorders import CountingSource, RecordingClient, RecordingGroup  # noqa: E402
from rstar2_cli.models.attention import choose_attention  # noqa: E402
from rstar2_cli.rl.update.model_load import decoder_layers, shard_model  # noqa: E402
from rstar2_cli.rl.update.packing import micro_batches  # noqa: E402
from rstar2_cli.rollout.weight_sync.nccl import send_to_replicas  # noqa: E402
from rstar2_cli.rollout.weight_sync.source import (MiB, check_packed_buffer, engine_named_parameters,
                                                   largest_tensor, packed_buffer_bytes, policy_weight_source)  # noqa: E402

GiB = 1 << 30
QWEN3 = {   # the released configs' shapes (config.json of Qwen/Qwen3-14B, -8B, -1.7B)
    "qwen3-14b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                      head_dim=128, intermediate_size=17408, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True),
}
COMMON = dict(rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960, hidden_act="silu",
              attention_bias=False, architectures=["Qwen3ForCausalLM"])


def qwen3_config(name: str):
    from transformers import Qwen3Config

    return Qwen3Config(**QWEN3[name], **COMMON)


def trainer_model(name: str):
    """The policy as rl/update/model_load.py builds it before sharding: fp32, sdpa, on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(qwen3_config(name), dtype=torch.float32, attn_implementation="sdpa")


def init_one_rank_group() -> None:
    """A 1-rank gloo process group, then vLLM's TP/PP groups on top of it (vLLM reuses it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def vllm_model(name: str, work: Path):
    """vLLM's Qwen3ForCausalLM for this config on the meta device, and its VllmConfig."""
    import torch
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    folder = work / name
    qwen3_config(name).save_pretrained(folder)
    config = VllmConfig(model_config=ModelConfig(model=str(folder), tokenizer=str(folder), skip_tokenizer_init=True,
                                                 dtype="bfloat16", max_model_len=4096))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        with torch.device("meta"):
            return Qwen3ForCausalLM(vllm_config=config), config


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def check_fsdp(model) -> str:
    """Shard `model` in place as the trainer does; raise AssertionError on a wrapping defect."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor, Shard

    cfg = model.config
    layer = decoder_layers(model)[0]
    x = torch.empty(1, 16, cfg.hidden_size, device="meta", dtype=torch.bfloat16)
    pos = torch.arange(16, device="meta")[None]
    out = layer.to(torch.bfloat16)(x, position_embeddings=model.model.rotary_emb(x, pos), attention_mask=None,
                                   position_ids=pos)
    out = out[0] if isinstance(out, tuple) else out
    assert tuple(out.shape) == (1, 16, cfg.hidden_size), f"layer forward gave {tuple(out.shape)}"
    layer.float()
    names = [n for n, _ in model.named_parameters()]
    # the trainer's policy on a sharded run (rl/update/policy.py): bf16 compute, fp32 gradient reduction
    shard_model(model, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    wrapped = [m for m in [*decoder_layers(model), model] if isinstance(m, FSDPModule)]
    assert len(wrapped) == cfg.num_hidden_layers + 1, f"{len(wrapped)} FSDP modules"
    assert [n for n, _ in model.named_parameters()] == names, "fully_shard renamed parameters"
    bad = [n for n, p in model.named_parameters() if not (isinstance(p, DTensor) and p.placements == (Shard(0),))]
    assert not bad, f"not Shard(0) DTensors: {bad[:3]}"
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "fully_shard untied the embedding"
    return (f"{len(wrapped)} FSDP modules ({cfg.num_hidden_layers} layers + root), {len(names)} Shard(0) params, "
            f"{'tied embedding kept' if cfg.tie_word_embeddings else 'untied lm_head'}, "
            f"meta forward of layer 0 -> {tuple(out.shape)} (unsharded: FSDP2 refuses meta params)")


def check_attention(model) -> str:
    """The trainer's attention layout on this shape (models/attention.py, rl/update/packing.py): on a GPU with
    flash-attn, packed rows for its varlen kernel; without it, SDPA over padded buckets, for which
    transformers must build no mask at all (SDPA's causal kernel) where one packed row of the same
    trajectories gets a dense [1, 1, T, T] mask. Checked with the model's own `create_causal_mask`."""
    import random

    import torch
    from transformers.masking_utils import create_causal_mask

    flash = choose_attention("auto", "cuda", torch.bfloat16, flash_available=True)
    plain = choose_attention("auto", "cuda", torch.bfloat16, flash_available=False)
    assert (flash.implementation, flash.layout) == ("flash_attention_2", "packed"), flash
    assert (plain.implementation, plain.layout) == ("sdpa", "padded"), plain
    cfg = model.config
    rng = random.Random(0)     # a stage-2-like batch: 12K responses at most, 16K-token micro-batches
    seqs = [([1] * rng.randint(200, 600), [1] * rng.randint(100, 12_000)) for _ in range(24)]

    def mask_of(row):   # the mask code reads the embeddings' shape, dtype and device only, and the
        b, t = row.input_ids.shape   # position ids' values (which a meta tensor cannot give)
        embeds = torch.empty(b, t, 1, dtype=torch.bfloat16)
        return create_causal_mask(config=cfg, inputs_embeds=embeds, attention_mask=None, past_key_values=None,
                                  position_ids=row.position_ids)

    padded = micro_batches(seqs, 16_384, plain.layout)
    masks = [mask_of(row) for row in padded]
    shapes = [None if m is None else tuple(m.shape) for m in masks][:3]
    assert all(m is None for m in masks), f"padded rows built masks: {shapes}"
    packed = micro_batches(seqs, 16_384, "packed")[0]
    dense = mask_of(packed)
    t = packed.input_ids.shape[1]
    assert dense is not None and tuple(dense.shape)[-2:] == (t, t), f"packed row under sdpa: {dense}"
    return (f"{cfg._attn_implementation}: {len(padded)} padded buckets, no mask (causal kernel); one packed row of "
            f"{t} tokens would get a {tuple(dense.shape)} mask; GPU with flash-attn: flash_attention_2 over "
            "packed rows")


def check_names(source, vmodel, vconfig) -> str:
    """Load `source` into vLLM's meta model through vLLM's reload path; raise on a gap."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.model_loader.reload.layerwise import (finalize_layerwise_reload, get_layerwise_info,
                                                                    initialize_layerwise_reload,
                                                                    record_metadata_for_reloading)

    meta = source.metadata()
    params = dict(vmodel.named_parameters())
    buffers = dict(vmodel.named_buffers())
    assert all(m.dtype == torch.bfloat16 for m in meta), "source not in the engine dtype"
    with set_current_vllm_config(vconfig):
        with torch.device("meta"):      # the device vLLM materializes reloaded layers on: nothing is allocated
            record_metadata_for_reloading(vmodel)
        initialize_layerwise_reload(vmodel)
        try:
            loaded = vmodel.load_weights(iter(source))
        except AssertionError as e:       # vLLM's weight loaders assert each tensor's shape
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise AssertionError(f"vLLM's load_weights refused a tensor: {e!r} in {where.name} "
                                 f"({Path(where.filename).name}:{where.lineno})") from None
        canonical = {id(p): n for n, p in params.items()}     # a tied parameter under its first name
        partial = []
        for prefix, module in vmodel.named_modules():
            info = get_layerwise_info(module)      # still loadable = not every element was received
            if not info.can_load() or not info.load_numel_total or is_deferred_attention_layer(module):
                continue
            own = list((info.kernel_tensors or ({}, {}))[0].values())   # the engine's tensors, kept aside
            filled_elsewhere = all(canonical.get(id(p)) in loaded for p in own)   # buffers only, or tied
            if info.load_numel or not filled_elsewhere:
                partial.append(f"{prefix} {info.load_numel}/{info.load_numel_total}")
        finalize_layerwise_reload(vmodel, vconfig.model_config)
    missing, extra = sorted(set(params) - loaded), sorted(loaded - set(params))
    assert not missing and not extra, f"vLLM parameters not filled: {missing[:4]}; unknown: {extra[:4]}"
    assert not partial, f"layers only partly filled (undefined after a level-2 sleep): {partial[:4]}"
    swapped = [n for n, b in vmodel.named_buffers() if buffers.get(n) is not b]
    assert not swapped, f"buffers replaced by the reload (not the ones the sleep kept): {swapped[:3]}"
    tied = vmodel.config.tie_word_embeddings
    sent = [m.name for m in meta]
    assert ("lm_head.weight" in sent) != tied, "lm_head.weight sent for a tied model, or missing for an untied one"
    if tied:
        assert vmodel.lm_head.weight is vmodel.model.embed_tokens.weight
    return (f"{len(sent)} trainer tensors fill all {len(params)} vLLM parameters"
            f"{' (lm_head tied to embed_tokens, sent once)' if tied else ''}; not sent: {len(buffers)} buffers "
            f"({', '.join(sorted({n.rsplit('.', 1)[-1] for n in buffers}))}), kept by vLLM's level-2 sleep")


def check_level2_sleep() -> str:
    """What vLLM's level-2 sleep discards and keeps: its CuMem backend (run with a recording
    allocator) backs up neither weights nor KV cache, and its GPU worker saves every registered
    buffer to host at level 2 and copies it back when the weights wake."""
    import inspect

    from vllm.device_allocator.sleep_mode_backend import CuMemBackend
    from vllm.v1.worker.gpu_worker import Worker

    kept: list[tuple[str, ...]] = []
    allocator = SimpleNamespace(sleep=lambda offload_tags: kept.append(tuple(offload_tags)))
    with mock.patch("vllm.device_allocator.get_mem_allocator_instance", lambda: allocator):
        CuMemBackend().suspend(2)
    assert kept and not {"weights", "kv_cache"} & set(kept[0]), f"level 2 backs up {kept}"
    sleep, wake = inspect.getsource(Worker.sleep), inspect.getsource(Worker.wake_up)
    assert "level == 2" in sleep and "named_buffers()" in sleep and "_sleep_saved_buffers" in wake, \
        "vLLM's Worker.sleep/wake_up no longer keep the model's buffers at level 2"
    return (f"CuMemBackend.suspend(2) backs up only {', '.join(kept[0])} (weights, kv_cache discarded); "
            "Worker.sleep(2) keeps named_buffers() on host, wake_up(['weights']) restores them")


@contextlib.contextmanager
def packed_tensor_on_meta():
    """vLLM's packed_tensor module with its CUDA calls on the meta device: buffers allocated on
    meta, a stub IPC export and no-op streams. Its packing and size checks run unchanged."""
    import torch
    from vllm.distributed.weight_transfer import packed_tensor

    class MetaTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, device=None, **kwargs):
            return torch.empty(*args, device="meta", **kwargs)

        cuda = SimpleNamespace(current_stream=lambda: SimpleNamespace(synchronize=lambda: None),
                               stream=lambda s: contextlib.nullcontext())

    streams = lambda device, n: tuple(SimpleNamespace(synchronize=lambda: None) for _ in range(n))  # noqa: E731
    with mock.patch.object(packed_tensor, "torch", MetaTorch()), \
            mock.patch.object(packed_tensor, "reduce_tensor", lambda t: (None, ("meta-ipc-args",))), \
            mock.patch.object(packed_tensor, "_get_streams", streams), \
            mock.patch.object(torch.accelerator, "current_device_index", lambda: 0):
        yield packed_tensor


def vllm_ipc_chunks(source, buffer_bytes: int) -> list[int]:
    """The chunk sizes vLLM's `packed_ipc_producer` cuts from `source` (ValueError if it refuses)."""
    with packed_tensor_on_meta() as packed:
        return [sum(c.tensor_sizes) for c in packed.packed_ipc_producer(
            iter(source), "meta-gpu", post_iter_func=lambda item: item[1], buffer_size_bytes=buffer_bytes)]


def check_ipc(source, override_mb: int | None) -> str:
    meta = source.metadata()
    name, largest = largest_tensor(meta)
    for size in (largest, largest - 1):        # our rule and vLLM's agree at the boundary
        try:
            vllm_ipc_chunks(source, size)
            vllm_ok = True
        except ValueError:
            vllm_ok = False
        try:
            check_packed_buffer(meta, size)
            ours_ok = True
        except ValueError:
            ours_ok = False
        assert vllm_ok == ours_ok == (size >= largest), f"size rule disagrees with vLLM at {size} bytes"
    ours = override_mb * MiB if override_mb is not None else packed_buffer_bytes(meta)
    try:
        chunks = vllm_ipc_chunks(source, ours)
    except ValueError as e:
        raise AssertionError(f"buffer {ours // MiB} MiB: vLLM's packed_ipc_producer refuses it: {e}") from None
    packed_buffer_bytes(meta, override_mb)       # what the pusher checks at start-up
    return (f"buffer {ours // MiB} MiB holds the largest tensor {name} ({gib(largest)}); vLLM's producer cut "
            f"{len(chunks)} chunks, largest {gib(max(chunks))}")


def worker_chunks(update_info: dict, buffer_bytes: int) -> list[int]:
    """The chunk sizes a vLLM worker receives for `update_info` (vLLM's consumer, on meta)."""
    import torch

    group = RecordingGroup()
    pairs = ((n, (s, getattr(torch, d))) for n, d, s in zip(update_info["names"], update_info["dtype_names"],
                                                              update_info["shapes"]))
    with packed_tensor_on_meta() as packed:
        packed.packed_nccl_broadcast_consumer(pairs, group, 0, post_unpack_func=lambda named: None,
                                              buffer_size_bytes=buffer_bytes, device="meta")
    return group.sizes


def check_nccl(source, model, replicas: int) -> str:
    counting, client = CountingSource(source), RecordingClient()
    groups = [RecordingGroup() for _ in range(replicas)]
    buffer = packed_buffer_bytes(source.metadata())
    chunks = send_to_replicas(counting, groups, client, buffer)
    assert counting.passes == 1, f"{counting.passes} passes over the source"
    assert client.calls == ["start", "update", "finish"], client.calls
    expected = worker_chunks(client.update_info, buffer)
    assert all(g.sizes == expected for g in groups), "a replica's chunks differ from what its workers receive"
    fp32 = sum(p.numel() * 4 for _, p in engine_named_parameters(model))
    before, after = replicas * fp32, counting.bytes
    return (f"{chunks} chunks, each to {replicas} replica groups = what vLLM's workers receive; all-gathered per "
            f"rank per step: before {gib(before)} ({replicas} fp32 passes), after {gib(after)} (1 bf16 pass, "
            f"{before / after:.0f}x less); host broadcasts {gib(sum(groups[0].sizes) * replicas)}")


def run_model(name: str, work: Path, args) -> list[tuple[str, bool, str]]:
    import torch

    results = []

    def check(label, fn, *a):
        try:
            results.append((label, True, fn(*a)))
        except (AssertionError, ValueError, RuntimeError) as e:
            results.append((label, False, (str(e).splitlines() or [type(e).__name__])[0]))

    model = trainer_model(name)
    check("attention", check_attention, model)
    check("fsdp", check_fsdp, model)
    source = policy_weight_source(model, torch.bfloat16)
    vmodel, vconfig = vllm_model(name, work)
    check("names", check_names, source, vmodel, vconfig)
    check("ipc", check_ipc, source, args.ipc_buffer_mb)
    check("nccl", check_nccl, source, model, args.replicas_per_node)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", required=True, choices=sorted(QWEN3))
    ap.add_argument("--ipc-buffer-mb", type=int, default=None,
                    help="as engine.ipc_buffer_mb (default: sized from the model; 1024 is vLLM's default)")
    ap.add_argument("--replicas-per-node", type=int, default=4, help="nccl: replica groups a host sends to")
    args = ap.parse_args(argv)
    init_one_rank_group()
    failed = 0
    try:
        line = ("ok  ", check_level2_sleep())
    except AssertionError as e:
        line, failed = ("FAIL", str(e)), 1
    print(f"{line[0]} vllm sleep: {line[1]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model:
            for label, ok, detail in run_model(name, Path(tmp), args):
                failed += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} {label}: {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
