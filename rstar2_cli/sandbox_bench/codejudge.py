"""`rstar2 bench-tools --client codejudge`: the sandbox as the rStar release's client sees it.

Why: that client wraps every call in its executor template and posts batches to
`/run/long-batch` (sandbox.service.codejudge_client), so plain-snippet figures say little about what an
official rStar run gets. For each workload, in one run and at one concurrency, this measures

  * embedded / plain    -- `Sandbox.run(code)` in this process;
  * embedded / wrapped  -- `Sandbox.run(wrap_code(code))`;
  * http / plain        -- `RemoteSandbox` (long-batch, calls coalesced) to a server subprocess;
  * http / codejudge    -- wrapped code, long-batch requests of `batch_size`, new connection per
                           request and queue_timeout retries, as the release's client sends them;

and reports each row's ratio to embedded/plain (and, for HTTP rows, to the embedded row of the
same text), plus the calls the pool re-routed to its full tier and the calls it ran through its
executor-template fast path (sandbox.inside.template_run). The server runs in its own process (as
`rstar2 serve-sandbox` would), so the client's work does not share its interpreter; the rows
take turns in interleaved rounds, so a change in the shared machine's load hits them alike.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.table import Table

from rstar2_cli.sandbox_bench.server import server_process
from rstar2_cli.sandbox_bench.timing import percentile_ms, timed
from sandbox.service.client import RemoteSandbox
from sandbox.service.codejudge_client import call_long_batch, submission
from sandbox.service.embedded import build_sandbox
from sandbox.service.executor_template import wrap_code

# (code, the stdout a correct run prints); the sympy one echoes its last expression
CODEJUDGE_WORKLOADS = {
    "trivial": ("print(6*7)", "42\n"),
    "sympy": ("import sympy\nsympy.factorint(2**61-1)", "{2305843009213693951: 1}\n"),
}


@dataclass
class ClientRow:
    workload: str
    path: str          # embedded | http
    client: str        # plain | wrapped | codejudge
    concurrency: int
    calls: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    failures: int      # wrong stdout or not run_success
    rerouted: int      # calls the pool re-ran in its full tier during this row
    fast_template: int  # calls the pool recognised as the release's template (prelude run once per zygote)
    vs_embedded_plain: float | None = None
    vs_embedded_same_code: float | None = None  # http rows: against the embedded row of the same text
    first_failure: str | None = None


_COUNTED = ("rerouted", "fast_template")  # pool counters reported per row


def _row(workload, path, client, c, seconds, latencies, failures, before: dict, after: dict) -> ClientRow:
    return ClientRow(workload, path, client, c, len(latencies), round(len(latencies) / seconds, 1),
                     percentile_ms(latencies, 50), percentile_ms(latencies, 99), len(failures),
                     *(after[k] - before[k] for k in _COUNTED),
                     first_failure=failures[0][:200] if failures else None)


def sandbox_runner(sb, name: str, text: str, c: int):
    """measure(calls) for calls through anything with the Sandbox API (embedded or RemoteSandbox)."""
    expect = CODEJUDGE_WORKLOADS[name][1]

    async def one() -> str | None:
        res = await sb.run(text)
        return None if res.ok and res.stdout == expect else f"{res.reason}: {res.stdout!r} {res.stderr[-150:]!r}"

    async def measure(calls: int) -> tuple[float, list[float], list[str], int]:
        return (*await timed(calls, c, one), calls)
    return measure


def codejudge_runner(client, url: str, name: str, c: int, batch_size: int):
    """measure(calls) for wrapped calls in long-batch requests of `batch_size`, c calls in flight,
    as the release's client sends them; latencies are per request."""
    code, expect = CODEJUDGE_WORKLOADS[name]

    async def measure(calls: int) -> tuple[float, list[float], list[str], int]:
        notes: list[str] = []

        async def one() -> None:
            results = await call_long_batch(client, f"{url}/run/long-batch", [submission(code)] * batch_size)
            notes.extend(f"{r and r['reason']}: {r and r['stderr'][-150:]!r}" for r in results
                         if not (r and r["run_success"] and r["stdout"] == expect))
        requests = max(1, calls // batch_size)
        seconds, latencies, _ = await timed(requests, max(1, c // batch_size), one)
        return seconds, latencies, notes, requests * batch_size
    return measure


def release_like_client(connections: int):
    """The release's HTTP client: aiohttp, with a new connection per request (force_close=True);
    httpx with keep-alive off where aiohttp is not installed (it costs the client ~2x the CPU)."""
    try:
        import aiohttp
    except ImportError:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=0)
        return httpx.AsyncClient(timeout=600, limits=limits)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def _http_counters(url: str) -> dict:
    async with httpx.AsyncClient(timeout=30) as client:
        backend = (await client.get(f"{url}/status")).json().get("backend", {})
    return {k: int(backend.get(k, 0)) for k in _COUNTED}


async def run_client_bench(sandbox_kwargs: dict, workloads: list[str], concurrency: int, calls: int,
                           batch_size: int, port: int, rounds: int = 3) -> dict:
    """Every row, interleaved: `rounds` rounds, each running every row for 1/rounds of its calls,
    so that a change in the machine's load (it is shared) hits all rows alike."""
    unknown = [w for w in workloads if w not in CODEJUDGE_WORKLOADS]
    if unknown:
        raise ValueError(f"--workloads: {unknown} have no codejudge form; choose from {list(CODEJUDGE_WORKLOADS)}")
    if batch_size < 1 or concurrency < 1 or calls < 1 or rounds < 1:
        raise ValueError(f"--batch-size, --concurrency, --calls and --rounds must be >= 1, got {batch_size}, "
                         f"{concurrency}, {calls}, {rounds}")
    sb = build_sandbox(sandbox_kwargs)
    async with sb, contextlib.AsyncExitStack() as stack:
        url = stack.enter_context(server_process(sandbox_kwargs, port))
        remote = await stack.enter_async_context(RemoteSandbox(url))
        client = await stack.enter_async_context(release_like_client(max(1, concurrency // batch_size) + 1))

        async def embedded_counters() -> dict:
            return {k: sb.stats()[k] for k in _COUNTED}

        async def http_counters() -> dict:
            return await _http_counters(url)
        specs = []  # (workload, path, client, measure, counters)
        for name in workloads:
            code = CODEJUDGE_WORKLOADS[name][0]
            specs += [(name, "embedded", "plain", sandbox_runner(sb, name, code, concurrency), embedded_counters),
                      (name, "embedded", "wrapped", sandbox_runner(sb, name, wrap_code(code), concurrency),
                       embedded_counters),
                      (name, "http", "plain", sandbox_runner(remote, name, code, concurrency), http_counters),
                      (name, "http", "codejudge", codejudge_runner(client, url, name, concurrency, batch_size),
                       http_counters)]
        totals = [[0.0, [], [], 0, None] for _ in specs]  # seconds, latencies, failures, calls, counters
        for spec in specs:
            await spec[3](min(calls_for(spec[0], calls), 2 * concurrency))  # warm-up at this concurrency
        for _ in range(rounds):
            for spec, total in zip(specs, totals):
                before = await spec[4]()
                seconds, latencies, failures, done = await spec[3](max(1, calls_for(spec[0], calls) // rounds))
                after = await spec[4]()
                total[0] += seconds
                total[1] += latencies
                total[2] += failures
                total[3] += done
                total[4] = {k: (total[4] or {}).get(k, 0) + after[k] - before[k] for k in _COUNTED}
    rows = []
    for (name, path, kind, _, _), (seconds, latencies, failures, done, counted) in zip(specs, totals):
        row = _row(name, path, kind, concurrency, seconds, latencies, failures, {k: 0 for k in _COUNTED}, counted)
        row.calls, row.calls_per_s = done, round(done / seconds, 1)
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r.workload == row.workload and r.path == "embedded" and r.client == "plain")
        row.vs_embedded_plain = round(row.calls_per_s / base.calls_per_s, 2)
        same = "plain" if row.client == "plain" else "wrapped"
        twin = next(r for r in rows if r.workload == row.workload and r.path == "embedded" and r.client == same)
        row.vs_embedded_same_code = round(row.calls_per_s / twin.calls_per_s, 2)
    return {"concurrency": concurrency, "batch_size": batch_size, "rounds": rounds, "load_average": os.getloadavg(),
            "rows": [asdict(r) for r in rows]}


def calls_for(name: str, calls: int) -> int:
    """Calls of a row: the sympy rows take longer, so a third of `calls` (at least 64)."""
    return calls if name == "trivial" else max(64, calls // 3)


def render_client_table(report: dict):
    load = ", ".join(f"{x:.1f}" for x in report["load_average"])
    table = Table(title=f"bench-tools --client codejudge (concurrency {report['concurrency']}, long-batch of "
                        f"{report['batch_size']}, {report['rounds']} interleaved rounds; load average after: {load})")
    for col in ("workload", "path", "client", "calls", "calls/s", "p50 ms", "p99 ms", "failures", "rerouted",
                "fast template", "vs embedded plain", "vs embedded, same text"):
        table.add_column(col, justify="left" if col in ("workload", "path", "client") else "right")
    for r in report["rows"]:
        table.add_row(r["workload"], r["path"], r["client"], str(r["calls"]), f"{r['calls_per_s']:.1f}",
                      f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", str(r["failures"]), str(r["rerouted"]),
                      str(r["fast_template"]), f"{r['vs_embedded_plain']:.2f}x",
                      f"{r['vs_embedded_same_code']:.2f}x" if r["path"] == "http" else "")
    return table


def client_bench_main(sandbox_kwargs: dict, workloads: list[str], concurrency: int, calls: int, batch_size: int,
                      port: int, json_path, console, rounds: int = 3) -> dict:
    """Run the client benchmark, print its table, write JSON when asked."""
    with console.status(f"bench-tools --client codejudge: embedded and HTTP rows, {rounds} interleaved rounds"):
        report = asyncio.run(run_client_bench(sandbox_kwargs, workloads, concurrency, calls, batch_size, port,
                                              rounds))
    if not console.is_terminal:
        console.width = max(console.width, 140)
    console.print(render_client_table(report))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_path}")
    return report
