"""GPU smoke benchmark: tokens/s, MFU and peak memory of a training step on Qwen3 shapes, and the
trainer's sharded model loading.

Run it first on a new cluster node, before a multi-node RL run. Both shapes are meant to finish
within 5 minutes on one GPU; it has NOT been run yet (no GPU was at hand when it was written):

    python benchmarks/gpu/gpu_smoke.py                      # cuda:0: ~1.0B and Qwen3-1.7B shapes, 8K rows
    python benchmarks/gpu/gpu_smoke.py --shape qwen3-1.7b   # one shape
    python benchmarks/gpu/gpu_smoke.py --peak-tflops 1307.4 # device not in the peak table
    python benchmarks/gpu/gpu_smoke.py --tiny --device cpu  # wiring check on a laptop

Needs only torch + transformers and this source tree (no `pip install`): it puts the repo root
and benchmarks/ on sys.path. The baseline, measured in the same process, is a plain bf16 forward/backward +
AdamW step on the same packed micro-batches; the policy update is reported as a ratio to it.
FLOP convention and peak table: benchmarks/gpu/smoke_model.py. Sharded load: the model is
saved as a bf16 HF checkpoint and built again as the trainer builds it under torchrun
(rl/update/model_load.py: meta device, fully_shard, local shards from safetensors slices; a 1-rank
process group when not under torchrun); load time, GPU peak and host RSS growth are reported,
then the sharded model runs one forward and backward of the first packed micro-batch with the
trainer's mixed precision (its time and loss are reported; a missing gradient is an error).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

import torch  # noqa: E402

import smoke_model as sm  # noqa: E402
from harness import Stopwatch, write_json  # noqa: E402
from rstar2_cli.hosts.ports import master_store  # noqa: E402
from rstar2_cli.rl.ranks.dist import setup_distributed  # noqa: E402
from rstar2_cli.rl.update.model_load import DEFAULT_LOAD_METHOD, build_policy_model  # noqa: E402
from rstar2_cli.rl.update.policy import PolicyTrainer  # noqa: E402
from rstar2_cli.rollout.trajectory import Trajectory  # noqa: E402


def plain_step(model, optimizer, batches) -> None:
    """Baseline: one optimizer step over all micro-batches (gradient accumulation)."""
    for batch in batches:
        sm.packed_loss(model, batch).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def rollout_batch(lengths: list[int], vocab: int, seed: int = 0):
    """Trajectories of the given total lengths (a 256-token prompt, the rest response), with
    advantages of both signs: what one rank's shard of an RL step looks like."""
    gen = torch.Generator().manual_seed(seed)
    trajs, advs = [], []
    for i, n in enumerate(lengths):
        prompt = min(256, max(1, n // 4))
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        resp = n - prompt
        trajs.append(Trajectory(prompt_id=f"p{i // 2}", sample_index=i % 2, prompt_ids=ids[:prompt],
                                response_ids=ids[prompt:], loss_mask=[1] * resp, logprobs=[0.0] * resp))
        advs.append(1.0 if i % 2 == 0 else -1.0)
    return trajs, advs


# The recipe defaults the update uses, for a bare GPU node without pydantic (a dependency of the
# CLI, not of torch or transformers); tests/launch checks they equal rstar2_cli.config's defaults.
BARE_NODE_CONFIGS = {
    "model": {"path": "<in-memory>", "dtype": "auto", "gradient_checkpointing": False},
    "optim": {
        "lr": 1e-6,
        "warmup_steps": 0,
        "weight_decay": 0.01,
        "betas": (0.9, 0.999),
        "grad_clip": 1.0,
        "reset": False,
    },
    "loss": {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "tis": False,
        "tis_cap": 2.0,
        "dual_clip": None,
        "old_logprobs": "trainer",
    },
}


def policy_configs() -> tuple:
    """(model, optim, loss) settings for PolicyTrainer: the typed configs when importable, else
    plain namespaces with the same values."""
    try:
        from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig  # lazy: pydantic, not on a bare node
    except ImportError:
        from types import SimpleNamespace

        return tuple(SimpleNamespace(**BARE_NODE_CONFIGS[k]) for k in ("model", "optim", "loss"))
    return (ModelConfig(**BARE_NODE_CONFIGS["model"]), OptimConfig(**BARE_NODE_CONFIGS["optim"]),
            LossConfig(**BARE_NODE_CONFIGS["loss"]))


def measure_policy_update(model, lengths, max_len, vocab, steps, warmup, sync, flops, tokens, peak,
                          baseline_seconds) -> dict:
    """The trainer's own update (rstar2_cli/rl/update/policy.py: PolicyTrainer.update): fp32 master
    weights with bf16 compute, packing by token budget, Clip-Higher loss, AdamW, grad clip. Under
    torchrun it shards with FSDP2 (fully_shard per decoder layer); MFU is then per device."""
    model_cfg, optim_cfg, loss_cfg = policy_configs()
    policy = PolicyTrainer(model_cfg, optim_cfg, loss_cfg, micro_batch_tokens=max_len, model=model,
                           info=setup_distributed())
    batch, advantages = rollout_batch(lengths, vocab)
    seconds = measure(lambda: policy.update(batch, advantages), steps, warmup, sync)
    # the update also recomputes the old-policy logprobs (one extra forward): count it as 1/3 more
    update_flops = flops * 4 / 3
    return {
        "seconds_per_step": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "mfu": None if peak is None else round(sm.mfu(update_flops, seconds, peak), 4),
        "peak_memory_gib": sm.peak_memory_gib(),
        "ratio_vs_baseline": round(baseline_seconds / seconds, 3),
        "world_size": policy.info.world_size,
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_sharded_load(model, device, sync, batch) -> dict:
    """Save `model` as a bf16 checkpoint, time the trainer's sharded build of it, then run one
    forward and backward of `batch` through the sharded model with the trainer's precision
    (bf16 compute and fp32 gradient reduction on GPU, as rl/update/policy.py sets it)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    own_group = not dist.is_initialized()
    if own_group:   # the store binds its own port: no window for another process to take it
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=master_store(),
                                rank=0, world_size=1)
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    path = Path(tempfile.gettempdir()) / "rstar2_gpu_smoke_ckpt"
    if dist.get_rank() == 0:
        state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
        model.save_pretrained(path, state_dict=state)
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rss0 = _rss_bytes()
    with Stopwatch() as load:
        loaded = build_policy_model(str(path), sharded=True, device=device, method=DEFAULT_LOAD_METHOD,
                                    mp_policy=policy)
        sync()
    result = {"method": DEFAULT_LOAD_METHOD, "world_size": dist.get_world_size(), "load_s": round(load.seconds, 2),
              "gpu_peak_gib": sm.peak_memory_gib(), "host_rss_growth_gib": round((_rss_bytes() - rss0) / 2**30, 3),
              "local_params": sum(p.to_local().numel() for p in loaded.parameters())}
    loaded.train()
    step = Stopwatch()
    loss = sm.packed_loss(loaded, batch)
    loss.backward()
    loss = loss.detach()
    sync()
    missing = [name for name, p in loaded.named_parameters() if p.grad is None]
    if missing or not torch.isfinite(loss):
        raise RuntimeError(f"sharded forward/backward: loss {float(loss)}, no gradient for {missing[:3]}")
    result.update(forward_backward_s=round(step.elapsed(), 3), loss=round(float(loss), 4))
    del loaded, loss
    if own_group:
        dist.destroy_process_group()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return result


def measure(step, steps: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        step()
    sync()
    with Stopwatch() as sw:
        for _ in range(steps):
            step()
        sync()
    return sw.seconds / steps


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape (CPU wiring check)")
    ap.add_argument("--shape", nargs="+", choices=[k for k in sm.SHAPES if k != "tiny"], default=["1b", "qwen3-1.7b"],
                    help="model shape(s): 1b (~1.0B, Qwen3-1.7B widths, 14 layers), qwen3-1.7b (default: both)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-tokens", type=int, default=8192, help="tokens per packed micro-batch row")
    ap.add_argument("--sequences", type=int, default=16, help="rollouts packed per optimizer step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per device")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (sdpa, flash_attention_2)")
    ap.add_argument("--grad-checkpointing", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_smoke.json"))
    args = ap.parse_args(argv)
    results = [run_shape(args, name) for name in (["tiny"] if args.tiny else args.shape)]
    result = results[0] if len(results) == 1 else {"runs": results}
    write_json(args.out, result, indent=2)
    for r in results:
        _print_table(r)
    print(f"wrote {args.out}")
    return result


def run_shape(args, shape_name: str) -> dict:
    """Baseline step, the trainer's update and the sharded load for one model shape."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.empty_cache()    # the previous shape's model and optimizer are gone
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, shape = sm.build_smoke_model(args.tiny, device=device, dtype=dtype, attn_implementation=args.attn,
                                        shape=shape_name)
    model.train()
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    max_len = min(args.max_tokens, 512) if args.tiny else args.max_tokens
    lengths = sm.sample_rollout_lengths(args.sequences, max_len=max_len)
    if args.tiny:
        lengths = [max(2, n // 16) for n in lengths]
    rows = sm.pack_sequences(lengths, max_len)
    gen = torch.Generator().manual_seed(0)
    batches = [sm.packed_batch(r, shape.vocab, device, gen) for r in rows]
    tokens = sum(lengths)
    flops = sm.training_flops(shape, lengths)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sharded_load = measure_sharded_load(model, device, sync, batches[0])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    seconds = measure(lambda: plain_step(model, optimizer, batches), args.steps, args.warmup, sync)
    name, peak = sm.detect_peak_tflops(args.peak_tflops)
    baseline = {
        "seconds_per_step": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "mfu": None if peak is None else round(sm.mfu(flops, seconds, peak), 4),
        "peak_memory_gib": sm.peak_memory_gib(),
    }
    optimizer = None   # free the baseline's optimizer state before the policy trainer takes the model
    policy_update = measure_policy_update(model, lengths, max_len, shape.vocab, args.steps, args.warmup, sync,
                                          flops, tokens, peak, seconds)

    result = {
        "device": name, "peak_bf16_tflops": peak, "shape": "tiny" if args.tiny else shape_name,
        "params_total": shape.total_params(), "params_non_embedding": shape.non_embedding_params(),
        "micro_batches": len(rows), "tokens_per_step": tokens, "max_seq_len": max(lengths),
        "flops_per_step": flops, "attn_implementation": args.attn,
        "baseline_plain_step": baseline, "policy_update": policy_update, "sharded_load": sharded_load,
    }
    if peak is None:
        result["note"] = f"no peak for {name!r}: pass --peak-tflops to get MFU"
    return result


def _fmt_update(u: dict) -> str:
    mfu = "n/a" if u["mfu"] is None else f"{100 * u['mfu']:.1f} %"
    return (f"{u['tokens_per_s']:,.0f} tok/s, MFU {mfu}, {u['ratio_vs_baseline']:.2f}x baseline speed, "
            f"peak {u['peak_memory_gib']} GiB, world {u['world_size']}")


def _fmt_load(r: dict) -> str:
    return (f"{r['load_s']} s ({r['method']}, world {r['world_size']}), GPU peak {r['gpu_peak_gib']} GiB, "
            f"host RSS +{r['host_rss_growth_gib']} GiB; forward+backward {r['forward_backward_s']} s, "
            f"loss {r['loss']}")


def _print_table(result: dict) -> None:
    base = result["baseline_plain_step"]
    rows = [("device", result["device"]), ("model", f"{result['shape']} ({result['params_total']:,} params)"),
            ("tokens/step", f"{result['tokens_per_step']:,} in {result['micro_batches']} packed rows"),
            ("baseline s/step", base["seconds_per_step"]), ("baseline tokens/s", base["tokens_per_s"]),
            ("baseline MFU", base["mfu"]), ("peak memory GiB", base["peak_memory_gib"]),
            ("policy update (rl/update/policy.py)", _fmt_update(result["policy_update"])),
            ("sharded load (rl/update/model_load.py)", _fmt_load(result["sharded_load"]))]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # bare GPU box: plain text
        for k, v in rows:
            print(f"{k:>18}: {v}")
        return
    table = Table(title="gpu smoke")
    table.add_column("metric")
    table.add_column("value")
    for k, v in rows:
        table.add_row(k, str(v))
    Console().print(table)


if __name__ == "__main__":
    main()
