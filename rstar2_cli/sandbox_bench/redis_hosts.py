"""`rstar2 bench-tools --client redis`: Redis mode with 1 and 2 worker hosts against local mode.

Why in one run: the figures only mean something next to each other on the same (shared, noisy)
machine. Each row sends the same calls through `RemoteSandbox` (HTTP long-batch) to a
`serve-sandbox` subprocess: first one serving its own embedded pool, then one in front of a
throwaway redis-server with one, then two, worker host processes (each hosting a pool like the
local one). On a single machine a second host adds no cores, so that row shows the cost of the
queue rather than a speed-up; across machines each host brings its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
from rich.table import Table

from rstar2_cli.sandbox_bench.codejudge import CODEJUDGE_WORKLOADS, calls_for
from rstar2_cli.sandbox_bench.server import server_process
from rstar2_cli.sandbox_bench.timing import percentile_ms, timed
from sandbox.redis_mode.local_server import free_port, redis_server_process
from sandbox.redis_mode.wire import RedisConfig
from sandbox.service.client import RemoteSandbox
from sandbox.redis_mode.worker import worker_argv


@dataclass
class RedisRow:
    mode: str           # local | redis
    hosts: int          # worker hosts (0 for local)
    workload: str
    concurrency: int
    calls: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    failures: int
    vs_local: float | None = None


def _start_host(url: str, sandbox_kwargs: dict, concurrency: int) -> subprocess.Popen:
    return subprocess.Popen(worker_argv(RedisConfig(url), sandbox_kwargs, concurrency), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_hosts(url: str, n: int) -> None:
    r, key = redis.Redis.from_url(url), RedisConfig(url).heartbeat("*")
    deadline = time.monotonic() + 180
    while len(list(r.scan_iter(match=key))) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} Redis worker host(s) did not start within 180 s")
        time.sleep(0.2)


async def _measure(url: str, name: str, c: int, n: int) -> tuple[float, list[float], list[str]]:
    code, expect = CODEJUDGE_WORKLOADS[name]
    async with RemoteSandbox(url) as remote:
        async def one() -> str | None:
            res = await remote.run(code)
            return None if res.ok and res.stdout == expect else f"{res.reason}: {res.stderr[-150:]!r}"
        await timed(min(n, 2 * c), c, one)
        return await timed(n, c, one)


def run_redis_bench(sandbox_kwargs: dict, workloads: list[str], concurrency: int, calls: int) -> dict:
    rows: list[RedisRow] = []

    def add(mode: str, hosts: int, url: str) -> None:
        for name in workloads:
            n = calls_for(name, calls)
            seconds, latencies, failures = asyncio.run(_measure(url, name, concurrency, n))
            rows.append(RedisRow(mode, hosts, name, concurrency, n, round(n / seconds, 1),
                                 percentile_ms(latencies, 50), percentile_ms(latencies, 99), len(failures)))

    with server_process(sandbox_kwargs, free_port()) as url:
        add("local", 0, url)
    per_host = 2 * (sandbox_kwargs.get("workers") or os.cpu_count() or 1) * 8
    with redis_server_process() as redis_url, server_process(sandbox_kwargs, free_port(), redis_url) as url:
        hosts = [_start_host(redis_url, sandbox_kwargs, per_host)]
        try:
            _wait_hosts(redis_url, 1)
            add("redis", 1, url)
            hosts.append(_start_host(redis_url, sandbox_kwargs, per_host))
            _wait_hosts(redis_url, 2)
            add("redis", 2, url)
        finally:
            for host in hosts:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(host.pid, signal.SIGTERM)
            for host in hosts:
                try:
                    host.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(host.pid, signal.SIGKILL)
    for row in rows:
        local = next(r for r in rows if r.mode == "local" and r.workload == row.workload)
        row.vs_local = round(row.calls_per_s / local.calls_per_s, 2)
    return {"concurrency": concurrency, "rows": [asdict(r) for r in rows]}


def redis_bench_main(sandbox_kwargs: dict, workloads: list[str], concurrency: int, calls: int, json_path,
                     console) -> dict:
    unknown = [w for w in workloads if w not in CODEJUDGE_WORKLOADS]
    if unknown:
        raise ValueError(f"--workloads: {unknown} not available with --client redis; choose from "
                         f"{list(CODEJUDGE_WORKLOADS)}")
    if shutil.which("redis-server") is None:
        raise ValueError("--client redis needs redis-server on PATH")
    with console.status("bench-tools --client redis: local, then Redis with 1 and 2 worker hosts"):
        report = run_redis_bench(sandbox_kwargs, workloads, concurrency, calls)
    table = Table(title=f"bench-tools --client redis (concurrency {concurrency}, HTTP long-batch)")
    for col in ("mode", "hosts", "workload", "calls", "calls/s", "p50 ms", "p99 ms", "failures", "vs local"):
        table.add_column(col, justify="left" if col in ("mode", "workload") else "right")
    for r in report["rows"]:
        table.add_row(r["mode"], str(r["hosts"]), r["workload"], str(r["calls"]), f"{r['calls_per_s']:.1f}",
                      f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", str(r["failures"]), f"{r['vs_local']:.2f}x")
    if not console.is_terminal:
        console.width = max(console.width, 120)
    console.print(table)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_path}")
    return report
