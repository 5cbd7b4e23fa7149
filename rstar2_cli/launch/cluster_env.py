"""Launch sizes the user did not type: node count, node rank and head address.

Why: `rstar2 rl --gpus 64` is what users type; no node has 64 GPUs, so without `--nodes` the
node count is inferred from `--gpus-per-node` (default: this node's visible GPUs, else 8), or
the launch fails in one line. Under SLURM (`srun`, `salloc`, an sbatch script) the allocation
already says how many nodes there are (`SLURM_JOB_NUM_NODES`), which one this is
(`SLURM_NODEID`) and who is first (`SLURM_JOB_NODELIST`, whose first host is the rendezvous
head); those become the defaults. A flag the user gave always wins.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from rstar2_cli.launch.topology import PlanError

DEFAULT_GPUS_PER_NODE = 8
LOCAL_MASTER = "127.0.0.1"
# The head a dry run names when neither --master-addr nor SLURM says which node it is: a name no
# host has, spelled so that it reads as "fill me in" in the printed commands.
PLACEHOLDER_HEAD = "HEAD_NODE"


@dataclass(frozen=True)
class LaunchSizes:
    nodes: int
    gpus_per_node: int | None
    node_rank: int | None       # None: print every node's command (nothing says which node this is)
    master_addr: str
    source: str                 # where the defaults came from, for the plan view
    head_is_placeholder: bool = False   # master_addr is PLACEHOLDER_HEAD: nothing named the head


def visible_gpu_count() -> int:
    """GPUs this process can see (0 without CUDA)."""
    try:
        import torch  # lazy: torch (~1 s); `rstar2 rl --dry-run` plans on a login node without it
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `scontrol show hostnames` when it is installed, else
    the compressed form parsed here (`gpu[003-010,12],cpu1` -> `gpu003`,
    `rack[1-2]-n[07-08]` -> `rack1-n07`)."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise PlanError("SLURM_JOB_NODELIST is empty: give --master-addr")
    scontrol = shutil.which("scontrol")
    if scontrol:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):       # the first item ends at the first comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    item = nodelist[:end]
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], item)
    if not host or "[" in host or "]" in host:
        raise PlanError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read its first host; give --master-addr")
    return host


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise PlanError(f"{name}={value!r}: not an integer") from None


def resolve_launch(gpus: int, *, nodes: int | None = None, gpus_per_node: int | None = None,
                   node_rank: int | None = None, master_addr: str | None = None,
                   env: Mapping[str, str] | None = None, visible_gpus: int | None = None,
                   allow_placeholder_head: bool = False) -> LaunchSizes:
    """Fill in what the flags left out, from SLURM's environment and this node's GPUs.
    `allow_placeholder_head` (a dry run): several nodes with no head named plan with
    PLACEHOLDER_HEAD instead of failing."""
    env = os.environ if env is None else env
    slurm_nodes = _env_int(env, "SLURM_JOB_NUM_NODES")
    source = "flags"
    if gpus == 0:        # CPU: one process on this node, whatever the allocation
        return LaunchSizes(nodes or 1, None, node_rank, master_addr or LOCAL_MASTER, source)
    if nodes is None and slurm_nodes is not None:
        nodes, source = slurm_nodes, "SLURM"
        if gpus % nodes:
            raise PlanError(f"gpus={gpus} is not divisible by SLURM_JOB_NUM_NODES={nodes}")
    if nodes is None:
        per_node = gpus_per_node
        if per_node is None:
            seen = visible_gpu_count() if visible_gpus is None else visible_gpus
            per_node = seen or DEFAULT_GPUS_PER_NODE
        if per_node < 1:
            raise PlanError(f"gpus_per_node={per_node}: must be >= 1")
        if gpus <= per_node:
            nodes, per_node = 1, gpus
        elif gpus % per_node:
            raise PlanError(f"gpus={gpus} is not divisible by gpus_per_node={per_node}: give --nodes or "
                            "--gpus-per-node")
        else:
            nodes = gpus // per_node
        gpus_per_node = per_node
    if node_rank is None and slurm_nodes is not None:
        node_rank = _env_int(env, "SLURM_NODEID")
    if node_rank is not None and not 0 <= node_rank < nodes:
        raise PlanError(f"node_rank={node_rank}: must be in 0..{nodes - 1}")
    if master_addr is None:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodes > 1 and not nodelist and allow_placeholder_head:
            return LaunchSizes(nodes, gpus_per_node, node_rank, PLACEHOLDER_HEAD, source, head_is_placeholder=True)
        if nodes > 1 and not nodelist:
            raise PlanError(f"gpus={gpus} plans {nodes} nodes x {gpus // nodes} GPUs: give --master-addr "
                            "(the head node's host name or IP), or run under SLURM")
        master_addr = first_host(nodelist) if nodes > 1 else LOCAL_MASTER
    return LaunchSizes(nodes, gpus_per_node, node_rank, master_addr, source)
