"""Entry points behind `rstar2 serve-sandbox` on an embedded pool: the HTTP service and the
isolation check (`--check`), which shows what is really enforced. Redis mode's entry points are
in sandbox.redis_mode.launch."""
from __future__ import annotations

import asyncio
import sys

from sandbox.jail.backends import SandboxUnavailable
from sandbox.service.embedded import build_sandbox
from sandbox.service.server import ServiceConfig, serve

# Without these a snippet can reach the network, write the host, read secrets or exhaust it.
ESSENTIAL = ("network", "readonly_fs", "env_cleared", "non_root", "rlimits")


def isolation_report(sandbox_kwargs: dict) -> tuple[dict, list[str], list[str]]:
    """(protections, essential ones missing, others missing), measured by the core's probe."""
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


def serve_http(host: str, port: int, sandbox_kwargs: dict, config: ServiceConfig, log_level: str = "warning") -> None:
    """Serve the code-judge API on an embedded Sandbox (blocking)."""
    # A pool on the server's loop (own_thread False) gets asyncio's loop, not uvloop: uvloop's spawn
    # runs Python in the forked child, and a zygote spawn hung there (docs/sandbox.md, "HTTP path").
    on_loop = sandbox_kwargs.get("own_thread", True) is False
    backend = build_sandbox(sandbox_kwargs)
    print(f"rstar2 sandbox service on http://{host}:{port} (embedded pool)", file=sys.stderr, flush=True)
    serve(backend, config, host=host, port=port, log_level=log_level, loop="asyncio" if on_loop else "auto")
