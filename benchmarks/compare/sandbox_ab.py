"""The sandbox rows of `benchmarks/compare/ab.py sandbox`: two trees' sandboxes live at once, in rounds.

Each tree gets an embedded pool (in a runner process importing that tree's `sandbox`) and a
`serve-sandbox` server; every round runs every row of both, in turn, and the report sums the
rounds. Rows: embedded plain, embedded wrapped in the release's executor template, HTTP plain
(`RemoteSandbox`), HTTP as the release's client sends it (long-batch of 8, a new connection per
request). The HTTP clients run in this process, from this checkout, against both servers.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from rstar2_cli.sandbox_bench.codejudge import (CODEJUDGE_WORKLOADS, calls_for, codejudge_runner, release_like_client,
                                                 sandbox_runner)
from sandbox.service.client import RemoteSandbox

CONCURRENCY = 64

# Runs in a subprocess with PYTHONPATH=<checkout>: an embedded pool as the service builds it (the
# code-judge preludes registered), driven over stdin/stdout.
_RUNNER = r"""
import asyncio, json, sys, time
from sandbox.service.embedded import sandbox_from_kwargs
from sandbox.service.executor_template import wrap_code
async def main():
    async with sandbox_from_kwargs({}) as sb:
        gate = asyncio.Semaphore(int(sys.argv[1]))
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            code, expect, wrapped, n = json.loads(line)
            text = wrap_code(code) if wrapped else code
            bad = 0
            async def one():
                nonlocal bad
                async with gate:
                    r = await sb.run(text)
                    bad += not (r.ok and r.stdout == expect)
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            print(json.dumps([time.perf_counter() - t0, n, bad]), flush=True)
asyncio.run(main())
"""

_SERVER = ("import json, sys; from sandbox.service.launch import serve_http; "
           "from sandbox.service.server import ServiceConfig; "
           "serve_http('127.0.0.1', int(sys.argv[1]), json.loads(sys.argv[2]), ServiceConfig(max_queue=4096))")


class Runner:
    def __init__(self, tree: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        self.proc = subprocess.Popen([sys.executable, "-c", _RUNNER, str(CONCURRENCY)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        assert self.proc.stdout.readline().strip() == "ready"

    async def measure(self, code: str, expect: str, wrapped: bool, n: int) -> tuple[float, list, list, int]:
        self.proc.stdin.write(json.dumps([code, expect, wrapped, n]) + "\n")
        self.proc.stdin.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, self.proc.stdout.readline)
        seconds, done, bad = json.loads(line)
        return seconds, [], ["wrong"] * bad, done

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def _server(tree: str, port: int, kwargs: str = "{}") -> subprocess.Popen:
    import httpx
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port), kwargs], env=env, cwd=tree,
                            start_new_session=True)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server from {tree} did not answer")


async def sandbox_ab(tree_a, tree_b, args) -> dict:
    """Every row of both trees' sandboxes, `args.rounds` interleaved rounds; B / A per row."""
    trees = {"A": str(tree_a), "B": str(tree_b)}
    runners, servers = {}, {}
    try:
        for key, tree in trees.items():
            runners[key] = Runner(tree)
            servers[key] = _server(tree, args.port + (key == "B"), args.a_server if key == "A" else args.b_server)
        rows, totals = [], {}
        async with release_like_client(CONCURRENCY // 8 + 1) as client:
            remotes = {k: RemoteSandbox(f"http://127.0.0.1:{args.port + (k == 'B')}") for k in trees}
            for r in remotes.values():
                await r.start()
            for name in args.workloads.split(","):
                code, expect = CODEJUDGE_WORKLOADS[name]
                n = calls_for(name, args.calls)
                for key in trees:
                    url = f"http://127.0.0.1:{args.port + (key == 'B')}"
                    for row, measure in (
                            ("embedded plain", lambda c, r=runners[key], t=code, e=expect: r.measure(t, e, False, c)),
                            ("embedded wrapped", lambda c, r=runners[key], t=code, e=expect: r.measure(t, e, True, c)),
                            ("http plain", sandbox_runner(remotes[key], name, code, CONCURRENCY)),
                            ("http codejudge", codejudge_runner(client, url, name, CONCURRENCY, 8))):
                        rows.append((name, row, key, measure, n))
            for _, _, _, measure, n in rows:  # warm-up
                await measure(min(n, 2 * CONCURRENCY))
            for _ in range(args.rounds):
                for name, row, key, measure, n in rows:
                    seconds, _, failures, done = await measure(max(8, n // args.rounds))
                    t = totals.setdefault((name, row, key), [0.0, 0, 0])
                    t[0] += seconds
                    t[1] += done
                    t[2] += len(failures)
            for r in remotes.values():
                await r.close()
    finally:
        for r in runners.values():
            r.close()
        for s in servers.values():
            s.terminate()
            s.wait(30)
    out = []
    for (name, row, key), (seconds, done, bad) in totals.items():
        if key == "A":
            b = totals[(name, row, "B")]
            out.append({"workload": name, "row": row, "a_calls_per_s": round(done / seconds, 1),
                        "b_calls_per_s": round(b[1] / b[0], 1), "b_over_a": round((b[1] / b[0]) / (done / seconds), 2),
                        "failures": bad + b[2]})
    return {"rounds": args.rounds, "concurrency": CONCURRENCY, "load_average": os.getloadavg(), "rows": out}


def print_sandbox(report: dict, a: str, b: str) -> None:
    table = Table(title=f"A = {a}, B = {b}: {report['rounds']} interleaved rounds, concurrency {CONCURRENCY}; "
                        f"load average after: {', '.join(f'{x:.1f}' for x in report['load_average'])}")
    for col in ("workload", "row", "A calls/s", "B calls/s", "B / A", "failures"):
        table.add_column(col)
    for r in report["rows"]:
        table.add_row(r["workload"], r["row"], f"{r['a_calls_per_s']:.1f}", f"{r['b_calls_per_s']:.1f}",
                      f"{r['b_over_a']:.2f}x", str(r["failures"]))
    Console(width=140).print(table)
