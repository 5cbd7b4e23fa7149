"""What RL's code runner costs per tool call, with and without the sandbox's template fast path.

Why: every RL tool call is wrapped in the compact runner of `rstar2_cli/protocol/code_runner.py`
(rollout.code_runner "release", the default), so its overhead over the bare snippet is paid tens of
thousands of times a step. RL's pools register the runner as a prelude, so they recognise it and
define it once per zygote (sandbox.inside.template_run); the pool here registers it the same way.
Rows, on one embedded pool, in interleaved rounds so that the shared machine's load hits them alike:

  * plain         -- the snippet as is (the baseline);
  * runner        -- `release_runner_source(snippet)`, recognised: the fast path;
  * runner, text  -- the same text with a leading "#": not recognised, so it runs as text
                     (what every call paid before the runner was registered).

Usage:  python benchmarks/timing/bench_rl_code_runner.py [--calls 900] [--concurrency 64] [--rounds 3] [--json F]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import add_json_option, write_json  # noqa: E402
from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE, release_runner_source  # noqa: E402
from rstar2_cli.sandbox_bench.codejudge import CODEJUDGE_WORKLOADS, calls_for, sandbox_runner  # noqa: E402
from rstar2_cli.sandbox_bench.timing import percentile_ms  # noqa: E402
from sandbox import Sandbox  # noqa: E402

KINDS = {"plain": lambda code: code, "runner": release_runner_source,
         "runner, text": lambda code: "#" + release_runner_source(code)}


async def run(calls: int, concurrency: int, rounds: int, workloads: list[str]) -> dict:
    async with Sandbox(preludes=(RUNNER_PRELUDE,)) as sb:
        specs = [(name, kind, sandbox_runner(sb, name, wrap(CODEJUDGE_WORKLOADS[name][0]), concurrency))
                 for name in workloads for kind, wrap in KINDS.items()]
        for _, _, measure in specs:
            await measure(2 * concurrency)  # warm-up
        totals = {(name, kind): [0.0, [], 0, 0] for name, kind, _ in specs}
        fast = {key: 0 for key in totals}
        for _ in range(rounds):
            for name, kind, measure in specs:
                before = sb.stats()["fast_template"]
                seconds, latencies, failures, done = await measure(max(1, calls_for(name, calls) // rounds))
                total = totals[(name, kind)]
                total[0] += seconds
                total[1] += latencies
                total[2] += len(failures)
                total[3] += done
                fast[(name, kind)] += sb.stats()["fast_template"] - before
    rows = []
    for (name, kind), (seconds, latencies, failures, done) in totals.items():
        rows.append({"workload": name, "kind": kind, "calls": done, "calls_per_s": round(done / seconds, 1),
                     "p50_ms": percentile_ms(latencies, 50), "p99_ms": percentile_ms(latencies, 99),
                     "failures": failures, "fast_template": fast[(name, kind)]})
    for row in rows:
        base = next(r for r in rows if r["workload"] == row["workload"] and r["kind"] == "plain")
        row["vs_plain"] = round(row["calls_per_s"] / base["calls_per_s"], 2)
    return {"concurrency": concurrency, "rounds": rounds, "load_average": os.getloadavg(), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=900)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="trivial,sympy")
    add_json_option(ap)
    args = ap.parse_args()
    report = asyncio.run(run(args.calls, args.concurrency, args.rounds, args.workloads.split(",")))
    load = ", ".join(f"{x:.1f}" for x in report["load_average"])
    table = Table(title=f"RL code runner, embedded pool (concurrency {args.concurrency}, {args.rounds} "
                        f"interleaved rounds; load average after: {load})")
    for col in ("workload", "kind", "calls", "calls/s", "p50 ms", "p99 ms", "failures", "fast template", "vs plain"):
        table.add_column(col, justify="left" if col in ("workload", "kind") else "right")
    for r in report["rows"]:
        table.add_row(r["workload"], r["kind"], str(r["calls"]), f"{r['calls_per_s']:.1f}", f"{r['p50_ms']:.1f}",
                      f"{r['p99_ms']:.1f}", str(r["failures"]), str(r["fast_template"]), f"{r['vs_plain']:.2f}x")
    Console(width=140).print(table)
    write_json(args.json, report)


if __name__ == "__main__":
    main()
