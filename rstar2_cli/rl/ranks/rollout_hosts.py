"""Which ranks roll out, on which GPUs, and which prompts each one takes.

Why one rollout host per node: a node's engines are best driven by one process (one scheduler
that load-balances over all of the node's replicas), and the engines of every node must work at
once, or a 64-GPU run generates with one node's GPUs while the other seven wait. So the local
rank 0 of every node is that node's rollout host: it starts the node's vLLM replicas and its
sandbox (pool or cluster client), rolls out its shard of the step's prompts, and selects the
trajectories to train among them (`trainer.py`, `exchange.py`).

Where the engines go comes from the launch plan (`rstar2_cli/launch/topology.py`), which sets
per node `RSTAR2_ENGINE_GPU_IDS` (GPU ids on that node; consecutive groups of the TP size form
one replica) and `RSTAR2_ENGINE_TP`. Without them (CPU, one GPU, a hand-written torchrun line)
every host starts the recipe's `engine.replicas` replicas on its default device. Node index and
node count come from torchrun's `GROUP_RANK` / `GROUP_WORLD_SIZE`, or from `RANK`, `WORLD_SIZE`
and `LOCAL_WORLD_SIZE` when another launcher started the processes.

Everything here is a pure function of the environment mapping and the recipe, so it is tested
without a process group.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rstar2_cli.launch.topology import ENGINE_GPUS_ENV, ENGINE_TP_ENV

if TYPE_CHECKING:   # a type only: the GPU proof imports this floor where pydantic is absent
    from rstar2_cli.config import EngineConfig


class RolloutHostError(ValueError):
    """A malformed launch environment; the message is one line naming the variable and value."""


@dataclass(frozen=True)
class EngineSlot:
    """One replica to start: `gpu_ids` are node-local ids (None: the process's default device)."""

    gpu_ids: tuple[int, ...] | None
    tp_size: int


@dataclass(frozen=True)
class RolloutHostPlan:
    """This process's part in the rollout phase."""

    node_index: int
    num_nodes: int
    is_host: bool                       # local rank 0 of its node
    engines: tuple[EngineSlot, ...]     # empty on non-host ranks
    tp_size: int
    warning: str | None = None          # one line for the log (e.g. the env overrode the recipe)

    def prompt_positions(self, num_prompts: int) -> list[int]:
        """The positions (in the step's prompt batch) this node rolls out; empty off-host."""
        return node_shard(num_prompts, self.node_index, self.num_nodes) if self.is_host else []


def _int_env(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise RolloutHostError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise RolloutHostError(f"{name}={raw!r}: must be >= {minimum}")
    return value


def _gpu_ids(raw: str) -> tuple[int, ...]:
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p.isdigit() for p in parts):
        raise RolloutHostError(f"{ENGINE_GPUS_ENV}={raw!r}: expected comma-separated GPU ids such as 0,1,2,3")
    ids = tuple(int(p) for p in parts)
    if len(set(ids)) != len(ids):
        raise RolloutHostError(f"{ENGINE_GPUS_ENV}={raw!r}: a GPU id appears twice")
    return ids


def node_position(env: Mapping[str, str]) -> tuple[int, int, bool]:
    """(node index, node count, is local rank 0) of this process, from the launcher's variables."""
    world = _int_env(env, "WORLD_SIZE", 1, 1)
    rank = _int_env(env, "RANK", 0, 0)
    local_rank = _int_env(env, "LOCAL_RANK", 0, 0)
    local_world = _int_env(env, "LOCAL_WORLD_SIZE", world, 1)
    if "GROUP_RANK" in env or "GROUP_WORLD_SIZE" in env:   # torchrun sets both
        nodes = _int_env(env, "GROUP_WORLD_SIZE", 1, 1)
        node = _int_env(env, "GROUP_RANK", 0, 0)
    else:
        if world % local_world:
            raise RolloutHostError(f"LOCAL_WORLD_SIZE={local_world}: does not divide WORLD_SIZE={world}")
        nodes, node = world // local_world, rank // local_world
    if node >= nodes:
        raise RolloutHostError(f"GROUP_RANK={node}: must be below the node count {nodes}")
    if local_rank >= local_world:
        raise RolloutHostError(f"LOCAL_RANK={local_rank}: must be below LOCAL_WORLD_SIZE={local_world}")
    return node, nodes, local_rank == 0


def plan_rollout_host(engine: EngineConfig, env: Mapping[str, str]) -> RolloutHostPlan:
    """Decide this process's rollout role from the launch environment and the recipe's engines.

    TP precedence: `RSTAR2_ENGINE_TP` (the launch plan) wins over `engine.tensor_parallel_size`,
    with a warning when they differ. With `RSTAR2_ENGINE_GPU_IDS` the replica count per node is
    the number of GPU groups and `engine.replicas` is not used.
    """
    node, nodes, is_host = node_position(env)
    tp = _int_env(env, ENGINE_TP_ENV, engine.tensor_parallel_size, 1)
    warning = None
    if tp != engine.tensor_parallel_size:
        warning = (f"{ENGINE_TP_ENV}={tp} overrides the recipe's engine.tensor_parallel_size="
                   f"{engine.tensor_parallel_size} (the launch plan placed the engines)")
    raw_ids = env.get(ENGINE_GPUS_ENV)
    if raw_ids is None:
        slots = tuple(EngineSlot(None, tp) for _ in range(engine.replicas))
    else:
        ids = _gpu_ids(raw_ids)
        if len(ids) % tp:
            raise RolloutHostError(f"{ENGINE_GPUS_ENV}={raw_ids!r}: {len(ids)} GPU ids do not split into "
                                   f"replicas of tensor-parallel size {tp}")
        slots = tuple(EngineSlot(ids[i:i + tp], tp) for i in range(0, len(ids), tp))
    return RolloutHostPlan(node_index=node, num_nodes=nodes, is_host=is_host,
                           engines=slots if is_host else (), tp_size=tp, warning=warning)


def node_shard(num_prompts: int, node_index: int, num_nodes: int) -> list[int]:
    """Prompt positions node `node_index` rolls out: interleaved, so shards differ by at most one."""
    if not 0 <= node_index < num_nodes:
        raise ValueError(f"node_index={node_index}: must be in 0..{num_nodes - 1}")
    return list(range(node_index, num_prompts, num_nodes))


def host_ranks(roles: Sequence[tuple[int, bool]], num_nodes: int) -> list[int]:
    """Global rank of each node's host, from every rank's (node index, is host), indexed by rank."""
    hosts: dict[int, list[int]] = {}
    for rank, (node, is_host) in enumerate(roles):
        if is_host:
            hosts.setdefault(node, []).append(rank)
    if sorted(hosts) != list(range(num_nodes)) or any(len(r) != 1 for r in hosts.values()):
        found = {n: r for n, r in sorted(hosts.items())}
        raise RolloutHostError(f"rollout hosts by node {found}: expected exactly one (LOCAL_RANK 0) "
                               f"on each of nodes 0..{num_nodes - 1}")
    return [hosts[n][0] for n in range(num_nodes)]
