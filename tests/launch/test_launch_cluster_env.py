"""`--gpus K` without `--nodes` plans nodes from --gpus-per-node; SLURM's environment gives the
defaults for nodes, node rank and the head address; flags still win."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rstar2_cli.launch import cluster_env
from rstar2_cli.launch.cluster_env import first_host, resolve_launch
from rstar2_cli.launch.topology import PlanError

SLURM = {"SLURM_JOB_NUM_NODES": "8", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "gpu[003-010]"}


@pytest.fixture(autouse=True)
def _no_scontrol(monkeypatch):
    monkeypatch.setattr(cluster_env.shutil, "which", lambda name: None)   # parse the list ourselves


def test_gpus_per_node_defaults_to_visible_gpus_else_eight():
    assert resolve_launch(64, master_addr="h", env={}, visible_gpus=0).nodes == 8
    assert resolve_launch(64, master_addr="h", env={}, visible_gpus=4).nodes == 16
    sizes = resolve_launch(64, gpus_per_node=16, master_addr="h", env={}, visible_gpus=8)
    assert (sizes.nodes, sizes.gpus_per_node) == (4, 16)
    assert resolve_launch(4, env={}, visible_gpus=8).nodes == 1          # fewer than a node: one node


def test_indivisible_gpu_count_fails_in_one_line():
    with pytest.raises(PlanError, match=r"^gpus=60 is not divisible by gpus_per_node=8: give --nodes") as e:
        resolve_launch(60, env={}, visible_gpus=0)
    assert "\n" not in str(e.value)
    with pytest.raises(PlanError, match="gpus=64 plans 8 nodes x 8 GPUs: give --master-addr"):
        resolve_launch(64, env={}, visible_gpus=0)
    sizes = resolve_launch(64, env={}, visible_gpus=0, allow_placeholder_head=True)   # a dry run
    assert (sizes.nodes, sizes.master_addr, sizes.head_is_placeholder) == (8, "HEAD_NODE", True)
    with pytest.raises(PlanError, match="not divisible by SLURM_JOB_NUM_NODES=3"):
        resolve_launch(64, env={"SLURM_JOB_NUM_NODES": "3"})


def test_slurm_environment_gives_the_defaults():
    sizes = resolve_launch(64, env=SLURM, visible_gpus=0)
    assert (sizes.nodes, sizes.node_rank, sizes.master_addr, sizes.source) == (8, 3, "gpu003", "SLURM")


def test_flags_win_over_slurm():
    sizes = resolve_launch(64, nodes=4, node_rank=1, master_addr="head", env=SLURM)
    assert (sizes.nodes, sizes.node_rank, sizes.master_addr) == (4, 1, "head")
    with pytest.raises(PlanError, match="node_rank=9: must be in 0..7"):
        resolve_launch(64, node_rank=9, env=SLURM)


def test_cpu_run_ignores_the_allocation():
    assert resolve_launch(0, env=SLURM).nodes == 1


@pytest.mark.parametrize("nodelist, host", [
    ("gpu[003-010,12],cpu1", "gpu003"), ("n1,n2", "n1"), ("node7", "node7"),
    ("rack[1-2]-n[07-08]", "rack1-n07"), ("a[5,1-3]", "a5"),
])
def test_first_host_of_a_compressed_nodelist(nodelist, host):
    assert first_host(nodelist) == host


def test_scontrol_is_used_when_installed(monkeypatch):
    monkeypatch.setattr(cluster_env.shutil, "which", lambda name: "/usr/bin/scontrol")

    class Done:
        returncode, stdout = 0, "hostA\nhostB\n"

    calls = []
    monkeypatch.setattr(cluster_env.subprocess, "run", lambda argv, **kw: calls.append(argv) or Done())
    assert first_host("host[A-B]") == "hostA"
    assert calls == [["/usr/bin/scontrol", "show", "hostnames", "host[A-B]"]]


def test_dry_run_plans_nodes_and_shows_the_weight_sync(monkeypatch):
    from rstar2_cli.cli import app

    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    result = CliRunner().invoke(app, ["rl", "--stage", "2", "--gpus", "64", "--dry-run"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "64 GPUs = 8 node(s) x 8" in result.output
    assert "ipc: vLLM weight transfer" in result.output
    assert "--rdzv-endpoint gpu003:29500" in result.output
    override = CliRunner().invoke(app, ["rl", "--stage", "2", "--gpus", "64", "--dry-run", "--set",
                                        "engine.weight_transfer=chunked"], env={"COLUMNS": "250"})
    assert "chunked: safetensors chunks" in override.output and "(engine.weight_transfer)" in override.output
    bad = CliRunner().invoke(app, ["rl", "--stage", "2", "--gpus", "64", "--dry-run", "--set",
                                   "engine.weight_transfer=nccl"], env={"COLUMNS": "250"})
    assert bad.exit_code != 0 and "needs engine.colocate=false" in bad.output


def test_known_node_rank_starts_that_nodes_torchrun_with_its_engine_env(monkeypatch):
    from rich.console import Console

    from rstar2_cli.launch.topology import ENGINE_GPUS_ENV, plan_from_args
    from rstar2_cli.rl.run import launch_entry

    plan = plan_from_args(16, 2, master_addr="h", tp_size=2, recipe_args=["--config", "r.yaml"])
    calls = []
    monkeypatch.setattr(launch_entry, "call_forwarding_signals",
                        lambda argv, env, own_session: calls.append((argv, env)) or 0)
    assert launch_entry.launch(plan, None, resume=False, console=Console(quiet=True), node_rank=1) == 0
    (argv, env), = calls
    assert argv == list(plan.nodes[1].launch) and "--node-rank" in argv and argv[argv.index("--node-rank") + 1] == "1"
    assert env[ENGINE_GPUS_ENV] == "0,1,2,3,4,5,6,7"
    calls.clear()
    launch_entry.launch(plan, None, resume=False, console=Console(quiet=True))   # no rank: print, start nothing
    assert calls == []


@pytest.mark.parametrize("code, says", [(1, True), (75, False), (0, False)])
def test_a_node_whose_trainers_fail_says_so_in_one_line_naming_it(monkeypatch, capsys, code, says):
    from rich.console import Console

    from rstar2_cli.launch.topology import plan_from_args
    from rstar2_cli.rl.run import launch_entry

    plan = plan_from_args(16, 2, master_addr="h", recipe_args=["--config", "r.yaml"])
    monkeypatch.setattr(launch_entry, "call_forwarding_signals", lambda argv, env, own_session: code)
    monkeypatch.setenv("SLURMD_NODENAME", "gpu007")
    assert launch_entry.launch(plan, None, resume=False, console=Console(quiet=True), node_rank=1) == code
    err = capsys.readouterr().err.splitlines()
    assert err == (["error: node 1 (gpu007): its trainers failed, torchrun exit code 1 (its report above names "
                    "the rank); the other nodes stop with it"] if says else [])
