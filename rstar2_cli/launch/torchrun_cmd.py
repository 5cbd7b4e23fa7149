"""The exact command lines a plan prints, built as argv tuples so nothing is lost to quoting.

Kept apart from the placement arithmetic in `topology.py` so the SLURM template, the docs and
the dry run all agree on one spelling of the torchrun, Redis and sandbox commands.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

# Flag spellings of `rstar2 serve-sandbox` that the plans print (one place to change them).
SANDBOX_WORKERS_FLAG = "--workers"
SANDBOX_HTTP_PORT = 8088
DEFAULT_REDIS_PORT = 6379


def torchrun_argv(
    *,
    nnodes: int,
    nproc_per_node: int,
    node_rank: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    entry_module: str,
    recipe_args: Sequence[str] = (),
) -> tuple[str, ...]:
    """torchrun with a c10d rendezvous on the head node; one call per node, same endpoint."""
    if nnodes == 1:
        rdzv = ("--standalone",)  # a free local port, no endpoint to agree on
    else:
        rdzv = ("--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id)
    return ("torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            *rdzv, "-m", entry_module, *recipe_args)


def direct_argv(entry_module: str, recipe_args: Sequence[str] = ()) -> tuple[str, ...]:
    """One process, no rendezvous: CPU runs and single-GPU runs."""
    return ("python", "-m", entry_module, *recipe_args)


def redis_server_argv(port: int = DEFAULT_REDIS_PORT) -> tuple[str, ...]:
    """A throwaway queue: no persistence, reachable from the other nodes."""
    return ("redis-server", "--port", str(port), "--bind", "0.0.0.0", "--protected-mode", "no",
            "--save", "", "--appendonly", "no")


def sandbox_head_commands(redis_url: str, *, start_redis: bool) -> tuple[str, ...]:
    port = _port_of(redis_url)
    lines = [shell_line(redis_server_argv(port))] if start_redis else []
    lines.append(shell_line(("rstar2", "serve-sandbox", "--redis", redis_url,
                             "--host", "0.0.0.0", "--port", str(SANDBOX_HTTP_PORT))))
    return tuple(lines)


def sandbox_worker_command(redis_url: str, workers: int) -> str:
    return shell_line(("rstar2", "serve-sandbox", "--worker", "--redis", redis_url, SANDBOX_WORKERS_FLAG, str(workers)))


def sandbox_local_command(workers: int) -> str:
    return shell_line(("rstar2", "serve-sandbox", SANDBOX_WORKERS_FLAG, str(workers)))


def shell_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """argv (and leading VAR=value pairs) as one copy-pasteable POSIX shell line."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join([*prefix, shlex.join(argv)])


def _port_of(redis_url: str) -> int:
    try:
        port = urlsplit(redis_url).port
    except ValueError:   # a malformed port: the default, as for a URL without one
        return DEFAULT_REDIS_PORT
    return DEFAULT_REDIS_PORT if port is None else port

