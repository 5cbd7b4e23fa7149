"""Throughput and latency of the embedded sandbox vs a naive `python -c` subprocess per call.

Both are measured in the same run (the machine is shared and noisy), and the report gives the
ratio. Latency p50/p99 is submit-to-result at the given concurrency, so it includes queueing
(Little's law: mean latency = concurrency / throughput); exec_p50/p99 is the in-jail run time
of each call (fork to exit). A third reference, "bare fork", is the ceiling for any fork-per-call design on this
machine: one unconfined preloaded parent forking children that exec the snippet, with no jail,
limits, IPC or result handling.
Usage:  python benchmarks/timing/bench_sandbox_core.py [--calls 3000] [--concurrency 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.sandbox_bench.plain import WORKLOADS  # noqa: E402
from rstar2_cli.sandbox_bench.timing import percentile_ms as _ms  # noqa: E402
from sandbox import Sandbox  # noqa: E402

SNIPPETS = {name: WORKLOADS[name].code for name in ("trivial", "sympy")}  # the same as bench-tools


_BARE_FORK = r"""
import os, sys, time, math, fractions, itertools
code, n, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if "sympy" in code:
    import numpy, sympy
    sympy.factorint(2**61 - 1)
compiled = compile(code, "<snippet>", "exec")
running, done, start = 0, 0, time.perf_counter()
while done < n:
    while running < concurrency and done + running < n:
        if os.fork() == 0:
            fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 1)
            exec(compiled, {"__name__": "__main__"}); sys.stdout.flush(); os._exit(0)
        running += 1
    os.wait(); running -= 1; done += 1
print(n / (time.perf_counter() - start))
"""


async def _bare_fork(code: str, n: int, concurrency: int) -> float:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _BARE_FORK, code, str(n), str(concurrency),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return round(float(out), 1)


def _summary(latencies: list[float], elapsed: float) -> dict:
    return {"calls": len(latencies), "calls_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": _ms(latencies, 50), "p99_ms": _ms(latencies, 99)}


async def _measure(call, n: int, concurrency: int) -> tuple[dict, list]:
    gate = asyncio.Semaphore(concurrency)
    latencies, outcomes = [], []

    async def one() -> None:
        async with gate:
            with Stopwatch() as sw:
                outcomes.append(await call())
            latencies.append(sw.seconds)

    with Stopwatch() as total:
        await asyncio.gather(*(one() for _ in range(n)))
    return _summary(latencies, total.seconds), outcomes


async def _naive(code: str) -> bool:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    return proc.returncode == 0


async def main(calls: int, concurrency: int, naive_calls: int) -> dict:
    report = {}
    async with Sandbox() as sandbox:
        for name, code in SNIPPETS.items():
            await sandbox.run_batch([{"code": code}] * 50)  # warm up
            n = calls if name == "trivial" else max(50, calls // 5)
            ours, outcomes = await _measure(lambda c=code: sandbox.run(c), n, concurrency)
            failed = [r for r in outcomes if not r.ok]
            walls = [r.wall_time for r in outcomes]  # fork-to-exit inside the jail, no queueing
            ours["exec_p50_ms"], ours["exec_p99_ms"] = _ms(walls, 50), _ms(walls, 99)
            base, base_ok = await _measure(lambda c=code: _naive(c), naive_calls, min(concurrency, 8))
            bare = await _bare_fork(code, n, concurrency)
            report[name] = {"sandbox": ours, "naive_subprocess": base, "bare_fork_calls_per_s": bare,
                            "speedup": round(ours["calls_per_s"] / base["calls_per_s"], 1),
                            "fraction_of_bare_fork": round(ours["calls_per_s"] / bare, 2),
                            "sandbox_failures": len(failed), "naive_failures": base_ok.count(False)}
        report["stats"] = sandbox.stats()
        report["protections"] = sandbox.protections()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--naive-calls", type=int, default=24)
    add_json_option(parser)
    args = parser.parse_args()
    result = asyncio.run(main(args.calls, args.concurrency, args.naive_calls))
    table = Table(title=f"sandbox core, concurrency {args.concurrency}")
    for column in ("snippet", "runner", "calls/s", "p50 ms", "p99 ms", "speedup"):
        table.add_column(column)
    for name in SNIPPETS:
        row = result[name]
        table.add_row(name, "sandbox", *(str(row["sandbox"][k]) for k in ("calls_per_s", "p50_ms", "p99_ms")),
                      f"{row['speedup']}x")
        naive = row["naive_subprocess"]
        table.add_row("", "naive subprocess", *(str(naive[k]) for k in ("calls_per_s", "p50_ms", "p99_ms")), "1x")
        table.add_row("", "bare fork (ceiling)", str(row["bare_fork_calls_per_s"]), "-", "-",
                      f"{row['bare_fork_calls_per_s'] / row['naive_subprocess']['calls_per_s']:.1f}x")
    Console().print(table)
    print(json.dumps(result, indent=2))
    write_json(args.json, result)
