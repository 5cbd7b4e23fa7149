"""How a `Plan` looks in a terminal: what `rstar2 rl --dry-run` prints before anything starts.

Separate from `topology.py` so the placement logic stays free of presentation, and so the
text a user checks (ranks, engines, commands) is built in one place.
"""
from __future__ import annotations

import shlex

from rich.console import Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from rstar2_cli.config import RELEASE_MICRO_BATCH_TOKENS
from rstar2_cli.launch.memory_plan import MICRO_BATCH_STEP, MemoryPlan, update_phase_gib
from rstar2_cli.launch.topology import Plan


WEIGHT_SYNC_TEXT = {
    "ipc": "ipc: vLLM weight transfer, CUDA IPC handles on the shared GPUs",
    "nccl": "nccl: vLLM weight transfer, NCCL broadcast from each node's host rank to its engines",
    "chunked": "chunked: safetensors chunks through collective_rpc",
}


def _gpu_list(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids)) if ids else "cpu"


def _summary(plan: Plan) -> Table:
    spec = plan.spec
    t = Table(title="rstar2 rl launch plan", show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    if plan.device == "cpu":
        hw = "CPU only"
    elif spec.gpus == 1:
        hw = "1 GPU on 1 node"
    else:
        hw = f"{spec.gpus} GPUs = {spec.nodes} node(s) x {spec.gpus_per_node}"
    t.add_row("hardware", hw)
    t.add_row("launch", "launch directly (python -m)" if plan.launch_mode == "direct" else "torchrun per node")
    t.add_row("trainer", f"FSDP2 world size {plan.trainer_world_size} (fully_shard per decoder layer), "
                         f"data-parallel {plan.data_parallel_size}")
    mode = "colocated (vLLM sleep/wake of weights + KV cache)" if plan.colocated else "separate GPUs"
    t.add_row("engines", f"{plan.engine_replicas} vLLM replicas x TP {spec.tp_size}, {mode}")
    t.add_row("weight sync", WEIGHT_SYNC_TEXT[plan.weight_transfer]
              + (" (engine.weight_transfer)" if spec.weight_transfer != "auto" else ""))
    sb = plan.sandbox
    if sb.mode == "redis":
        t.add_row("sandbox", f"Redis {sb.redis_url}, front end on node {sb.front_end_node} ({sb.front_end_url}), "
                             f"{sb.workers_per_node} workers/node = {sb.total_workers}")
    else:
        t.add_row("sandbox", f"local, {sb.workers_per_node} workers ({sb.front_end_url})")
    if plan.samples_per_dp_rank is not None:
        total = spec.prompts_per_step * spec.rollouts_per_prompt
        t.add_row("batch", f"{spec.prompts_per_step} prompts x {spec.rollouts_per_prompt} rollouts = {total:,} "
                           f"trajectories a step, {plan.samples_per_dp_rank:,} per data-parallel rank")
    for note in plan.notes:
        t.add_row("note", Text(note, style="yellow"))
    return t


def _nodes(plan: Plan) -> Table:
    t = Table(title="per node", title_justify="left")
    for col in ("node", "trainer ranks", "trainer GPUs", "engines [GPU ids]", "sandbox"):
        t.add_column(col)
    for n in plan.nodes:
        ranks = f"{n.trainer_ranks[0]}..{n.trainer_ranks[-1]}" if len(n.trainer_ranks) > 1 else str(n.trainer_ranks[0])
        engines = " ".join(f"#{e.replica}[{_gpu_list(e.gpu_ids)}]" for e in n.engines)
        sandbox = f"{n.sandbox_workers} workers" + (" + Redis front end" if n.runs_redis_front_end else "")
        t.add_row(str(n.node_rank), ranks, _gpu_list(n.trainer_gpu_ids), engines, sandbox)
    return t


def micro_batch_note(memory: MemoryPlan) -> str:
    """What an "auto" `train.micro_batch_tokens` became (launch/engine_sizing.py `size_micro_batch`)."""
    tokens = memory.spec.micro_batch_tokens
    if update_phase_gib(memory.spec) > memory.spec.gpu_memory_gib:
        return f"train.micro_batch_tokens auto: no size fits the update on this GPU (planned at {tokens})"
    return (f"train.micro_batch_tokens auto: {tokens} (the largest multiple of {MICRO_BATCH_STEP} whose update fits "
            f"this GPU, at most the release's {RELEASE_MICRO_BATCH_TOKENS})")


def memory_header(memory: MemoryPlan) -> str:
    """What the memory table is for: the GPU, the model and the placement."""
    spec = memory.spec
    placement = "colocated" if spec.colocated else "separate engine GPUs"
    return (f"memory per GPU (GiB): {spec.gpu_memory_gib:g} GiB GPU ({spec.gpu_name}), "
            f"{spec.trainer_ranks} trainer ranks, {placement}, TP {spec.tp_size}; model "
            f"{spec.shape.total_params() / 1e9:.2f}B params from {spec.shape_source}; engines: "
            f"gpu_memory_utilization {spec.gpu_memory_utilization:g}, max_num_seqs {spec.max_num_seqs}, "
            f"max_num_batched_tokens {spec.max_num_batched_tokens}, "
            + ("CUDA graphs" if spec.cuda_graphs else "eager"))


def memory_table(memory: MemoryPlan) -> Table:
    """GiB per GPU, one column per phase (colocated) or per kind of GPU (separate)."""
    spec = memory.spec
    t = Table()
    t.add_column("component")
    for column in memory.columns:
        t.add_column(column, justify="right")
    for row in memory.rows:
        t.add_row(row.name, *("-" if value is None else f"{value:.2f}" for value in row.gib))
    t.add_row(Text("total", style="bold"), *(Text(f"{v:.2f}", style="bold") for v in memory.totals))
    t.add_row("headroom", *(f"{spec.gpu_memory_gib - v:.2f}" for v in memory.totals))
    return t


def memory_lines(memory: MemoryPlan) -> list[str]:
    """The verdict under the table: the one-line problems, else that it fits."""
    if memory.problems:
        return list(memory.problems)
    worst = max(memory.totals)
    return [f"fits: at most {worst:.1f} of {memory.spec.gpu_memory_gib:g} GiB per GPU "
            f"({memory.spec.gpu_memory_gib - worst:.1f} GiB headroom)"]


def command_lines(plan: Plan) -> list[str]:
    """The shell lines in launch order: sandbox head, sandbox workers, then the trainers."""
    lines: list[str] = []
    sb = plan.sandbox
    if sb.mode == "redis":
        lines += [f"# node {sb.front_end_node} (head): {c}" for c in sb.head_commands]
        lines.append(f"# every node: {sb.worker_command}")
    else:
        lines.append(f"# sandbox: {sb.worker_command}")
    lines += [f"# node {n.node_rank}: {n.command}" for n in plan.nodes]
    return lines


def shell_wrap(line: str, width: int = 78) -> str:
    """Break a (commented) shell line before flags so no piece exceeds `width` where possible."""
    label, sep, command = line.partition(": ") if line.startswith("#") else ("", "", line)
    units: list[str] = []  # a flag with its value(s) stays on one line
    for token in (shlex.quote(t) for t in shlex.split(command)):
        if units and not token.startswith("-") and units[-1].startswith("-"):
            units[-1] += " " + token
        else:
            units.append(token)
    lines, current = [], ""
    for unit in units:
        if current and len(current) + 1 + len(unit) > width - 2:
            lines.append(current)
            current = "  " + unit
        else:
            current = f"{current} {unit}" if current else unit
    lines.append(current)
    body = " \\\n".join(lines)
    return f"{label}:\n{body}" if sep else body


def render_plan(plan: Plan) -> Group:
    """Tables plus the commands, as one rich renderable."""
    # No border, and long commands broken with `\` continuations at flag boundaries, so every
    # line copy-pastes into a shell at any terminal width of 80 or more.
    commands = Text("\n".join(shell_wrap(line) for line in command_lines(plan)))
    parts = [_summary(plan), _nodes(plan)]
    if plan.memory is not None:
        style = "green" if plan.memory.fits else "bold red"
        parts += [Text(memory_header(plan.memory), style="italic"), memory_table(plan.memory),
                  Text("\n".join(memory_lines(plan.memory)), style=style)]
    return Group(*parts, Rule("commands", align="left"), commands)

