"""The CLI surface: help is fast and lists every command; `rl --dry-run` shows config and plan."""
from __future__ import annotations

import os
import subprocess
import sys

from pathlib import Path

from typer.testing import CliRunner

from rstar2_cli.cli import app

REPO = Path(__file__).resolve().parents[2]

runner = CliRunner()


def test_help_lists_every_command():
    out = runner.invoke(app, ["--help"])
    assert out.exit_code == 0
    for cmd in ("quickstart", "prepare", "sft", "rl", "eval", "serve-sandbox", "bench-tools"):
        assert cmd in out.output, cmd


def test_help_does_not_import_torch_or_vllm():
    code = "import sys; from rstar2_cli.cli import app; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_help_imports_none_of_what_the_commands_import_lazily():
    """What the command modules import inside their functions (`# lazy:` in rstar2_cli/commands/)
    stays out of `rstar2 --help`."""
    heavy = ("torch", "transformers", "vllm", "pydantic", "yaml", "fastapi", "redis", "httpx", "numpy")
    code = f"import sys; from rstar2_cli.cli import app; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_rl_dry_run_multi_node():
    out = runner.invoke(app, ["rl", "--stage", "2", "--gpus", "64", "--nodes", "8", "--master-addr", "head0",
                              "--dry-run"], terminal_width=200)
    assert out.exit_code == 0, out.output
    text = out.output
    assert "max_response_tokens: 12288" in text and "path: runs/stage1/final" in text
    assert "--nnodes 8" in text and "--node-rank 7" in text and "head0:29500" in text
    assert "serve-sandbox --worker --redis redis://head0:6379/0" in text


def test_rl_dry_run_says_its_node_commands_need_the_recipe_rl_writes(tmp_path):
    """The torchrun lines read resolved_recipe.yaml; a dry run writes none, so it names the command
    that does (the same one, without --dry-run), in a fresh process as a user runs it."""
    out = subprocess.run([sys.executable, "-m", "rstar2_cli.cli", "rl", "--stage", "2", "--gpus", "16",
                          "--master-addr", "head0", "--dry-run"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("the commands below read runs/stage2/resolved_recipe.yaml, which this dry run does not write: "
            "`rstar2 rl --stage 2 --gpus 16 --master-addr head0` writes it") in out.stdout
    assert not (tmp_path / "runs").exists()


def test_rl_dry_run_multi_node_without_a_head_names_a_placeholder(monkeypatch):
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    out = runner.invoke(app, ["rl", "--stage", "2", "--gpus", "64", "--dry-run"], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert "--rdzv-endpoint HEAD_NODE:29500" in out.output
    assert "HEAD_NODE is a placeholder" in out.output and "give --master-addr" in out.output
    # a real launch still needs the head named
    out = runner.invoke(app, ["rl", "--stage", "2", "--gpus", "64"])
    assert out.exit_code == 2 and "give --master-addr" in out.output


def test_rl_dry_run_single_cpu_launches_directly():
    out = runner.invoke(app, ["rl", "--stage", "1", "--set", "train.prompts_per_step=4", "--dry-run"],
                        terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "launch directly" in out.output and "prompts_per_step: 4" in out.output


def test_rl_bad_sizes_and_bad_config_fail_early():
    out = runner.invoke(app, ["rl", "--stage", "1", "--gpus", "12", "--nodes", "8", "--master-addr", "h", "--dry-run"])
    assert out.exit_code == 2 and "not divisible by nodes" in out.output
    out = runner.invoke(app, ["rl", "--stage", "1", "--set", "optim.lrr=1", "--dry-run"])
    assert out.exit_code == 2 and "optim.lrr: unknown field" in out.output


def test_rl_dry_run_asynchronous_says_where_it_overlaps_and_refuses_colocation():
    k1 = ["--set", "train.max_staleness=1", "--set", "loss.tis=true", "--dry-run"]
    out = runner.invoke(app, ["rl", "--stage", "1", "--gpus", "8", *k1], terminal_width=200)
    assert out.exit_code == 2 and "engine.colocate: true" in out.output and "--engine-gpus" in out.output
    out = runner.invoke(app, ["rl", "--stage", "1", "--gpus", "8", "--engine-gpus", "6",
                              "--set", "engine.colocate=false", *k1], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "up to 1 step(s) ahead" in out.output and "their own GPUs" in out.output
    out = runner.invoke(app, ["rl", "--stage", "1", "--set", "train.max_staleness=1", "--dry-run"])
    assert out.exit_code == 2 and "needs an off-policy correction: loss.tis: true" in out.output
