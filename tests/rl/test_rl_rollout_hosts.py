"""Rollout-host planning: which rank hosts engines on which GPUs and rolls out which prompts."""
from __future__ import annotations

import pytest

from rstar2_cli.config import EngineConfig
from rstar2_cli.launch.topology import plan_from_args
from rstar2_cli.rl.ranks.rollout_hosts import EngineSlot, RolloutHostError, host_ranks, node_shard, plan_rollout_host


def torchrun_env(node: int, nodes: int, local_rank: int, per_node: int, **extra: str) -> dict[str, str]:
    """The variables torchrun sets for one worker, plus the launch plan's."""
    return {"RANK": str(node * per_node + local_rank), "WORLD_SIZE": str(nodes * per_node),
            "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(per_node),
            "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes), **extra}


def test_single_process_hosts_the_recipes_replicas():
    plan = plan_rollout_host(EngineConfig(replicas=2), {})
    assert (plan.node_index, plan.num_nodes, plan.is_host) == (0, 1, True)
    assert plan.engines == (EngineSlot(None, 1), EngineSlot(None, 1))
    assert plan.prompt_positions(5) == [0, 1, 2, 3, 4] and plan.warning is None


def test_every_nodes_local_rank_zero_hosts_the_plans_engines():
    """The env a 2-node x 8-GPU, TP 2 launch plan writes puts 4 replicas on every node's rank 0."""
    topo = plan_from_args(16, 2, tp_size=2, master_addr="head")
    for node in topo.nodes:
        env = dict(node.env)
        host = plan_rollout_host(EngineConfig(tensor_parallel_size=2),
                                 torchrun_env(node.node_rank, 2, 0, 8, **env))
        assert host.is_host and host.node_index == node.node_rank and host.num_nodes == 2
        assert [s.gpu_ids for s in host.engines] == [e.gpu_ids for e in node.engines]
        assert all(s.tp_size == 2 for s in host.engines)
        other = plan_rollout_host(EngineConfig(tensor_parallel_size=2), torchrun_env(node.node_rank, 2, 3, 8, **env))
        assert not other.is_host and other.engines == () and other.prompt_positions(10) == []


def test_separate_engine_gpus_use_the_top_ids():
    env = torchrun_env(1, 2, 0, 6, RSTAR2_ENGINE_GPU_IDS="6,7", RSTAR2_ENGINE_TP="1")
    assert [s.gpu_ids for s in plan_rollout_host(EngineConfig(replicas=3), env).engines] == [(6,), (7,)]


def test_env_tp_wins_over_the_recipe_with_a_warning():
    env = torchrun_env(0, 1, 0, 4, RSTAR2_ENGINE_GPU_IDS="0,1,2,3", RSTAR2_ENGINE_TP="4")
    plan = plan_rollout_host(EngineConfig(tensor_parallel_size=2), env)
    assert plan.engines == (EngineSlot((0, 1, 2, 3), 4),) and plan.tp_size == 4
    assert "RSTAR2_ENGINE_TP=4" in plan.warning and "tensor_parallel_size=2" in plan.warning
    assert "\n" not in plan.warning


@pytest.mark.parametrize("extra, match", [
    ({"RSTAR2_ENGINE_GPU_IDS": "0,1,2", "RSTAR2_ENGINE_TP": "2"},
     r"RSTAR2_ENGINE_GPU_IDS='0,1,2': 3 GPU ids .* size 2"),
    ({"RSTAR2_ENGINE_GPU_IDS": "0,x"}, r"RSTAR2_ENGINE_GPU_IDS='0,x': expected comma-separated"),
    ({"RSTAR2_ENGINE_GPU_IDS": ""}, r"RSTAR2_ENGINE_GPU_IDS='': expected comma-separated"),
    ({"RSTAR2_ENGINE_GPU_IDS": "0,-1"}, r"RSTAR2_ENGINE_GPU_IDS='0,-1'"),
    ({"RSTAR2_ENGINE_GPU_IDS": "1,1"}, r"appears twice"),
    ({"RSTAR2_ENGINE_TP": "two"}, r"RSTAR2_ENGINE_TP='two': expected an integer"),
    ({"RSTAR2_ENGINE_TP": "0"}, r"RSTAR2_ENGINE_TP='0': must be >= 1"),
    ({"GROUP_RANK": "2"}, r"GROUP_RANK=2: must be below the node count 2"),
])
def test_malformed_launch_env_is_one_line_naming_the_variable(extra, match):
    env = {**torchrun_env(0, 2, 0, 1), **extra}
    with pytest.raises(RolloutHostError, match=match) as err:
        plan_rollout_host(EngineConfig(), env)
    assert "\n" not in str(err.value)


def test_node_position_without_torchrun_group_variables():
    """srun/mpirun-style launchers: node = RANK // LOCAL_WORLD_SIZE."""
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    plan = plan_rollout_host(EngineConfig(), env)
    assert (plan.node_index, plan.num_nodes, plan.is_host) == (1, 2, False)
    with pytest.raises(RolloutHostError, match="LOCAL_WORLD_SIZE=3: does not divide WORLD_SIZE=8"):
        plan_rollout_host(EngineConfig(), {**env, "LOCAL_WORLD_SIZE": "3"})


@pytest.mark.parametrize("prompts, nodes", [(512, 8), (10, 3), (2, 8), (1, 1)])
def test_node_shards_cover_every_prompt_once_and_differ_by_at_most_one(prompts, nodes):
    shards = [node_shard(prompts, n, nodes) for n in range(nodes)]
    assert sorted(p for s in shards for p in s) == list(range(prompts))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_host_ranks_need_exactly_one_host_per_node():
    roles = [(0, True), (0, False), (1, True), (1, False)]
    assert host_ranks(roles, 2) == [0, 2]
    with pytest.raises(RolloutHostError, match=r"by node \{0: \[0\]\}: expected exactly one"):
        host_ranks([(0, True), (1, False)], 2)
    with pytest.raises(RolloutHostError, match=r"\{0: \[0, 1\]\}"):
        host_ranks([(0, True), (0, True)], 1)

