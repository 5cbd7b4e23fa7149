"""Entry points behind `rstar2 serve-sandbox`: the HTTP front end, Redis workers, the isolation check.

Why a preflight here on top of the core's own gate: a service accepts code from anyone who can
reach its port, so it must refuse to come up unconfined (unless the operator passed
`--unsafe-no-isolation`) BEFORE it binds the port or forks workers, with one clear line rather
than a traceback from inside uvicorn's startup; and `--check` shows what is really enforced.
"""
from __future__ import annotations

import asyncio
import sys

from sandbox.redis_mode import RedisConfig, RedisFrontend
from sandbox.redis_worker import supervise, worker_argv
from sandbox.server import ServiceConfig, serve


# Without these a snippet can reach the network, write the host, read secrets or exhaust it.
ESSENTIAL = ("network", "readonly_fs", "env_cleared", "non_root", "rlimits")


def preflight(sandbox_kwargs: dict) -> str:
    """The isolation backend these kwargs get, without starting a pool; raises SandboxUnavailable
    (one line, naming what is missing) when isolation is unavailable and not explicitly waived."""
    from sandbox.jail import plan

    return plan(sandbox_kwargs.get("isolation", "auto"), bool(sandbox_kwargs.get("unsafe_no_isolation")),
                sandbox_kwargs.get("workers") or 1, None).backend


def build_sandbox(sandbox_kwargs: dict):
    """A core Sandbox from plain kwargs (limits as a dict), after the isolation preflight."""
    preflight(sandbox_kwargs)
    return sandbox_from_kwargs(sandbox_kwargs)


def sandbox_from_kwargs(sandbox_kwargs: dict):
    """A core Sandbox from plain (JSON-able) kwargs: `limits` may be a dict of Limits fields."""
    from sandbox.api import Sandbox
    from sandbox.limits import Limits

    kwargs = dict(sandbox_kwargs)
    if kwargs.get("limits") is not None:
        kwargs["limits"] = Limits(**kwargs["limits"])
    return Sandbox(**kwargs)


def isolation_report(sandbox_kwargs: dict) -> tuple[dict, list[str], list[str]]:
    """(protections, essential ones missing, others missing), measured by the core's probe."""
    from sandbox.jail import SandboxUnavailable

    try:
        sb = build_sandbox({**sandbox_kwargs, "unsafe_no_isolation": False})
    except SandboxUnavailable as e:
        return {"backend": "unavailable", "reason": str(e)}, ["backend"], []
    try:
        prot = sb.protections()
    finally:
        asyncio.run(sb.close())
    if "probe_error" in prot:
        return prot, ["probe"], []
    missing = [k for k in ESSENTIAL if prot.get(k) is not True]
    others = [k for k, v in prot.items() if v is False and k not in ESSENTIAL]
    return prot, missing, others


def print_isolation_check(sandbox_kwargs: dict, console) -> bool:
    """Print which protections are active as a rich table; True when the essential ones are."""
    from rich.table import Table

    prot, missing, others = isolation_report(sandbox_kwargs)
    table = Table(title="sandbox protections")
    table.add_column("protection")
    table.add_column("active")
    for key, value in prot.items():
        shown = ("[green]yes[/]" if value else "[red]no[/]") if isinstance(value, bool) else str(value)
        table.add_row(key + (" (essential)" if key in ESSENTIAL else ""), shown)
    console.print(table)
    if missing:
        console.print(f"[red]NOT isolated:[/] missing {', '.join(missing)}")
    else:
        console.print("[green]isolated[/]" + (f" (also off: {', '.join(others)})" if others else ""))
    return not missing


def serve_http(host: str, port: int, sandbox_kwargs: dict, config: ServiceConfig,
               redis: RedisConfig | None, log_level: str = "warning") -> None:
    """Serve the code-judge API on an embedded Sandbox, or in front of Redis workers."""
    # Redis front ends run no code; each worker applies the isolation gate itself.
    # A pool on the server's loop (own_thread False) gets asyncio's loop, not uvloop: uvloop's spawn
    # runs Python in the forked child, and a zygote spawn hung there (docs/sandbox.md, "HTTP path").
    on_loop = redis is None and sandbox_kwargs.get("own_thread", True) is False
    backend = RedisFrontend(redis) if redis is not None else build_sandbox(sandbox_kwargs)
    print(f"rstar2 sandbox service on http://{host}:{port} "
          f"({'redis ' + redis.url if redis else 'embedded pool'})", file=sys.stderr, flush=True)
    serve(backend, config, host=host, port=port, log_level=log_level, loop="asyncio" if on_loop else "auto")


def serve_workers(redis: RedisConfig, sandbox_kwargs: dict, concurrency: int, procs: int) -> None:
    """Run `procs` supervised Redis worker processes; each hosts one embedded Sandbox."""
    preflight(sandbox_kwargs)  # fail here, once, with a clear message if isolation is missing
    print(f"rstar2 sandbox workers: {procs} process(es) x {concurrency} calls on {redis.url}",
          file=sys.stderr, flush=True)
    supervise(worker_argv(redis, sandbox_kwargs, concurrency), procs)
