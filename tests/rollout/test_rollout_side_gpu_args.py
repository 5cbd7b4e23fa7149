"""The rollout side's GPU branch, built on CPU: `start_rollout_side` on a "cuda" rank places each
replica with the launch plan's GPU ids and tensor-parallel size, through the real
`VLLMEngine.from_config` GPU path (vLLM's real `AsyncEngineArgs`, recorded instead of started),
and builds the colocated weight pusher. No GPU has run this path: a TypeError here would
otherwise first show on a GPU node."""
from __future__ import annotations

import torch
from test_request_seeds import BuiltEngine, on_gpu

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.ranks.dist import DistInfo
from rstar2_cli.rl.ranks.rollout_hosts import EngineSlot, RolloutHostPlan
from rstar2_cli.rl.run.rollout_side import Collaborators, start_rollout_side


class NoTools:
    async def start(self):
        pass

    async def close(self):
        pass


def test_a_gpu_host_places_its_replicas_as_the_launch_plan_says(monkeypatch):
    on_gpu(monkeypatch)
    cfg = load_recipe_dict({"model": {"path": "/ckpt/policy"}, "train": {"seed": 3},
                            "rollout": {"temperature": 0.7, "max_response_tokens": 12288},
                            "engine": {"tensor_parallel_size": 1, "colocate": True, "weight_transfer": "chunked",
                                       "gpu_memory_utilization": 0.6}})
    host = RolloutHostPlan(node_index=1, num_nodes=2, is_host=True,   # node 1 of 2, seen alone
                           engines=(EngineSlot((0, 1), 2), EngineSlot((2, 3), 2)), tp_size=2)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda", 0))
    released = []
    # every rank's role, as the gloo all-gather would give it on 2 nodes of 1 rank each
    monkeypatch.setattr(rl_dist, "all_gather_objects", lambda mine: [(0, True), mine])
    side = start_rollout_side(cfg, host, info, model=torch.nn.Linear(2, 2), weights="/ckpt/policy", version=4,
                              collaborators=Collaborators(make_engine=BuiltEngine.from_config,
                                                          make_tools=lambda c: NoTools(),
                                                          release=lambda: released.append(1)))
    try:
        a, b = side.fleet.engines
        for engine, gpus, seed in ((a, (0, 1), 3 + 2), (b, (2, 3), 3 + 3)):   # seed + global replica index
            args = engine.engine_args
            assert engine.kw["gpu_ids"] == gpus and args.tensor_parallel_size == 2   # the launch plan's TP wins
            assert args.seed == seed and args.dtype == "bfloat16" and args.enable_sleep_mode
            assert args.logprobs_mode == "processed_logprobs"                  # T = 0.7: what was sampled
            assert args.scheduling_policy == "fcfs" and args.max_model_len >= 12288
            # vLLM's defaults, which the memory plan counts: graphs and TP buffers stay through the sleep
            assert args.sleep_mode_offload_cudagraph is False and args.enable_nccl_comm_suspend is False
            assert engine.weights_version == 4
        assert side.fleet.pusher.cycle is not None and side.host_ranks == [0, 1] and released == [1]
        assert side.fleet.supervisor.why_not is None          # one rank, chunked: restarts allowed
    finally:
        side.loop.close()
