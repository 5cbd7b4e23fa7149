"""Rendezvous ports are bound without a close-then-rebind window."""
from __future__ import annotations

import datetime
import errno
import socket

import pytest

from rstar2_cli.hosts.ports import master_store, reserve_port


def test_master_store_binds_its_own_port_and_serves_a_process_group():
    import torch
    import torch.distributed as dist

    store = master_store(world_size=1)
    assert 0 < store.port < 65536
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_reserved_port_refuses_plain_binds_but_lets_vllms_store_listen():
    from vllm.distributed.utils import StatelessProcessGroup

    with reserve_port() as reserved:
        intruder = socket.socket()
        with pytest.raises(OSError) as refused:
            intruder.bind(("127.0.0.1", reserved.port))
        intruder.close()
        assert refused.value.errno == errno.EADDRINUSE
        # what vLLM's NCCL weight-transfer rendezvous does on the trainer side (rank 0)
        group = StatelessProcessGroup.create(host="127.0.0.1", port=reserved.port, rank=0, world_size=1)
    group.store.set("after", "release")           # the store outlives the reservation
    assert group.store.get("after") == b"release"
