"""rl/ranks/dist.py: object collectives and agreements go over the gloo group, tensors stay on the default group.

The process-group calls are replaced by recorders (the real ones need several processes); the
recorders' signatures are checked against torch's (tests/api_contracts.py). The heartbeats' store is
checked on two real gloo ranks.
"""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from api_contracts import assert_same_signature

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.preemption import PreemptionWatch

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
    monkeypatch.setattr(rl_dist, "_liveness", None)
    monkeypatch.setattr(rl_dist, "start_liveness", lambda rank: made.append({"liveness": rank}) or "beating")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")   # one node of two ranks, whatever an earlier test left
    for name in ("RANK", "GROUP_RANK", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    rl_dist.setup_distributed()
    rl_dist.setup_distributed()
    # the heartbeat keys are written before new_group, a collective: after it, every rank's exist
    assert made == [{"default": "nccl"}, {"liveness": 1}, {"new_group": "gloo"}] and rl_dist.object_group() is GLOO


# A rank of a real 2-rank gloo group: `start_liveness` finds the group's store through the installed
# torch and uses it as `Liveness` does (set, add, clone, set_timeout, multi_get); rank 0 sees rank 1's
# ready mark there.
HEARTBEAT_RANK = """
import datetime, sys, torch.distributed as dist
from rstar2_cli.rl.ranks import dist as rl_dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
live = rl_dist.start_liveness(rank)
if rank == 1:
    live.ready(1)
else:
    live.wait([0, 1], 1, "collective 1")
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "ok")
"""


def test_a_rank_sees_anothers_ready_mark_in_the_default_groups_store():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, "-c", HEARTBEAT_RANK, str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    for r, (p, (out, err)) in enumerate(zip(ranks, outs)):
        assert p.returncode == 0 and f"rank {r} ok" in out, err[-2000:]


TWO_NODES = {"WORLD_SIZE": "16", "RANK": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
             "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "head"}


def resolver(table):
    def resolve(name):
        if name not in table:
            raise socket.gaierror(-2, "Name or service not known")
        return table[name]
    return resolve


@pytest.mark.parametrize("address", ["127.0.1.1", "::1", None])
def test_several_nodes_with_a_hostname_on_loopback_are_refused_in_one_line(address):
    table = {"head": "10.0.0.1", **({"node1": address} if address else {})}
    with pytest.raises(rl_dist.NodeAddressError) as e:
        rl_dist.check_node_address(TWO_NODES, resolver(table), hostname="node1")
    msg = str(e.value)
    assert "\n" not in msg and "GLOO_SOCKET_IFNAME" in msg and "NCCL_SOCKET_IFNAME" in msg and "'node1'" in msg


@pytest.mark.parametrize("env, table", [
    ({**TWO_NODES, "GLOO_SOCKET_IFNAME": "eth0"}, {"head": "10.0.0.1", "node1": "127.0.1.1"}),   # the user chose
    (TWO_NODES, {"head": "10.0.0.1", "node1": "10.0.0.2"}),                                      # a real address
    ({**TWO_NODES, "GROUP_WORLD_SIZE": "1", "GROUP_RANK": "0"}, {"node1": "127.0.1.1"}),          # one node
    ({**TWO_NODES, "MASTER_ADDR": "127.0.0.1"}, {"127.0.0.1": "127.0.0.1", "node1": "127.0.1.1"}),  # one machine
])
def test_a_reachable_address_one_node_or_one_machine_pass(env, table):
    rl_dist.check_node_address(env, resolver(table), hostname="node1")


def test_setup_distributed_checks_the_address_before_joining(monkeypatch):
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: joined.append(1))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in TWO_NODES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    with pytest.raises(rl_dist.NodeAddressError, match="GLOO_SOCKET_IFNAME"):
        rl_dist.setup_distributed(resolve=resolver({"head": "10.0.0.1", "node1": "127.0.1.1"}))
    assert joined == []
