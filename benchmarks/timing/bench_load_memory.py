"""Peak host memory and time of the trainer's model loading under torchrun, per rank and method.

Target: peak host RSS during loading on every non-zero rank <= (full fp32 model / ranks)
+ 1.5 GiB, on 2 and 4 ranks. Builds a random Qwen3-shaped bf16 checkpoint per size (cached in
--work), then for each (size, ranks, method) launches `torchrun --nproc-per-node R` on this file
in worker mode: each rank builds the policy model exactly as `PolicyTrainer` does
(`rl/model_load.build_policy_model`) and reports its peak RSS (`ru_maxrss`, which includes the
interpreter, torch and the memory-mapped checkpoint pages it touched) and its load time. Methods:
`slices` and `broadcast` (meta device, local shards only) and `full` (the baseline:
`from_pretrained` in fp32 on every rank, then `fully_shard`), all in the same invocation.
A run whose estimated peak would not fit in MemAvailable is skipped and says so.

    python benchmarks/timing/bench_load_memory.py --sizes 0.5b 1b --ranks 2 4 --json load.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402

GIB = 1024**3
SLACK_GIB = 1.5
# Qwen3 shapes (head_dim 128, 8 KV heads, vocab 151936, tied embeddings as Qwen3-0.6B/1.7B).
SHAPES = {
    "0.25b": dict(hidden_size=640, num_hidden_layers=16, intermediate_size=1920, num_attention_heads=8),
    "0.5b": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=3072, num_attention_heads=16),
    "1b": dict(hidden_size=1536, num_hidden_layers=24, intermediate_size=4608, num_attention_heads=16),
}
COMMON = dict(vocab_size=151936, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
              tie_word_embeddings=True)


def build_checkpoint(size: str, work: Path) -> tuple[Path, int]:
    """A random bf16 Qwen3 checkpoint of `size` (reused if present); returns (dir, parameters)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = work / f"qwen3_{size}"
    config = Qwen3Config(**COMMON, **SHAPES[size])
    if not (path / "model.safetensors").is_file():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)   # HF init, bf16 as released
        model.save_pretrained(path)
        del model
    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
    return path, n


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def estimated_peak(method: str, params: int, ranks: int) -> float:
    """Bytes all ranks together may need at the peak (page cache of the bf16 file counted once)."""
    fp32, bf16, base = 4 * params, 2 * params, 0.8 * GIB
    if method == "full":
        return ranks * (fp32 + base) + bf16
    rank0_extra = bf16 if method == "broadcast" else 0
    return ranks * (fp32 / ranks + base) + bf16 + rank0_extra


def worker(model_dir: str, method: str, out_dir: str) -> None:
    import torch
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401  (imports are not loading time)

    from rstar2_cli.rl.ranks import dist as rl_dist  # lazy: torchrun's ranks import it; the launcher has no torch
    # lazy: the torchrun ranks import it, the launcher stays without torch
    from rstar2_cli.rl.update.model_load import build_policy_model

    info = rl_dist.setup_distributed()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rl_dist.barrier()
    with Stopwatch() as sw:
        model = build_policy_model(model_dir, sharded=True, device=info.device, method=method)
        rl_dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    local = sum(p.to_local().numel() for p in model.parameters())
    row = {"rank": info.rank, "peak_rss": peak, "rss_before_load": rss_before, "load_s": sw.seconds,
           "local_params": local}
    write_json(Path(out_dir, f"rank{info.rank}.json"), row, indent=None)
    torch.distributed.destroy_process_group()


def run_case(model_dir: Path, method: str, ranks: int, out: Path, port: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={port}",
           __file__, "--worker", str(model_dir), method, str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{method} x {ranks} ranks failed:\n{proc.stderr[-3000:]}")
    return sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["0.5b", "1b"], choices=sorted(SHAPES))
    ap.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--methods", nargs="+", default=["slices", "broadcast", "full"],
                    choices=["slices", "broadcast", "full"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rstar2_bench_load"))
    ap.add_argument("--port", type=int, default=29611)
    add_json_option(ap)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    args.work.mkdir(parents=True, exist_ok=True)
    cases = [(s, r, m) for s in args.sizes for r in args.ranks for m in args.methods]
    results: list[dict] = []
    with Progress(console=console) as progress:
        task = progress.add_task("loading", total=len(cases))
        for size, ranks, method in cases:
            model_dir, params = build_checkpoint(size, args.work)
            fp32 = 4 * params
            row = {"size": size, "params": params, "fp32_gib": fp32 / GIB, "ranks": ranks, "method": method}
            need = estimated_peak(method, params, ranks)
            if need > 0.85 * mem_available():
                row["skipped"] = f"needs ~{need / GIB:.1f} GiB, {mem_available() / GIB:.1f} GiB available"
            else:
                progress.update(task, description=f"{size} x {ranks} ranks, {method}")
                per_rank = run_case(model_dir, method, ranks, args.work / f"out_{size}_{ranks}_{method}", args.port)
                bound = fp32 / ranks + SLACK_GIB * GIB
                nonzero = [r["peak_rss"] for r in per_rank if r["rank"] > 0]
                row.update(per_rank=per_rank, load_s=max(r["load_s"] for r in per_rank),
                           peak_rss_gib=[r["peak_rss"] / GIB for r in per_rank],
                           peak_over_fp32=[r["peak_rss"] / fp32 for r in per_rank],
                           bound_gib=bound / GIB, meets_target=all(p <= bound for p in nonzero))
            results.append(row)
            progress.advance(task)

    table = Table(title="trainer model loading: peak host RSS per rank (GiB) and load time")
    for col in ("size", "ranks", "method", "rank 0", "ranks 1.. (max)", "/ fp32", "bound", "target",
                "load s", "vs full"):
        table.add_column(col)
    full_time = {(r["size"], r["ranks"]): r["load_s"] for r in results if r["method"] == "full" and "load_s" in r}
    for r in results:
        if "skipped" in r:
            table.add_row(r["size"], str(r["ranks"]), r["method"], "skipped: " + r["skipped"], *[""] * 6)
            continue
        base = full_time.get((r["size"], r["ranks"]))
        table.add_row(r["size"], str(r["ranks"]), r["method"], f"{r['peak_rss_gib'][0]:.2f}",
                      f"{max(r['peak_rss_gib'][1:]):.2f}", f"{max(r['peak_over_fp32'][1:]):.2f}",
                      f"{r['bound_gib']:.2f}", "ok" if r["meets_target"] else "MISS", f"{r['load_s']:.1f}",
                      f"{r['load_s'] / base:.2f}x" if base else "-")
    console.print(table)
    result = {"slack_gib": SLACK_GIB, "results": results}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
