"""rl/dist.py: object collectives and agreements go over the gloo group, tensors stay on the default group.

The process-group calls are replaced by recorders (the real ones need several processes); the
recorders' signatures are checked against torch's (tests/api_contracts.py).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from api_contracts import assert_same_signature

from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.preemption import PreemptionWatch

GLOO = object()       # stands for the group new_group(backend="gloo") returns


@pytest.fixture
def recorded(monkeypatch):
    """A 2-rank world on GPU (NCCL default group) whose collectives record the group they were given."""
    calls: list[tuple[str, object]] = []

    def all_gather_object(object_list, obj, group=None):
        calls.append(("all_gather_object", group))
        object_list[:] = [obj] * len(object_list)

    def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
        calls.append(("broadcast_object_list", group))

    def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                            group_src=None):
        calls.append(("scatter_object_list", group))
        scatter_object_output_list[0] = "mine"

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append(("all_reduce", group))

    fakes = dict(all_gather_object=all_gather_object, broadcast_object_list=broadcast_object_list,
                 scatter_object_list=scatter_object_list, all_reduce=all_reduce)
    for name, fake in fakes.items():
        assert_same_signature(fake, getattr(dist, name))
        monkeypatch.setattr(dist, name, fake)
    monkeypatch.setattr(rl_dist, "is_distributed", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(rl_dist, "_objects_group", GLOO)
    return calls


def test_object_collectives_and_agreements_use_the_gloo_group(recorded):
    rl_dist.all_gather_objects({"a": 1})
    rl_dist.broadcast_from_each("x", [0, 1])
    assert rl_dist.scatter_objects(["mine", "theirs"], src=0) == "mine"
    rl_dist.agree_max([1.0])
    assert PreemptionWatch(grace_s=60).agreed() is False
    assert recorded == [("all_gather_object", GLOO), ("broadcast_object_list", GLOO), ("broadcast_object_list", GLOO),
                        ("scatter_object_list", GLOO), ("all_reduce", GLOO), ("all_reduce", GLOO)]


def test_training_reductions_stay_on_the_default_group(recorded):
    rl_dist.all_reduce_sum([1.0], torch.device("cpu"))
    rl_dist.all_reduce_max([1.0], torch.device("cpu"))
    assert recorded == [("all_reduce", None), ("all_reduce", None)]


def test_an_nccl_default_group_without_the_gloo_group_is_refused(recorded, monkeypatch):
    monkeypatch.setattr(rl_dist, "_objects_group", None)
    with pytest.raises(RuntimeError, match="gloo group"):
        rl_dist.all_gather_objects(1)


def test_setup_distributed_creates_the_gloo_group_once_beside_nccl(monkeypatch):
    made: list[dict] = []
    state = {"init": False}

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name="", pg_options=None, device_id=None, _ranks=None):
        made.append({"default": backend})
        state["init"] = True

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
                  group_desc=None, device_id=None, sort_ranks=True):
        made.append({"new_group": backend})
        return GLOO

    for name, fake in (("init_process_group", init_process_group), ("new_group", new_group)):
        assert_same_signature(fake, getattr(dist, name))
        monkeypatch.setattr(dist, name, fake)
    monkeypatch.setattr(dist, "is_initialized", lambda: state["init"])
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(rl_dist, "_objects_group", None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    rl_dist.setup_distributed()
    rl_dist.setup_distributed()
    assert made == [{"default": "nccl"}, {"new_group": "gloo"}] and rl_dist.object_group() is GLOO
