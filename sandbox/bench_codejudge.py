"""`rstar2 bench-tools --client codejudge`: the sandbox as the rStar release's client sees it.

Why: that client wraps every call in its executor template and posts batches to
`/run/long-batch` (sandbox.codejudge_client), so plain-snippet figures say little about what an
official rStar run gets. For each workload, in one run and at one concurrency, this measures

  * embedded / plain    -- `Sandbox.run(code)` in this process;
  * embedded / wrapped  -- `Sandbox.run(wrap_code(code))`;
  * http / plain        -- `RemoteSandbox` (long-batch, calls coalesced) to a server subprocess;
  * http / codejudge    -- wrapped code, long-batch requests of `batch_size`, new connection per
                           request and queue_timeout retries, as the release's client sends them;

and reports each row's ratio to embedded/plain, plus the calls the pool re-routed to its full
tier and the calls it ran through its executor-template fast path (sandbox.template_run). The server runs in its own process (as `rstar2 serve-sandbox` would), so the client's
work does not share its interpreter.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import httpx

from sandbox.bench import percentile_ms
from sandbox.codejudge_client import call_long_batch, submission, wrap_code

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


async def _timed(n: int, concurrency: int, one) -> tuple[float, list[float], list[str]]:
    """Run `one()` n times, `concurrency` at a time; (seconds, latencies, failure notes)."""
    gate = asyncio.Semaphore(concurrency)
    latencies, failures = [], []

    async def run() -> None:
        async with gate:
            t0 = time.perf_counter()
            note = await one()
            latencies.append(time.perf_counter() - t0)
            if note:
                failures.append(note)

    start = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(n)))
    return time.perf_counter() - start, latencies, failures


_COUNTED = ("rerouted", "fast_template")  # pool counters reported per row


def _row(workload, path, client, c, seconds, latencies, failures, before: dict, after: dict) -> ClientRow:
    return ClientRow(workload, path, client, c, len(latencies), round(len(latencies) / seconds, 1),
                     percentile_ms(latencies, 50), percentile_ms(latencies, 99), len(failures),
                     *(after[k] - before[k] for k in _COUNTED),
                     first_failure=failures[0][:200] if failures else None)


async def _sandbox_rows(sb, name: str, c: int, n: int, path: str, counters) -> list[ClientRow]:
    """plain and wrapped rows through anything with the Sandbox API (embedded or RemoteSandbox)."""
    code, expect = CODEJUDGE_WORKLOADS[name]
    rows = []
    for client, text in (("plain", code), ("wrapped", wrap_code(code))):
        async def one(text=text) -> str | None:
            res = await sb.run(text)
            return None if res.ok and res.stdout == expect else f"{res.reason}: {res.stdout!r} {res.stderr[-150:]!r}"
        await _timed(min(n, 2 * c), c, one)  # warm-up at this concurrency
        before = await counters()
        seconds, latencies, failures = await _timed(n, c, one)
        rows.append(_row(name, path, client, c, seconds, latencies, failures, before, await counters()))
    return rows


async def _codejudge_row(url: str, name: str, c: int, n: int, batch_size: int, counters) -> ClientRow:
    """Wrapped calls in long-batch requests of `batch_size`, c calls in flight, as the release sends them."""
    code, expect = CODEJUDGE_WORKLOADS[name]
    async with _release_like_client(max(1, c // batch_size) + 1) as client:
        async def batch() -> list[str]:
            results = await call_long_batch(client, f"{url}/run/long-batch", [submission(code)] * batch_size)
            return [f"{r and r['reason']}: {r and r['stderr'][-150:]!r}" for r in results
                    if not (r and r["run_success"] and r["stdout"] == expect)]

        async def go(calls: int) -> tuple[float, list[float], list[str]]:
            notes: list[str] = []

            async def one() -> str | None:
                bad = await batch()
                notes.extend(bad)
                return None
            seconds, latencies, _ = await _timed(max(1, calls // batch_size), max(1, c // batch_size), one)
            return seconds, latencies, notes

        await go(min(n, 2 * c))
        before = await counters()
        seconds, latencies, failures = await go(n)
    row = _row(name, "http", "codejudge", c, seconds, latencies, failures, before, await counters())
    row.calls = len(latencies) * batch_size
    row.calls_per_s = round(row.calls / seconds, 1)
    return row


def _release_like_client(connections: int):
    """The release's HTTP client: aiohttp, with a new connection per request (force_close=True);
    httpx with keep-alive off where aiohttp is not installed (it costs the client ~2x the CPU)."""
    try:
        import aiohttp
    except ImportError:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=0)
        return httpx.AsyncClient(timeout=600, limits=limits)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=600))


@contextlib.contextmanager
def server_process(sandbox_kwargs: dict, port: int, redis_url: str | None = None):
    """`rstar2 serve-sandbox` in a subprocess on 127.0.0.1:port; yields its URL once it answers."""
    boot = ("import json, sys; from sandbox.launch import serve_http; from sandbox.server import ServiceConfig; "
            "from sandbox.redis_mode import RedisConfig; a = json.loads(sys.argv[1]); "
            "serve_http('127.0.0.1', a['port'], a['kwargs'], ServiceConfig(max_queue=4096), "
            "RedisConfig(a['redis']) if a['redis'] else None)")
    spec = json.dumps({"port": port, "kwargs": sandbox_kwargs, "redis": redis_url})
    proc = subprocess.Popen([sys.executable, "-c", boot, spec], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox server exited with {proc.returncode} before answering")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sandbox server did not answer /ping within 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _http_counters(url: str) -> dict:
    async with httpx.AsyncClient(timeout=30) as client:
        backend = (await client.get(f"{url}/status")).json().get("backend", {})
    return {k: int(backend.get(k, 0)) for k in _COUNTED}


async def run_client_bench(sandbox_kwargs: dict, workloads: list[str], concurrency: int, calls: int,
                           batch_size: int, port: int) -> dict:
    from sandbox.client import RemoteSandbox
    from sandbox.launch import build_sandbox

    unknown = [w for w in workloads if w not in CODEJUDGE_WORKLOADS]
    if unknown:
        raise ValueError(f"--workloads: {unknown} have no codejudge form; choose from {list(CODEJUDGE_WORKLOADS)}")
    if batch_size < 1 or concurrency < 1 or calls < 1:
        raise ValueError(f"--batch-size, --concurrency and --calls must be >= 1, got {batch_size}, {concurrency}, {calls}")
    rows: list[ClientRow] = []
    sb = build_sandbox(sandbox_kwargs)
    async with sb:
        async def embedded_counters() -> dict:
            return {k: sb.stats()[k] for k in _COUNTED}
        for name in workloads:
            rows += await _sandbox_rows(sb, name, concurrency, _calls(name, calls), "embedded", embedded_counters)
    with server_process(sandbox_kwargs, port) as url:
        async def http_counters() -> dict:
            return await _http_counters(url)
        async with RemoteSandbox(url) as remote:
            for name in workloads:
                rows += (await _sandbox_rows(remote, name, concurrency, _calls(name, calls), "http", http_counters))[:1]
                rows.append(await _codejudge_row(url, name, concurrency, _calls(name, calls), batch_size, http_counters))
    for row in rows:
        base = next(r for r in rows if r.workload == row.workload and r.path == "embedded" and r.client == "plain")
        row.vs_embedded_plain = round(row.calls_per_s / base.calls_per_s, 2)
        same = "plain" if row.client == "plain" else "wrapped"
        twin = next(r for r in rows if r.workload == row.workload and r.path == "embedded" and r.client == same)
        row.vs_embedded_same_code = round(row.calls_per_s / twin.calls_per_s, 2)
    return {"concurrency": concurrency, "batch_size": batch_size, "rows": [asdict(r) for r in rows]}


def _calls(name: str, calls: int) -> int:
    return calls if name == "trivial" else max(64, calls // 3)


def render_client_table(report: dict):
    from rich.table import Table

    table = Table(title=f"bench-tools --client codejudge (concurrency {report['concurrency']}, "
                        f"long-batch of {report['batch_size']})")
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
                      port: int, json_path, console) -> dict:
    """Run the client benchmark, print its table, write JSON when asked."""
    from pathlib import Path

    with console.status("bench-tools --client codejudge: embedded, then HTTP rows"):
        report = asyncio.run(run_client_bench(sandbox_kwargs, workloads, concurrency, calls, batch_size, port))
    if not console.is_terminal:
        console.width = max(console.width, 140)
    console.print(render_client_table(report))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_path}")
    return report
