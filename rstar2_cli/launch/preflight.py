"""`rstar2 preflight`: what one node of an allocation must have before the trainers start, checked
on every node by one step of the SLURM template (rstar2_cli/recipes/slurm_rl.sbatch), in one line
per node, so that a node that would fail an hour into the job (or hang until the 2 h collective
timeout) is named before the model loads.

The checks, and why:
- GPUs: the node sees `--gpus-per-node` GPUs, each with a non-empty UUID that no other of its GPUs
  has. vLLM's IPC weight push (the colocated path) keys each trainer rank's buffer handle by its
  GPU's UUID, and each engine worker opens the handle of its own GPU's UUID
  (vllm/distributed/weight_transfer/ipc_engine.py: `str(torch.cuda.get_device_properties(i).uuid)`);
  two GPUs reporting the same UUID (or none: empty or all zeros, as a ROCm build may report) would
  make a worker load another GPU's buffer.
- The head node's Redis (PING) and sandbox front end (`GET /ping`): every rollout host's tool calls
  go through them (`sandbox.url`), and a node that cannot reach them fails every tool call.
- The gloo/NCCL interface: GLOO_SOCKET_IFNAME (exact names, comma-separated: torch's gloo makes a
  device for each) and NCCL_SOCKET_IFNAME (prefixes; `=` exact names; a `^` list excludes and names
  nothing to find) must name interfaces this node has (`socket.if_nameindex`); with
  GLOO_SOCKET_IFNAME unset on several nodes, this host's name must resolve to an address other
  nodes can reach (`hosts/addresses.py`: gloo would otherwise listen on loopback).
With RSTAR2_CPU_RANKS=1 (the trainer ranks run on CPU, as in the CPU rehearsal of the template) the
GPUs are not asked for, and the line says "CPU ranks".
"""
from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rstar2_cli.hosts.addresses import INTERFACE_VARS, host_address, loopback_refusal, resolved

CPU_RANKS_ENV = "RSTAR2_CPU_RANKS"


@dataclass
class Preflight:
    """One node's findings: what passed (`seen`, the line's parts) and what failed (`problems`)."""
    node: str
    seen: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, seen: str | None, problem: str | None) -> None:
        if seen:
            self.seen.append(seen)
        if problem:
            self.problems.append(problem)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """The node's one line: what it has, or (refused) what failed."""
        if self.ok:
            return f"preflight {self.node}: " + "; ".join(self.seen)
        return f"preflight on {self.node} failed: " + "; ".join(self.problems)


def node_name(env: Mapping[str, str], hostname: str | None = None) -> str:
    """`node N (host)` under SLURM (SLURM_NODEID), else the host name."""
    host = hostname or socket.gethostname()
    return f"node {env['SLURM_NODEID']} ({host})" if env.get("SLURM_NODEID") else host


def cpu_ranks(env: Mapping[str, str]) -> bool:
    return env.get(CPU_RANKS_ENV, "").strip().lower() in ("1", "true", "yes")


def visible_gpu_uuids() -> list[str]:
    """Each visible GPU's UUID as vLLM's IPC weight transfer keys it (`str(props.uuid)`)."""
    import torch  # lazy: torch, only where GPUs are checked (`rstar2 --help` loads none, cli.py)

    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def _blank(uuid: str) -> bool:
    digits = uuid.strip().lower().removeprefix("gpu-").replace("-", "")
    return not digits or set(digits) == {"0"}


def gpu_findings(expected: int, uuids: Sequence[str]) -> tuple[str, str | None]:
    """(what the node has, what is wrong or None) for GPUs reporting `uuids`, `expected` of them."""
    problems, unusable = [], []
    if len(uuids) < expected:
        problems.append(f"sees {len(uuids)} GPU(s), expected {expected} (--gpus-per-node)")
    blank = [i for i, u in enumerate(uuids) if _blank(u)]
    if blank:
        unusable.append(f"GPU(s) {', '.join(map(str, blank))} report no UUID ({uuids[blank[0]]!r})")
    first: dict[str, int] = {}
    for i, u in enumerate(uuids):
        if i not in blank and u in first:
            unusable.append(f"GPUs {first[u]} and {i} report the same UUID {u}")
            break
        first.setdefault(u, i)
    if unusable:
        problems.append(", ".join(unusable) + " (vLLM's IPC weight push finds each GPU's buffer by its UUID: "
                        "a worker would load another GPU's)")
    return f"{len(uuids)} GPU(s), UUIDs {'not ' if unusable else ''}distinct", "; ".join(problems) or None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0]


def redis_findings(url: str, timeout: float) -> tuple[str | None, str | None]:
    """Redis at `url` answers PING within `timeout` seconds."""
    import redis  # lazy: the redis client, only when --redis is given (`rstar2 --help` stays light, cli.py)

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except (redis.RedisError, OSError) as e:
        return None, f"Redis {url} unreachable ({type(e).__name__}: {_first_line(e)})"
    finally:
        client.close()
    return f"Redis {url} answers", None


def sandbox_findings(url: str, timeout: float) -> tuple[str | None, str | None]:
    """The sandbox front end at `url` answers `GET /ping` with 200 within `timeout` seconds."""
    ping = url.rstrip("/") + "/ping"
    try:
        with urllib.request.urlopen(ping, timeout=timeout) as reply:
            status = reply.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return None, f"sandbox front end {ping} unreachable ({reason})"
    if status != 200:
        return None, f"sandbox front end {ping} answered HTTP {status}"
    return f"sandbox {url} answers", None


def missing_interfaces(var: str, value: str, present: Sequence[str]) -> list[str]:
    """The names of `var`'s value (GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME syntax, module docstring)
    that match no interface in `present`."""
    if var == "NCCL_SOCKET_IFNAME":
        if value.startswith("^"):
            return []
        exact, value = value.startswith("="), value.lstrip("=")
        names = [n.strip() for n in value.split(",") if n.strip()]
        matches = [n for n in names if any(p == n if exact else p.startswith(n) for p in present)]
        return [] if matches else names
    return [n.strip() for n in value.split(",") if n.strip() and n.strip() not in present]


def interface_findings(env: Mapping[str, str], nodes: int, head: str | None, *,
                       present: Callable[[], Sequence[str]] = lambda: [n for _, n in socket.if_nameindex()],
                       resolve: Callable[[str], str] = host_address,
                       hostname: str | None = None) -> tuple[str, str | None]:
    """The gloo/NCCL interface of this node on a job of `nodes` nodes whose head is `head`."""
    names = list(present())
    seen, problems = [], []
    for var in INTERFACE_VARS:
        value = env.get(var, "").strip()
        if not value:
            seen.append(f"{var} unset")
            continue
        missing = missing_interfaces(var, value, names)
        seen.append(f"{var}={value}")
        if missing:
            problems.append(f"{var}={value}: no interface {', '.join(missing)} on this node "
                            f"(it has {', '.join(names)})")
    if not env.get("GLOO_SOCKET_IFNAME", "").strip():
        why = loopback_refusal(nodes, env, head, resolve=resolve, hostname=hostname)
        if why is not None:
            problems.append(why)
        elif nodes > 1:
            name = hostname or socket.gethostname()
            seen.append(f"gloo binds {name} = {resolved(name, resolve)}")
    return ", ".join(seen), "; ".join(problems) or None


def run_preflight(*, gpus_per_node: int, redis_url: str | None, sandbox_url: str | None, nodes: int | None,
                  timeout: float, env: Mapping[str, str] | None = None,
                  gpu_uuids: Callable[[], list[str]] = visible_gpu_uuids) -> Preflight:
    """Every check of this node (module docstring). `nodes`: the job's node count (None:
    SLURM_JOB_NUM_NODES, else 1); the head node is the host of `redis_url` (or `sandbox_url`)."""
    env = os.environ if env is None else env
    nodes = nodes if nodes is not None else int(env.get("SLURM_JOB_NUM_NODES") or 1)
    found = Preflight(node_name(env))
    if cpu_ranks(env):
        found.add("CPU ranks", None)
    else:
        try:
            found.add(*gpu_findings(gpus_per_node, gpu_uuids()))
        except Exception as e:   # a driver or runtime that torch cannot use: one line, as the rest
            found.add(None, f"GPUs cannot be listed ({type(e).__name__}: {_first_line(e)})")
    if redis_url:
        found.add(*redis_findings(redis_url, timeout))
    if sandbox_url:
        found.add(*sandbox_findings(sandbox_url, timeout))
    head = urlsplit(redis_url or sandbox_url or "").hostname or env.get("MASTER_ADDR")
    found.add(*interface_findings(env, nodes, head))
    return found
