"""Tool-call throughput benchmark: our sandbox vs. a naive `subprocess.run` baseline, same run.

Why a baseline in the same process run: machines are noisy (shared CI cores, laptops), so an
absolute calls/s figure says little; the ratio to spawning a fresh interpreter per call (what
most agent code does) under the same concurrency and the same moment is what we track.
Works against anything with the Sandbox API: the embedded pool or a `RemoteSandbox(url)`.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from textwrap import shorten
from typing import Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rstar2_cli.sandbox_bench.timing import percentile_ms
from sandbox.service.client import RemoteSandbox, SandboxUnreachable
from sandbox.service.embedded import build_sandbox


@dataclass(frozen=True)
class Workload:
    code: str
    expect: str                  # the RunResult.reason a correct sandbox gives
    timeout: float | None = None  # per-call timeout (the timeout workload's short one)


WORKLOADS: dict[str, Workload] = {
    "trivial": Workload("print(1+1)", "ok"),
    "sympy": Workload("import sympy; print(sympy.factorint(2**61-1))", "ok"),
    "numpy": Workload("import numpy as np\na = np.random.default_rng(0).random((96, 96))\n"
                      "x = np.linalg.solve(a @ a.T + np.eye(96), np.ones(96))\n"
                      "print(round(float(np.linalg.det(a[:8, :8])), 6), round(float(x.sum()), 6))", "ok"),
    "error": Workload("def f(x):\n    return 1 / x\nf(0)", "runtime_error"),
    "timeout": Workload("while True:\n    pass", "timeout", timeout=0.25),
}

# How long `--url`'s server has to answer one /status before the benchmark gives up on it: the
# client's own retries ride out ~25 s of a server restarting, which is a hang to someone who
# mistyped the port.
PROBE_S = 3.0

# The targets each run is checked against (workload, concurrency, min calls/s, max p99 ms,
# min ratio to baseline).
TARGETS = [("trivial", 64, 1000.0, 50.0, None), ("sympy", 64, 150.0, None, 50.0)]


@dataclass
class BenchConfig:
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 64])
    calls: int = 200
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    baseline: bool = True
    baseline_calls: int = 24    # the baseline is slow; fewer calls keep the run bounded
    timeout_calls: int = 16     # each timeout call takes its whole timeout

    def __post_init__(self) -> None:
        if not self.concurrency or any(c <= 0 for c in self.concurrency):
            raise ValueError(f"BenchConfig.concurrency: positive integers required, got {self.concurrency!r}")
        if self.calls <= 0 or self.baseline_calls <= 0 or self.timeout_calls <= 0:
            raise ValueError(f"BenchConfig: calls, baseline_calls, timeout_calls must be > 0, got "
                             f"{self.calls}, {self.baseline_calls}, {self.timeout_calls}")
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"BenchConfig.workloads: unknown {unknown}; choose from {list(WORKLOADS)}")

    def calls_for(self, workload: str, baseline: bool) -> int:
        n = min(self.calls, self.baseline_calls) if baseline else self.calls
        return min(n, self.timeout_calls) if workload == "timeout" else n


@dataclass
class Row:
    workload: str
    mode: str                # "sandbox" | "baseline"
    concurrency: int
    calls: int
    seconds: float
    calls_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int              # calls whose outcome was not the expected one
    vs_baseline: float | None = None
    first_error: str | None = None  # what the first unexpected outcome was, for diagnosis


def _row(workload: str, mode: str, c: int, latencies: list[float], errors: list[str], seconds: float) -> Row:
    p50, p95, p99 = (percentile_ms(latencies, q) for q in (50, 95, 99))
    return Row(workload, mode, c, len(latencies), round(seconds, 4), round(len(latencies) / seconds, 2),
               p50, p95, p99, len(errors), first_error=errors[0] if errors else None)


def _describe(reason: str, stderr: str) -> str:
    return f"{reason}: {stderr.strip()[-200:]}"


async def bench_sandbox(sb, name: str, c: int, n: int, advance: Callable[[], None]) -> Row:
    wl, sem = WORKLOADS[name], asyncio.Semaphore(c)
    latencies: list[float] = []
    errors: list[str] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            res = await sb.run(wl.code, timeout=wl.timeout)
            latencies.append(time.perf_counter() - t0)
            if res.reason != wl.expect:
                errors.append(_describe(res.reason, res.stderr))
            advance()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return _row(name, "sandbox", c, latencies, errors, time.perf_counter() - start)


def _baseline_call(wl: Workload) -> tuple[float, str | None]:
    """One naive call; (latency, None) or (latency, what went unexpectedly)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", wl.code], capture_output=True, text=True,
                              timeout=wl.timeout or 60)
        reason, stderr = ("ok" if proc.returncode == 0 else "runtime_error"), proc.stderr
    except subprocess.TimeoutExpired:
        reason, stderr = "timeout", ""
    return time.perf_counter() - t0, None if reason == wl.expect else _describe(reason, stderr)


def bench_baseline(name: str, c: int, n: int, advance: Callable[[], None]) -> Row:
    wl = WORKLOADS[name]
    latencies, errors = [], []
    start = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        for latency, error in pool.map(lambda _: _baseline_call(wl), range(n)):
            latencies.append(latency)
            if error is not None:
                errors.append(error)
            advance()
    return _row(name, "baseline", c, latencies, errors, time.perf_counter() - start)


def _targets(rows: list[Row]) -> list[dict]:
    out = []
    for name, c, min_rate, max_p99, min_ratio in TARGETS:
        row = next((r for r in rows if r.workload == name and r.mode == "sandbox" and r.concurrency == c), None)
        if row is None:
            continue
        checks = [row.calls_per_s >= min_rate, max_p99 is None or row.p99_ms < max_p99,
                  min_ratio is None or (row.vs_baseline is not None and row.vs_baseline >= min_ratio)]
        out.append({"workload": name, "concurrency": c, "min_calls_per_s": min_rate, "max_p99_ms": max_p99,
                    "min_vs_baseline": min_ratio, "calls_per_s": row.calls_per_s, "p99_ms": row.p99_ms,
                    "vs_baseline": row.vs_baseline, "met": all(checks)})
    return out


async def run_bench(sb, cfg: BenchConfig, progress=None, target: str = "embedded") -> dict:
    """Run every (workload, concurrency) on `sb` and then, unless disabled, on the baseline.

    All sandbox rows run before the baseline rows: a baseline row starts and reaps dozens of
    interpreters, and the machine is still busy with that when the next row begins. Each sandbox
    row also starts with an unmeasured warm-up at its own concurrency.
    """
    for name in cfg.workloads:  # warm-up: pool start, first imports; not measured
        await sb.run(WORKLOADS[name].code, timeout=WORKLOADS[name].timeout)
    cells = [(name, c) for name in cfg.workloads for c in cfg.concurrency]
    rows: dict[tuple[str, int, str], Row] = {}

    def advance_for(name: str, c: int, mode: str, n: int) -> Callable[[], None]:
        if progress is None:
            return lambda: None
        task = progress.add_task(f"{name:8s} c={c:<3d} {mode}", total=n)
        return lambda: progress.advance(task)

    for name, c in cells:
        n = cfg.calls_for(name, baseline=False)
        advance = advance_for(name, c, "sandbox", n)
        await bench_sandbox(sb, name, c, min(n, 2 * c), lambda: None)
        rows[name, c, "sandbox"] = await bench_sandbox(sb, name, c, n, advance)
    if cfg.baseline:
        for name, c in cells:
            n = cfg.calls_for(name, baseline=True)
            base = rows[name, c, "baseline"] = await asyncio.to_thread(
                bench_baseline, name, c, n, advance_for(name, c, "baseline", n))
            ours = rows[name, c, "sandbox"]
            ours.vs_baseline = round(ours.calls_per_s / base.calls_per_s, 2)
    ordered = [rows[key] for name, c in cells for key in ((name, c, "sandbox"), (name, c, "baseline")) if key in rows]
    return {"target": target, "config": asdict(cfg), "rows": [asdict(r) for r in ordered],
            "targets": _targets(ordered)}


def render_table(report: dict):
    table = Table(title=f"bench-tools ({report['target']})")
    for col in ("workload", "mode", "conc.", "calls", "calls/s", "p50 ms", "p95 ms", "p99 ms", "errors", "vs baseline"):
        table.add_column(col, justify="left" if col in ("workload", "mode") else "right")
    for r in report["rows"]:
        ratio = "" if r["vs_baseline"] is None else f"{r['vs_baseline']:.1f}x"
        table.add_row(r["workload"], r["mode"], str(r["concurrency"]), str(r["calls"]), f"{r['calls_per_s']:.1f}",
                      f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      str(r["errors"]), ratio, style="dim" if r["mode"] == "baseline" else None)
    return table


async def probe_server(url: str, timeout: float = PROBE_S) -> None:
    """One /status request, no retries: a ValueError in one line when nothing answers at `url`."""
    try:
        async with RemoteSandbox(url, timeout=timeout, retries=0) as sb:
            await sb.status()
    except SandboxUnreachable as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        raise ValueError(f"--url {url}: no sandbox server answers ({type(cause).__name__}: "
                         f"{str(cause) or 'no answer'}); start one with `rstar2 serve-sandbox`") from None
    except ValueError as e:
        raise ValueError(f"--url {url}: not a sandbox server ({shorten(str(e), 160)})") from None


def bench_main(cfg: BenchConfig, url: str | None, sandbox_kwargs: dict, json_path, console) -> dict:
    """`rstar2 bench-tools`: run the benchmark with a progress bar, print the table, write JSON."""
    if url:
        asyncio.run(probe_server(url))
    sb = RemoteSandbox(url) if url else build_sandbox(sandbox_kwargs)

    async def go() -> dict:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        async with sb:
            # a slow refresh: the display shares the GIL with the pool it measures
            with Progress(*columns, console=console, transient=False, refresh_per_second=2) as progress:
                return await run_bench(sb, cfg, progress, target=url or "embedded")

    report = asyncio.run(go())
    if not console.is_terminal:  # logs and CI: do not squeeze the table to 80 columns
        console.width = max(console.width, 120)
    console.print(render_table(report))
    for t in report["targets"]:
        verdict = "[green]met[/]" if t["met"] else "[yellow]not met[/]"
        console.print(f"target {t['workload']} @ c={t['concurrency']}: {verdict} ({t['calls_per_s']:.0f} calls/s, "
                      f"p99 {t['p99_ms']:.1f} ms, vs baseline {t['vs_baseline']})")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_path}")
    return report
