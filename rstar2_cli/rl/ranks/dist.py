"""Tiny torch.distributed helpers so the trainer runs the same code with or without torchrun.

World size 1 (plain `python`, no WORLD_SIZE in the environment) creates NO process group: every
helper below then degrades to the identity. Under torchrun the default group is gloo on CPU and
nccl on GPU, created once, by `setup_distributed`: the one place that starts torch.distributed,
called explicitly by each process's entry point (nothing joins a group as a side effect).

Two groups: the default one carries the training tensors (FSDP's gathers and reductions, the
policy's token counts); a gloo group beside it (`object_group`) carries every object collective
(`all_gather_objects`, `broadcast_from_each`, `scatter_objects`) and every agreement between
steps (`agree_max`: preemption, sandbox outage, a failed weight push). Why: a rank waiting in an
NCCL collective runs a spinning kernel on its GPU, and during a rollout the non-host ranks wait
for the hosts for minutes on GPUs the engines decode on; a gloo wait is a CPU wait on a socket.

Waiting for the rollout hosts: no collective timeout can bound a rollout. One node rolling out a
stage-2 step (stage2.yaml: 512 prompts x 2 x 16 = 16,384 trajectories of up to 12,288 tokens, at
most 201M tokens) on its 4 TP-2 replicas at ~6K tokens/s each (the rollout simulator's MI300X
preset at full batch, docs/async-rl.md; no GPU run has measured it) takes 201M / 24K/s = 8,400 s
= 2.3 h at the length cap, past a 2 h timeout; on 8 nodes, an eighth of that. So
`broadcast_from_each` and `gather_from`, where ranks wait for the hosts, first wait in the store
for each source to be ready, with heartbeats (`liveness.py`): every rank beats every
HEARTBEAT_S = 5 s; a source silent for SILENT_S = 120 s (24 beats: a beat thread can be held up
by the GIL or a slow store for a while) is reported as dead, in one line, within SILENT_S +
2 x POLL_S = 122 s of its last beat (a poll to see the beat, one to find the silence), instead of
at the collective timeout; a source that is alive may take as long as it needs. The collective
then starts with every source there: its timeout
(COLLECTIVE_TIMEOUT, 2 h, for the default group's FSDP and checkpoint collectives and the gloo
group's agreements) bounds only the transfer.

Several nodes: without GLOO_SOCKET_IFNAME, gloo listens on the address this host's name resolves
to, and on loopback when it resolves to nothing (`hosts/addresses.py` says where torch does
this): the other nodes could not connect, and the run would hang at its first object collective.
`setup_distributed` refuses that in one line naming GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME,
NCCL's own) unless the variable is set or MASTER_ADDR is loopback too (every "node" on this machine).
"""
from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rstar2_cli.hosts.addresses import host_address, loopback_refusal
from rstar2_cli.hosts.cpu_ranks import cpu_ranks
from rstar2_cli.rl.ranks.liveness import Liveness
from rstar2_cli.rl.ranks.rollout_hosts import node_position


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)
HEARTBEAT_S = 5.0     # every rank's beat (module docstring)
SILENT_S = 120.0      # a source this long without a beat counts as dead
POLL_S = 1.0          # the longest pause between two looks at the store while waiting

# the gloo group of the object collectives and agreements (module docstring); set by setup_distributed
_objects_group = None
# this rank's heartbeat and waits (liveness.py); set by setup_distributed, None in a test's own group
_liveness: Liveness | None = None
_collectives = 0      # the waiting collectives so far: every rank counts the same ones


class NodeAddressError(RuntimeError):
    """A multi-node launch that gloo cannot connect (one-line message)."""


def check_node_address(env: Mapping[str, str], resolve: Callable[[str], str] = host_address,
                       hostname: str | None = None) -> None:
    """Refuse, in one line, a job on several nodes whose gloo group would listen on loopback
    (`hosts.addresses.loopback_refusal`, MASTER_ADDR the head node)."""
    why = loopback_refusal(node_position(env)[1], env, env.get("MASTER_ADDR"), resolve=resolve, hostname=hostname)
    if why is not None:
        raise NodeAddressError(why)


def setup_distributed(*, resolve: Callable[[str], str] = host_address) -> DistInfo:
    """The entry point of every trainer process (`RLTrainer`, `rl/run/launch_entry.py`, the torchrun
    test workers): join torchrun's process group if launched by torchrun (once; a second call
    returns the same DistInfo), pin this rank's GPU, start this rank's heartbeat, and describe the
    process. Without torchrun it creates nothing and returns a 1-rank DistInfo. `resolve`: the
    name-to-address lookup of the multi-node check (`check_node_address`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = uses_cuda()
    if use_cuda:
        torch.cuda.set_device(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
    if world > 1 and not dist.is_initialized():
        check_node_address(os.environ, resolve)
        # ranks wait in collectives for FSDP's slowest rank, a checkpoint write, an agreement
        # between steps; the long waits for the rollout hosts are the store's (module docstring)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    global _objects_group, _liveness
    if world > 1 and _liveness is None:
        # before the gloo group: new_group is a collective, so once it returns every rank's keys exist
        _liveness = start_liveness(dist.get_rank())
    if world > 1 and _objects_group is None:
        # every rank, in the same order, right after the default group (new_group is a collective)
        _objects_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return process_info()


def uses_cuda() -> bool:
    """Whether this process's ranks train on a GPU: one is visible and RSTAR2_CPU_RANKS does not ask
    for CPU ranks (hosts/cpu_ranks.py), which then join gloo on the CPU device."""
    return torch.cuda.is_available() and not cpu_ranks()


def start_liveness(rank: int) -> Liveness:
    """This rank's heartbeat in the default group's store (torch keeps it beside the group:
    torch/distributed/distributed_c10d.py `_get_default_store`)."""
    store = dist.distributed_c10d._get_default_store()
    return Liveness(store, rank, beat_s=HEARTBEAT_S, silent_s=SILENT_S, poll_s=POLL_S).start()


def await_sources(sources: list[int], what: str) -> None:
    """Every rank, before a collective in which it may wait long for `sources`: each source marks
    itself ready, every other rank waits until all are, or raises `liveness.RankLost` when one
    stops beating (module docstring). Nothing without `setup_distributed`'s heartbeats."""
    global _collectives
    _collectives += 1
    if _liveness is None:
        return
    if dist.get_rank() in sources:
        _liveness.ready(_collectives)
    _liveness.wait(sources, _collectives, what)


def object_group():
    """The gloo group of object collectives and agreements (module docstring). A default group
    that is itself gloo serves when `setup_distributed` did not run (a test's own
    `init_process_group("gloo")`); an NCCL default group without the gloo one is refused."""
    if _objects_group is not None:
        return _objects_group
    if dist.get_backend() != "gloo":
        raise RuntimeError("object collectives need the gloo group: start torch.distributed with "
                           "rstar2_cli.rl.ranks.dist.setup_distributed()")
    return None


def process_info() -> DistInfo:
    """This process's rank, world size and device as they stand (nothing is started): rank 0 of
    1 without a process group. Launched by torchrun (WORLD_SIZE > 1) before `setup_distributed`
    joined the group, it raises instead of describing a 1-rank run that is not one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and not dist.is_initialized():
        raise RuntimeError(f"WORLD_SIZE={world} but no process group: call "
                           "rstar2_cli.rl.ranks.dist.setup_distributed() first")
    device = torch.device("cuda", local_rank) if uses_cuda() else torch.device("cpu")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce(values: list[float], op, device: torch.device, group=None) -> list[float]:
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def agree_max(values: list[float]) -> list[float]:
    """The element-wise max over all ranks, on CPU over the gloo group: the agreements between
    steps (a signal seen by any rank, the longest sandbox outage, a failed push anywhere)."""
    return _reduce(values, dist.ReduceOp.MAX, torch.device("cpu"), object_group())


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    return _reduce(values, dist.ReduceOp.SUM, device)


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    return _reduce(values, dist.ReduceOp.MAX, device)


def all_gather_objects(obj) -> list:
    """Every rank's `obj` (picklable), indexed by rank; `[obj]` without a process group.
    For small objects: each rank's payload is padded to the largest one."""
    if not is_distributed():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=object_group())
    return out


def broadcast_from_each(obj, sources: list[int]) -> list:
    """The `obj` of each rank in `sources`, in that order, on every rank (one broadcast per
    source: a rank receives the sources' payloads and nothing from the other ranks, unlike
    all_gather_object, which pads every rank's part to the largest). Non-source ranks' `obj`
    is ignored. Without a process group: `[obj]`."""
    if not is_distributed():
        return [obj]
    await_sources(sources, f"waiting for ranks {sources}")
    rank, group = dist.get_rank(), object_group()
    out = []
    for src in sources:
        box = [obj if rank == src else None]
        dist.broadcast_object_list(box, src=src, group=group)
        out.append(box[0])
    return out


def gather_from(obj, sources: list[int], dst: int = 0) -> list | None:
    """The `obj` of each rank in `sources`, in that order, on rank `dst`; None on the other ranks,
    which send nothing but still wait for the sources (`await_sources`). Without a process
    group: `[obj]`."""
    if not is_distributed():
        return [obj]
    await_sources(sources, f"waiting for ranks {sources}")
    rank = dist.get_rank()
    out: list | None = [None] * dist.get_world_size() if rank == dst else None
    dist.gather_object(obj if rank in sources else None, out, dst=dst, group=object_group())
    return None if out is None else [out[src] for src in sources]


def scatter_objects(per_rank: list | None, src: int):
    """Rank `src` sends `per_rank[r]` to rank r; every rank returns its own (`per_rank[0]` without
    a process group). Each rank receives its object only, padded to the largest of them."""
    if not is_distributed():
        return per_rank[0]
    box: list = [None]
    dist.scatter_object_list(box, per_rank if dist.get_rank() == src else None, src=src, group=object_group())
    return box[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()
