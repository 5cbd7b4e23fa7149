"""`rstar2 preflight`: flags only; the checks are in `rstar2_cli.launch.preflight`."""
from __future__ import annotations

from typing import Optional

import typer

from rstar2_cli.commands import checks, fail


def register(app: typer.Typer) -> None:
    @app.command("preflight")
    def preflight(
        redis: Optional[str] = typer.Option(None, help="redis://host:port/db: the head node's Redis must answer PING."),
        sandbox_url: Optional[str] = typer.Option(
            None, help="http://host:port: the head node's sandbox front end must answer GET /ping."
        ),
        gpus_per_node: int = typer.Option(
            0, min=0, help="GPUs this node must see, each with its own UUID (not asked with RSTAR2_CPU_RANKS=1)."
        ),
        nodes: Optional[int] = typer.Option(
            None, min=1, help="Nodes of the job (default: SLURM_JOB_NUM_NODES, else 1)."
        ),
        timeout: float = typer.Option(5.0, help="Seconds each connection may take."),
    ) -> None:
        """Check this node before the trainers start: its GPUs and their UUIDs, the head node's Redis
        and sandbox front end, the gloo/NCCL interface. One line; refuses (exit 2) naming the node and
        what failed."""
        checks.positive(timeout, "--timeout")
        if redis is not None:
            checks.url(redis, "--redis", ("redis", "rediss", "unix"))
        if sandbox_url is not None:
            checks.url(sandbox_url, "--sandbox-url")
        from rstar2_cli.launch.preflight import run_preflight  # lazy: redis and torch on use; --help (cli.py)

        found = run_preflight(gpus_per_node=gpus_per_node, redis_url=redis, sandbox_url=sandbox_url, nodes=nodes,
                              timeout=timeout)
        if not found.ok:
            fail(found.line())
        typer.echo(found.line())
