"""Rollout makespan: load-balanced scheduler vs static splits, on a skewed multi-turn workload.

(a) real engines: 2 `VLLMEngine` replicas of the tiny model on CPU, each with a small KV cache so
    that, as on GPUs at scale, KV capacity limits how many trajectories a replica can run; turn
    lengths are forced with max_tokens + ignore_eos, tool calls are sleeps. Both policies run in
    this process on the same engines, static first then balanced, `--reps` times each.
(b) simulator: 64-GPU settings (`--sim-preset`: 16 replicas x TP4 on H100, or the paper's 64 x
    MI300X with one replica per GPU; 512 prompts x 32 rollouts) through the same policy code
    (`benchmarks/sim/rollout.py`), for several seeds.

Reports makespan ratios (balanced / static; target <= 0.8) in a rich table and, with --json, a file.

    python benchmarks/timing/bench_scheduler.py --json results/bench_scheduler.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/, for the simulators (sim/)

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rstar2_cli.config import EngineConfig
from rstar2_cli.models.tiny import build_tiny_model
from rstar2_cli.rollout.engines import GenRequest, VLLMEngine
from rstar2_cli.rollout.scheduler import (ContiguousSplitPolicy, LoadBalancedPolicy, LoadBalancedScheduler,
                                          RoundRobinPolicy, RoundRobinScheduler)
from sim.rollout import SIM_PRESETS, ReplicaModel, simulate
from sim.workload import TrajectoryPlan, WorkloadSpec, make_workload

REAL_SPEC = WorkloadSpec(num_prompts=5, rollouts_per_prompt=4, prompt_tokens=(16, 32), long_fraction=0.2,
                         prompt_correlation=0.0, long_turns=(6, 10), long_turn_tokens=(24, 48),
                         short_turns=(1, 2), short_turn_tokens=(4, 12), tool_latency_s=(0.05, 0.2),
                         tool_response_tokens=(4, 12), max_response_tokens=400)
# 64-GPU settings: (replicas, tensor-parallel size, replica model).
async def run_rollout(scheduler, plans: list[TrajectoryPlan], seed: int, vocab: int) -> float:
    """Drive every trajectory turn by turn; returns the makespan in seconds."""
    rng = random.Random(seed)
    prompts = {p.key: [rng.randrange(10, vocab) for _ in range(p.prompt_tokens)] for p in plans}
    tools = {p.key: [[rng.randrange(10, vocab) for _ in range(t.tool_tokens)] for t in p.turns] for p in plans}

    async def trajectory(plan: TrajectoryPlan, idx: int) -> None:
        ctx = list(prompts[plan.key])
        for j, turn in enumerate(plan.turns):
            out = await scheduler.generate(GenRequest(ctx, max_tokens=turn.gen_tokens, ignore_eos=True,
                                                      seed=seed * 100_003 + idx * 31 + j), key=plan.key)
            ctx += out.token_ids
            if turn.tool_tokens:
                await asyncio.sleep(turn.tool_latency_s)
                ctx += tools[plan.key][j]

    t0 = time.perf_counter()
    await asyncio.gather(*(trajectory(p, i) for i, p in enumerate(plans)))
    return time.perf_counter() - t0


def bench_real(args, console: Console) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    plans = make_workload(REAL_SPEC, seed=args.seed)
    engines = []
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny", seed=0)
        cfg = EngineConfig(max_num_seqs=32)
        cores = os.cpu_count() or 1
        try:
            for r in range(2):
                if cores >= 2:   # one core each, as each replica would own its GPUs
                    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(r % cores)
                engines.append(VLLMEngine.from_config(str(path), cfg, max_model_len=args.real_kv_tokens,
                                                      seed=r, kv_cache_tokens=args.real_kv_tokens))
            vocab = 300
            for e in engines:   # warm-up
                e.generate_batch([GenRequest([11] * 16, max_tokens=8, ignore_eos=True)] * 4)
            runs: dict[str, list[float]] = {"round_robin": [], "load_balanced": []}
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("real-engine rollouts", total=2 * args.reps)
                for rep in range(args.reps):
                    for name, cls in (("round_robin", RoundRobinScheduler), ("load_balanced", LoadBalancedScheduler)):
                        for e in engines:
                            asyncio.run(e.reset_prefix_cache())
                        sched = cls(engines)
                        runs[name].append(asyncio.run(run_rollout(sched, plans, args.seed + rep, vocab)))
                        bar.advance(task)
        finally:
            for e in engines:
                e.shutdown()
    rr, lb = statistics.median(runs["round_robin"]), statistics.median(runs["load_balanced"])
    return {"workload": {"trajectories": len(plans), "long": sum(p.long for p in plans),
                         "turns": sum(len(p.turns) for p in plans),
                         "generated_tokens": sum(p.generated_tokens for p in plans)},
            "kv_cache_tokens_per_replica": args.real_kv_tokens, "runs_s": runs,
            "round_robin_s": rr, "load_balanced_s": lb, "ratio_vs_round_robin": lb / rr}


def bench_sim(args) -> dict:
    spec = WorkloadSpec(num_prompts=args.sim_prompts, rollouts_per_prompt=args.sim_rollouts)
    replicas, tp, model = SIM_PRESETS[args.sim_preset]
    rows = []
    for seed in range(args.seed, args.seed + args.sim_seeds):
        plans = make_workload(spec, seed=seed)
        res = {}
        for pol in (RoundRobinPolicy(), ContiguousSplitPolicy(len(plans)), LoadBalancedPolicy()):
            r = simulate(plans, replicas, model, pol, max_response_tokens=spec.max_response_tokens)
            res[r.policy] = {"makespan_s": r.makespan_s, "preemptions": r.preemptions,
                             "recomputed_tokens": r.recomputed_tokens, "generated_tokens": r.generated_tokens}
        lb = res["load_balanced"]["makespan_s"]
        rows.append({"seed": seed, **res, "ratio_vs_round_robin": lb / res["round_robin"]["makespan_s"],
                     "ratio_vs_contiguous_split": lb / res["contiguous_split"]["makespan_s"]})
    return {"preset": args.sim_preset, "replicas": replicas, "tensor_parallel": tp,
            "trajectories": spec.num_prompts * spec.rollouts_per_prompt, "replica_model": model.__dict__, "seeds": rows,
            "mean_ratio_vs_round_robin": statistics.mean(r["ratio_vs_round_robin"] for r in rows),
            "mean_ratio_vs_contiguous_split": statistics.mean(r["ratio_vs_contiguous_split"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=1, help="real-engine runs per policy")
    ap.add_argument("--real-kv-tokens", type=int, default=512, help="KV cache per tiny replica (tokens)")
    ap.add_argument("--sim-preset", choices=sorted(SIM_PRESETS), default="h100-tp4",
                    help="64-GPU cluster the simulator models")
    ap.add_argument("--sim-prompts", type=int, default=512)
    ap.add_argument("--sim-rollouts", type=int, default=32)
    ap.add_argument("--sim-seeds", type=int, default=3)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args()
    console = Console()
    out: dict = {"target_ratio": 0.8}
    if not args.skip_sim:
        with console.status("simulating 64-GPU rollouts"):
            out["simulator"] = bench_sim(args)
    if not args.skip_real:
        out["real_engines"] = bench_real(args, console)

    table = Table(title="Rollout makespan: load-balanced scheduler vs static split (ratio: lower is better)")
    for col in ("setting", "round robin", "contiguous split", "load balanced", "LB/RR", "LB/contig."):
        table.add_column(col, justify="right" if col != "setting" else "left")
    sim = out.get("simulator", {})
    for row in sim.get("seeds", []):
        table.add_row(
            f"sim {sim['replicas']}xTP{sim['tensor_parallel']}, seed {row['seed']}",
            f"{row['round_robin']['makespan_s']:.0f} s",
            f"{row['contiguous_split']['makespan_s']:.0f} s",
            f"{row['load_balanced']['makespan_s']:.0f} s",
            f"{row['ratio_vs_round_robin']:.3f}",
            f"{row['ratio_vs_contiguous_split']:.3f}",
        )
    if "real_engines" in out:
        r = out["real_engines"]
        spread = {name: f"{min(runs):.1f}-{max(runs):.1f} s" for name, runs in r["runs_s"].items()}
        table.add_row(
            "2 x vLLM tiny (CPU), median",
            f"{r['round_robin_s']:.1f} s",
            "-",
            f"{r['load_balanced_s']:.1f} s",
            f"{r['ratio_vs_round_robin']:.3f}",
            "-",
        )
        table.add_row("  (range over reps)", spread["round_robin"], "-", spread["load_balanced"], "", "")
    console.print(table)
    if "real_engines" in out:
        if any(len(v) > 1 and max(v) > 1.5 * min(v) for v in out["real_engines"]["runs_s"].values()):
            console.print("[yellow]real engines: identical runs differ by more than 1.5x on this machine, so their "
                          "ratio says little about the policies; the simulator rows are the measurement[/]")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
