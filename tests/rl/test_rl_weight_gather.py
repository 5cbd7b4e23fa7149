"""The nccl path on a real FSDP2-sharded policy (torchrun, 2 ranks, gloo): each parameter is
all-gathered once per rank per update, whatever the number of replicas, and in bf16 (the local
shard is cast before the gather), and every replica receives the whole model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("rl_gather_worker.py")


@pytest.mark.slow
def test_each_parameter_is_gathered_once_in_bf16_for_three_replicas(tmp_path, free_port):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port}", str(WORKER), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    host, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for rank in (host, other):
        assert len(rank["gathers"]) == rank["params"]           # one gather per parameter, not one per replica
        assert set(rank["gathers"]) == {"torch.bfloat16"}       # cast before the gather: half the bytes
        assert rank["equal"]                                     # the gathered tensors are the weights
    assert host["group_bytes"] == [host["full_bf16_bytes"]] * 3
