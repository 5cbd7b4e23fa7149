"""Checkpoint save and load: time and peak host RSS per rank, sharded (DCP) against gather-to-rank-0.

Target: rank 0's peak RSS during a save at 4 ranks <= 0.5x the gather-to-rank-0 path's.
Builds a random Qwen3-shaped bf16 checkpoint once (cached in --work; the shape below: Qwen3-1.7B's
widths, 2 decoder layers, so that 4 ranks and the baseline's full gather fit in 23 GiB of CPU RAM), then for
each (ranks, method) launches `torchrun --nproc-per-node R` on this file in worker mode. Each rank
builds the policy exactly as the trainer does (`PolicyTrainer`: meta device, FSDP2 `fully_shard`
per layer and root, its own slices read), gives AdamW state with one optimizer step on random
gradients, then times `save` and `load` (barrier to barrier) while a thread samples its resident
set (/proc/self/statm, every 5 ms; memory-mapped file pages it touched count too). Methods:
  sharded   rl/update/checkpoint.py: DCP, every rank writes its shards (weights through
            HuggingFaceStorageWriter, consolidated on rank 0 one tensor at a time)
  gather    the previous path, kept here as the baseline: rank 0 gathers the full weights and
            the full AdamW state (`get_*_state_dict(full_state_dict=True, cpu_offload=True)`)
            and writes them alone (`save_pretrained` + `torch.save`); load: sliced weights,
            `torch.load(mmap=True)` of the full AdamW state on every rank.

    flock /tmp/rstar2-cpu.lock python benchmarks/timing/bench_checkpoint.py --ranks 2 4 --json ckpt.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402

GIB = 1024**3
SHAPE = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
             tie_word_embeddings=True)      # Qwen3-1.7B's widths and tied embeddings, 2 of its 28 layers
METHODS = ("sharded", "gather")


class RssPeak:
    """The largest resident set of this process while the block runs (sampled)."""

    def __init__(self, every_s: float = 0.005):
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def now(self) -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * self._page

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.every_s)

    def __enter__(self):
        self.peak = self.now()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


# ------------------------------------------------------------------ the baseline (previous code)

def gather_save(target: Path, policy, step: int) -> None:
    import shutil

    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from rstar2_cli.rl.ranks import dist as rl_dist  # lazy: torchrun's ranks import it; the launcher has no torch
    # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.rl.update.checkpoint import rng_state

    weights = dict(policy.full_state_dict())
    optim = get_optimizer_state_dict(policy.model, policy.optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=policy.sharded))
    if policy.info.is_main:
        tmp = target.with_name(f".tmp_{target.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        torch.save(optim, tmp / "optimizer.pt")
        torch.save({"step": step, "scheduler": policy.scheduler.state_dict(), "rng": rng_state()},
                   tmp / "trainer_state.pt")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        (target.parent / "latest").write_text(target.name + "\n")
    rl_dist.barrier()


def gather_load(step_dir: Path, policy) -> None:
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.rl.update.model_load import fill_from_safetensors

    fill_from_safetensors(policy.model, step_dir)
    state = torch.load(step_dir / "trainer_state.pt", weights_only=False)
    optim = torch.load(step_dir / "optimizer.pt", weights_only=False, mmap=True)
    set_optimizer_state_dict(policy.model, policy.optimizer, optim_state_dict=optim,
                             options=StateDictOptions(full_state_dict=True))
    policy.scheduler.load_state_dict(state["scheduler"])


# ------------------------------------------------------------------ worker (one rank)

def worker(model_dir: str, out_dir: str, method: str) -> None:
    import torch

    # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
    from rstar2_cli.rl.update import checkpoint  # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.rl.ranks import dist as rl_dist  # lazy: torchrun's ranks import it; the launcher has no torch
    # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.rl.update.policy import PolicyTrainer

    info = rl_dist.setup_distributed()
    policy = PolicyTrainer(ModelConfig(path=model_dir, gradient_checkpointing=False), OptimConfig(lr=1e-5),
                           LossConfig(), micro_batch_tokens=1024, info=info)
    torch.manual_seed(info.rank)
    for p in policy.model.parameters():          # AdamW state as after one real step
        p.grad = torch.zeros_like(p)
        (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).normal_()
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    out = Path(out_dir)
    target = out / "run" / "step_000001"
    rl_dist.barrier()
    rss = RssPeak()
    before_save = rss.now()
    with Stopwatch() as save, rss:
        if method == "sharded":
            checkpoint.save_checkpoint(target, policy, step=1)
        else:
            gather_save(target, policy, step=1)
        rl_dist.barrier()
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) if info.is_main else 0
    rl_dist.barrier()
    load_rss = RssPeak()
    before_load = load_rss.now()
    with Stopwatch() as load, load_rss:
        if method == "sharded":
            checkpoint.load_checkpoint(target, policy)
        else:
            gather_load(target, policy)
        rl_dist.barrier()
    row = {"rank": info.rank, "ranks": info.world_size, "method": method, "save_s": save.seconds,
           "save_peak_gib": rss.peak / GIB, "rss_before_save_gib": before_save / GIB, "load_s": load.seconds,
           "load_peak_gib": load_rss.peak / GIB, "rss_before_load_gib": before_load / GIB,
           "checkpoint_gib": size / GIB}
    write_json(out / f"rank{info.rank}.json", row, indent=None)
    rl_dist.barrier()
    torch.distributed.destroy_process_group()


# ------------------------------------------------------------------ driver

def build_checkpoint(work: Path) -> tuple[Path, int]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = work / "qwen3_1.7b_widths_2layers"
    config = Qwen3Config(**SHAPE)
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(path)
        del model
    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
    return path, n


def run(model_dir: Path, work: Path, ranks: int, method: str, port: int) -> list[dict]:
    import shutil

    out = work / f"r{ranks}_{method}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={port}",
           __file__, "--worker", str(model_dir), str(out), method]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:   # reported, and the other runs still go (e.g. an OOM kill of the baseline)
        print(f"{ranks} ranks, {method}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
        return []
    rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    shutil.rmtree(out, ignore_errors=True)       # ~12 bytes per parameter each
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rstar2-bench-checkpoint"))
    ap.add_argument("--port", type=int, default=29571)
    add_json_option(ap)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir, n = build_checkpoint(args.work)
    rows = []
    for ranks in args.ranks:
        for method in args.methods:
            got = run(model_dir, args.work, ranks, method, args.port)
            rows += got
            print(f"done: {ranks} ranks, {method}: {json.dumps(got)}", file=sys.stderr, flush=True)
            # as it goes: a later run that takes the machine down loses only itself
            write_json(args.json, {"shape": SHAPE, "rows": rows})
    result = {"shape": SHAPE, "parameters": n, "load_average": os.getloadavg(), "rows": rows}
    ratios = {}
    for ranks in args.ranks:
        peak = {m: next((r["save_peak_gib"] for r in rows if r["ranks"] == ranks and r["method"] == m
                         and r["rank"] == 0), None) for m in args.methods}
        if peak.get("sharded") and peak.get("gather"):
            ratios[ranks] = peak["sharded"] / peak["gather"]
    result["rank0_save_peak_ratio"] = ratios
    print(f"Qwen3 shape {SHAPE}: {n / 1e9:.3f}B parameters (fp32 weights {4 * n / GIB:.2f} GiB, "
          f"AdamW {8 * n / GIB:.2f} GiB); load average {os.getloadavg()}")
    print(f"{'ranks':>5} {'method':>8} {'rank':>4} {'save s':>7} {'save peak GiB':>13} {'before':>7} "
          f"{'load s':>7} {'load peak GiB':>13} {'before':>7} {'ckpt GiB':>8}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['method']:>8} {r['rank']:>4} {r['save_s']:>7.1f} {r['save_peak_gib']:>13.2f} "
              f"{r['rss_before_save_gib']:>7.2f} {r['load_s']:>7.1f} {r['load_peak_gib']:>13.2f} "
              f"{r['rss_before_load_gib']:>7.2f} {r['checkpoint_gib']:>8.2f}")
    for ranks, ratio in ratios.items():
        print(f"rank 0 save peak RSS, sharded / gather at {ranks} ranks: {ratio:.2f}x"
              + ("  (target <= 0.5x at 4 ranks)" if ranks == 4 else ""))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
