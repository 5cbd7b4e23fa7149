"""Placement a user relies on: ranks, engines, TP, commands; and early one-line errors."""
from __future__ import annotations

import dataclasses
import io
import json
import shlex

import pytest
from rich.console import Console

from rstar2_cli.launch.plan_view import command_lines, render_plan, shell_wrap
from rstar2_cli.launch.topology import (ENGINE_GPUS_ENV, EngineReplica, PlanError, TopologySpec, build_plan,
                                        check_ipc_groups, plan_from_args)


def test_cpu_only_launches_directly():
    plan = plan_from_args(0)
    assert plan.launch_mode == "direct" and plan.device == "cpu"
    assert plan.trainer_world_size == 1
    assert plan.nodes[0].launch == ("python", "-m", "rstar2_cli.rl.run.launch_entry")
    assert plan.engines[0].gpu_ids == ()
    assert plan.sandbox.mode == "local"
    assert any("launch directly" in n for n in plan.notes)


def test_one_gpu_launches_directly_with_colocated_engine():
    plan = plan_from_args(1, recipe_args=["--stage", "1"])
    assert plan.launch_mode == "direct"
    assert (
        plan.nodes[0].command
        == f"{ENGINE_GPUS_ENV}=0 RSTAR2_ENGINE_TP=1 python -m rstar2_cli.rl.run.launch_entry --stage 1"
    )
    assert [e.gpu_ids for e in plan.engines] == [(0,)]


def test_eight_gpus_one_node_standalone_torchrun():
    plan = plan_from_args(8, tp_size=2, entry_module="my.entry")
    assert plan.launch_mode == "torchrun"
    assert plan.trainer_world_size == 8 and plan.nodes[0].trainer_ranks == tuple(range(8))
    assert [e.gpu_ids for e in plan.engines] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    argv = plan.nodes[0].launch
    assert argv[:6] == ("torchrun", "--nnodes", "1", "--nproc-per-node", "8", "--standalone")
    assert argv[-2:] == ("-m", "my.entry")


def test_sixteen_gpus_two_nodes_separate_engines():
    plan = plan_from_args(16, 2, colocate=False, engine_gpus=4, tp_size=2, master_addr="head")
    assert plan.trainer_world_size == 12
    assert [n.trainer_ranks for n in plan.nodes] == [tuple(range(6)), tuple(range(6, 12))]
    assert [n.trainer_gpu_ids for n in plan.nodes] == [tuple(range(6))] * 2
    assert [(e.replica, e.node_rank, e.gpu_ids) for e in plan.engines] == [(0, 0, (6, 7)), (1, 1, (6, 7))]
    assert dict(plan.nodes[1].env)[ENGINE_GPUS_ENV] == "6,7"
    assert "--nproc-per-node 6 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint head:29500" in plan.nodes[1].command


def test_sixtyfour_gpus_eight_nodes_paper_setup():
    plan = plan_from_args(64, 8, tp_size=2, master_addr="node001", master_port=29400, rdzv_id="job42",
                          prompts_per_step=512, rollouts_per_prompt=16, recipe_args=("--stage", "2"))
    assert plan.trainer_world_size == 64 and plan.data_parallel_size == 64
    assert plan.engine_replicas == 32 and plan.colocated
    assert plan.samples_per_dp_rank == 128
    assert plan.nodes[7].trainer_ranks == tuple(range(56, 64))
    assert plan.nodes[7].engines[-1].replica == 31 and plan.nodes[7].engines[-1].gpu_ids == (6, 7)
    assert plan.nodes[3].launch == (
        "torchrun", "--nnodes", "8", "--nproc-per-node", "8", "--node-rank", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "node001:29400", "--rdzv-id", "job42", "-m", "rstar2_cli.rl.run.launch_entry",
        "--stage", "2")
    assert plan.sandbox.mode == "redis" and plan.sandbox.redis_url == "redis://node001:6379/0"
    assert plan.sandbox.total_workers == 8 * 32
    assert [n.runs_redis_front_end for n in plan.nodes] == [True] + [False] * 7
    assert plan.weight_transfer == "ipc" and plan.memory is None     # the CLI adds the memory table
    assert not plan.notes


def test_external_redis_is_not_started_by_the_plan():
    plan = plan_from_args(16, 2, master_addr="h0", redis_url="redis://cache:6380/1")
    assert plan.sandbox.redis_url == "redis://cache:6380/1"
    assert not any(c.startswith("redis-server") for c in plan.sandbox.head_commands)
    assert "--redis redis://cache:6380/1" in plan.sandbox.worker_command


def test_ipc_placement_is_checked_against_vllms_default_group_assumption():
    """vLLM's IPC sender all-gathers handles over the default group (every trainer rank here);
    each engine worker needs the handle of its own GPU, exported by the rank that trains on it."""
    plan = plan_from_args(16, 2, tp_size=2, master_addr="h0")
    assert plan.weight_transfer == "ipc"
    check_ipc_groups(plan)                                       # what build_plan lays out passes
    node = plan.nodes[1]
    stray = dataclasses.replace(node, engines=node.engines[:-1] + (EngineReplica(7, 1, (7, 8), 2),))
    with pytest.raises(PlanError, match=r"node 1 has engines on GPUs \[0, 1, 2, 3, 4, 5, 7, 8\] and trainer "
                                        r"ranks on GPUs \[0, 1, 2, 3, 4, 5, 6, 7\]"):
        check_ipc_groups(dataclasses.replace(plan, nodes=(plan.nodes[0], stray)))
    no_sender = dataclasses.replace(node, trainer_gpu_ids=tuple(range(1, 8)), engines=node.engines[1:])
    with pytest.raises(PlanError, match="no trainer rank on GPU 0"):
        check_ipc_groups(dataclasses.replace(plan, nodes=(plan.nodes[0], no_sender)))
    with pytest.raises(PlanError, match="16 trainer ranks on the nodes but world size 24"):
        check_ipc_groups(dataclasses.replace(plan, trainer_world_size=24))
    nccl = plan_from_args(16, 2, colocate=False, engine_gpus=4, tp_size=2, master_addr="h0")
    check_ipc_groups(nccl)                                       # not ipc: nothing to check


def test_plan_is_frozen_and_json_serialisable():
    plan = plan_from_args(16, 2, master_addr="h0", tp_size=4)
    with pytest.raises(AttributeError):
        plan.trainer_world_size = 3  # type: ignore[misc]
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["nodes"][1]["command"] == plan.nodes[1].command
    assert data["nodes"][0]["engines"][1]["gpu_ids"] == [4, 5, 6, 7]
    assert data["spec"]["gpus_per_node"] == 8


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(gpus=12, nodes=8, master_addr="h"), "gpus=12 is not divisible by nodes=8"),
        (dict(gpus=8, tp_size=3), "gpus_per_node=8 is not divisible by tp_size=3"),
        (dict(gpus=16, nodes=2, tp_size=16, master_addr="h"), "tp_size=16 > gpus_per_node=8"),
        (dict(gpus=8, colocate=False, engine_gpus=3, tp_size=2), "engine_gpus=3 is not divisible by tp_size=2"),
        (dict(gpus=8, colocate=False, engine_gpus=8), "leaves zero trainer GPUs"),
        (dict(gpus=8, colocate=False), "colocate=False needs engine_gpus"),
        (dict(gpus=16, nodes=2, colocate=False, engine_gpus=2, tp_size=2, master_addr="h"),
         "engine_gpus per node=1 is not divisible by tp_size=2"),
        (dict(gpus=16, nodes=2), "master_addr='127.0.0.1' with nodes=2"),
        (dict(gpus=0, tp_size=2), "tp_size=2 with gpus=0"),
        (dict(gpus=-1), "gpus=-1"),
        (dict(gpus=16, nodes=2, gpus_per_node=4, master_addr="h"), "gpus_per_node=4"),
        (dict(gpus=8, redis_url="http://x"), "redis_url='http://x'"),
        (dict(gpus=8, colocate=True, engine_gpus=4), "engine_gpus=4 with colocate=True"),
    ],
)
def test_inconsistent_sizes_fail_early_with_one_line(kwargs, fragment):
    with pytest.raises(PlanError) as err:
        build_plan(TopologySpec(**kwargs))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_batch_not_divisible_by_data_parallel_size():
    with pytest.raises(PlanError, match=r"512 x 16 = 8192 is not divisible by data-parallel size 6"):
        plan_from_args(8, colocate=False, engine_gpus=2, prompts_per_step=512, rollouts_per_prompt=16)


def test_unknown_option_is_rejected():
    with pytest.raises(PlanError, match="unknown topology option"):
        plan_from_args(8, tensor_parallel=2)


def plan_text(plan) -> str:
    """The plan as `rstar2 rl --dry-run` prints it (`render_plan` on a rich console), plain and wide."""
    buffer = io.StringIO()
    Console(file=buffer, width=400, color_system=None, force_terminal=False).print(render_plan(plan))
    return buffer.getvalue()


def test_dry_run_text_has_key_lines():
    plan = plan_from_args(16, 2, tp_size=2, master_addr="node001", prompts_per_step=64, rollouts_per_prompt=16)
    text = plan_text(plan).replace(" \\\n  ", " ")  # undo the shell line continuations
    for needle in ("16 GPUs = 2 node(s) x 8", "FSDP2 world size 16", "8 vLLM replicas x TP 2, colocated",
                   "Redis redis://node001:6379/0",
                   "64 prompts x 16 rollouts = 1,024 trajectories a step, 64 per data-parallel rank",
                   "#7[6,7]", "8..15", "--node-rank 1 --rdzv-backend c10d --rdzv-endpoint node001:29500"):
        assert needle in text, needle
    lines = command_lines(plan)
    assert lines[0].startswith("# node 0 (head): redis-server")
    assert lines[2].startswith("# every node: rstar2 serve-sandbox --worker --redis redis://node001:6379/0")
    assert lines[-1].startswith("# node 1: ")


def test_cpu_dry_run_says_launch_directly():
    assert "launch directly" in plan_text(plan_from_args(0))


def test_wrapped_commands_paste_back_to_the_same_argv():
    plan = plan_from_args(64, 8, master_addr="node001", recipe_args=["--config", "runs/a b/resolved.yaml"])
    for line in command_lines(plan):
        wrapped = shell_wrap(line)
        body = wrapped.split("\n", 1)[1]
        assert shlex.split(body.replace("\\\n", " ")) == shlex.split(line.partition(": ")[2])
        assert all(len(piece) <= 80 for piece in body.split("\n"))
