"""`rstar2 serve-sandbox` and `rstar2 bench-tools`: flags only; the work is in `sandbox.service.launch`,
`sandbox.redis_mode.launch` and `rstar2_cli.sandbox_bench`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from rstar2_cli.commands import checks, fail

ISOLATIONS = ("auto", "nsjail", "bwrap", "namespaces", "none")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")   # uvicorn.config.LOG_LEVELS


def pool_kwargs(workers, isolation, unsafe, timeout, memory_mb, max_output_bytes) -> dict:
    """The pool's kwargs (JSON-able: Redis workers get them on their command line). RL wraps every
    call in its code runner, so the pool knows that runner's prelude (its template fast path)."""
    from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE  # lazy: pydantic, for --help's speed (cli.py)

    if isolation not in ISOLATIONS:
        raise typer.BadParameter(f"--isolation {isolation!r}: choose one of {', '.join(ISOLATIONS)}")
    limits = {"timeout": timeout, "cpu_time": timeout, "memory_mb": memory_mb, "max_output_bytes": max_output_bytes}
    return {"workers": workers, "isolation": isolation, "unsafe_no_isolation": unsafe, "limits": limits,
            "preludes": [RUNNER_PRELUDE]}


def register(app: typer.Typer) -> None:
    @app.command("serve-sandbox")
    def serve_sandbox(
        host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
        port: int = typer.Option(8088, min=1, max=65535, help="Port (rStar2-Agent's tool config expects 8088)."),
        redis: Optional[str] = typer.Option(
            None, help="redis://host:port: queue calls in Redis for --worker processes."
        ),
        worker: bool = typer.Option(
            False, "--worker", help="Run Redis workers (needs --redis) instead of the HTTP API."
        ),
        procs: int = typer.Option(1, min=1, help="--worker: supervised worker processes (dead ones are replaced)."),
        concurrency: Optional[int] = typer.Option(
            None, min=1, help="--worker: calls in flight per process [default: 2x workers]."
        ),
        workers: Optional[int] = typer.Option(
            None, min=1, help="Sandbox pool size (zygote processes) [default: CPU count]."
        ),
        isolation: str = typer.Option("auto", help=" | ".join(ISOLATIONS) + "."),
        unsafe_no_isolation: bool = typer.Option(False, "--unsafe-no-isolation", help="Allow running code unconfined."),
        timeout: float = typer.Option(10.0, help="Default per-call wall/CPU timeout, seconds."),
        memory_mb: int = typer.Option(1024, min=1, help="Per-call memory allowance, MiB."),
        max_output_bytes: int = typer.Option(65536, min=1, help="Per-call stdout+stderr cap, bytes."),
        max_queue: int = typer.Option(512, min=1, help="Calls admitted at once; /run answers 429 beyond it."),
        max_batch: int = typer.Option(4096, min=1, help="Submissions per batch request."),
        max_body_mb: float = typer.Option(32.0, help="Largest request body, MiB (413 beyond)."),
        long_batch_wait: float = typer.Option(
            600.0, help="Seconds a long-batch call waits for room before queue_timeout."
        ),
        lease: float = typer.Option(10.0, help="Redis: seconds without heartbeat before a worker counts as dead."),
        redis_wait: float = typer.Option(30.0, help="Redis: seconds a start waits for it to answer, then refuses."),
        max_attempts: int = typer.Option(
            2, min=1, help="Redis: runs of a call before a worker death becomes an error result."
        ),
        check: bool = typer.Option(
            False, "--check", help="Print which protections are active; exit 0 if isolated, else 1."
        ),
        log_level: str = typer.Option("warning", help="uvicorn log level: " + " | ".join(LOG_LEVELS) + "."),
    ) -> None:
        """Serve the Python tool sandbox over code-judge's HTTP API (what rStar2-Agent's tool config calls)."""
        checks.choice(isolation, ISOLATIONS, "--isolation")
        checks.choice(log_level, LOG_LEVELS, "--log-level")
        for flag, value in (("--timeout", timeout), ("--max-body-mb", max_body_mb),
                            ("--long-batch-wait", long_batch_wait), ("--lease", lease), ("--redis-wait", redis_wait)):
            checks.positive(value, flag)
        if redis is not None:
            checks.url(redis, "--redis", ("redis", "rediss", "unix"))
        if not (check or worker):
            checks.free_port(host, port)
        from sandbox.jail.backends import SandboxUnavailable  # lazy: ctypes and the jail, for --help (cli.py)
        from sandbox.redis_mode.launch import serve_frontend, serve_workers  # lazy: redis, fastapi; --help (cli.py)
        from sandbox.redis_mode.wire import RedisConfig  # lazy: redis, for --help's speed (cli.py)
        from sandbox.service.launch import print_isolation_check, serve_http  # lazy: fastapi; --help (cli.py)
        from sandbox.service.server import ServiceConfig  # lazy: fastapi, for --help's speed (cli.py)

        kwargs = pool_kwargs(workers, isolation, unsafe_no_isolation, timeout, memory_mb, max_output_bytes)
        if check:
            raise typer.Exit(0 if print_isolation_check(kwargs, Console()) else 1)
        try:
            rcfg = None if redis is None else RedisConfig(redis, lease=lease, max_attempts=max_attempts,
                                                           queue_wait=long_batch_wait, default_timeout=timeout)
            if worker:
                if rcfg is None:
                    fail("--worker needs --redis redis://host:port")
                serve_workers(rcfg, kwargs, concurrency or 2 * (workers or _cpu_count()), procs, redis_wait)
            else:
                scfg = ServiceConfig(max_queue=max_queue, max_batch=max_batch,
                                     max_body_bytes=int(max_body_mb * 1024 * 1024), long_batch_wait=long_batch_wait,
                                     timeout=timeout)
                if rcfg is None:
                    serve_http(host, port, kwargs, scfg, log_level)
                else:
                    serve_frontend(host, port, rcfg, scfg, log_level, redis_wait)
        except SandboxUnavailable as e:
            fail(f"{e} [to serve anyway: --unsafe-no-isolation]")
        except ValueError as e:
            fail(str(e))

    @app.command("bench-tools")
    def bench_tools(
        url: Optional[str] = typer.Option(
            None, help="Benchmark a running server (http://host:port) instead of the embedded pool."
        ),
        concurrency: str = typer.Option("1,8,64", help="Comma-separated concurrency levels."),
        calls: int = typer.Option(200, min=1, help="Calls per (workload, concurrency)."),
        workloads: str = typer.Option("trivial,sympy,numpy,error,timeout", help="Comma-separated workloads."),
        no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the subprocess.run baseline."),
        baseline_calls: int = typer.Option(24, min=1, help="Calls per baseline row (the baseline is slow)."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report here as JSON."),
        workers: Optional[int] = typer.Option(None, min=1, help="Embedded pool size [default: CPU count]."),
        isolation: str = typer.Option("auto", help="Embedded pool: " + " | ".join(ISOLATIONS) + "."),
        unsafe_no_isolation: bool = typer.Option(
            False, "--unsafe-no-isolation", help="Allow an unconfined embedded pool."
        ),
        client: str = typer.Option(
            "plain",
            help="plain | codejudge (also wrapped and over HTTP long-batch, as the "
            "rStar release's client sends them) | redis (Redis mode with 1 "
            "and 2 worker hosts against local mode).",
        ),
        batch_size: int = typer.Option(8, min=1, help="--client codejudge: submissions per long-batch request."),
        port: int = typer.Option(
            18088, min=1, max=65535, help="--client codejudge: port of the server subprocess it starts."
        ),
        rounds: int = typer.Option(
            3,
            min=1,
            help="--client codejudge: rounds the rows take turns in (a shared "
            "machine's load then hits every row alike).",
        ),
    ) -> None:
        """Measure tool-call throughput and latency against a naive subprocess baseline."""
        from rstar2_cli.sandbox_bench.plain import WORKLOADS, BenchConfig, bench_main  # lazy: numpy, httpx (cli.py)
        from sandbox.jail.backends import SandboxUnavailable  # lazy: ctypes and the jail, for --help (cli.py)

        checks.choice(client, ("plain", "codejudge", "redis"), "--client")
        checks.choice(isolation, ISOLATIONS, "--isolation")
        levels = checks.int_list(concurrency, "--concurrency")
        names = [w.strip() for w in workloads.split(",") if w.strip()]
        for name in names or [workloads]:
            checks.choice(name, WORKLOADS, "--workloads")
        if url is not None:
            checks.url(url, "--url")
        if json_path is not None:
            checks.output_file(json_path, "--json")
        if client == "codejudge":
            checks.free_port("127.0.0.1", port)
        if client != "plain":
            from rstar2_cli.sandbox_bench.codejudge import client_bench_main  # lazy: httpx, for --help (cli.py)
            from rstar2_cli.sandbox_bench.redis_hosts import redis_bench_main  # lazy: redis, for --help (cli.py)

            try:
                kwargs = pool_kwargs(workers, isolation, unsafe_no_isolation, 10.0, 1024, 65536)
                if client == "redis":
                    redis_bench_main(kwargs, names, levels[-1], calls, json_path, Console())
                else:
                    client_bench_main(kwargs, names, levels[-1], calls, batch_size, port, json_path, Console(), rounds)
            except SandboxUnavailable as e:
                fail(f"{e} [to benchmark anyway: --unsafe-no-isolation]")
            except ValueError as e:
                fail(str(e))
            return

        try:
            cfg = BenchConfig(concurrency=levels, calls=calls, baseline=not no_baseline, baseline_calls=baseline_calls,
                              workloads=names)
            kwargs = pool_kwargs(workers, isolation, unsafe_no_isolation, 10.0, 1024, 65536)
            bench_main(cfg, url, kwargs, json_path, Console())
        except SandboxUnavailable as e:
            fail(f"{e} [to benchmark anyway: --unsafe-no-isolation]")
        except ValueError as e:
            fail(str(e))


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 1
