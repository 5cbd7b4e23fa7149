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
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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

# the gloo group of the object collectives and agreements (module docstring); set by setup_distributed
_objects_group = None


def setup_distributed() -> DistInfo:
    """The entry point of every trainer process (`RLTrainer`, `rl/launch_entry.py`, the torchrun
    test workers): join torchrun's process group if launched by torchrun (once; a second call
    returns the same DistInfo), pin this rank's GPU, and describe the process. Without torchrun
    it creates nothing and returns a 1-rank DistInfo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
    if world > 1 and not dist.is_initialized():
        # ranks wait in a collective while the hosts roll out a step or rank 0 runs a held-out
        # eval (`train.eval_every`): tens of minutes at paper scale, past the 10-minute default
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    global _objects_group
    if world > 1 and _objects_group is None:
        # every rank, in the same order, right after the default group (new_group is a collective)
        _objects_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return process_info()


def object_group():
    """The gloo group of object collectives and agreements (module docstring). A default group
    that is itself gloo serves when `setup_distributed` did not run (a test's own
    `init_process_group("gloo")`); an NCCL default group without the gloo one is refused."""
    if _objects_group is not None:
        return _objects_group
    if dist.get_backend() != "gloo":
        raise RuntimeError("object collectives need the gloo group: start torch.distributed with "
                           "rstar2_cli.rl.dist.setup_distributed()")
    return None


def process_info() -> DistInfo:
    """This process's rank, world size and device as they stand (nothing is started): rank 0 of
    1 without a process group. Launched by torchrun (WORLD_SIZE > 1) before `setup_distributed`
    joined the group, it raises instead of describing a 1-rank run that is not one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and not dist.is_initialized():
        raise RuntimeError(f"WORLD_SIZE={world} but no process group: call "
                           "rstar2_cli.rl.dist.setup_distributed() first")
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
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
    rank, group = dist.get_rank(), object_group()
    out = []
    for src in sources:
        box = [obj if rank == src else None]
        dist.broadcast_object_list(box, src=src, group=group)
        out.append(box[0])
    return out


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
