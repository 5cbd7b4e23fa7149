"""`train.micro_batch_tokens: auto` and a plan that refuses: `rstar2 rl` sizes the micro-batch for
the card it plans for, the paper's stages fit one node and 64 GPUs of H100, H200 and MI300X with no
`--set`, and a plan that does not fit exits 2 with one line naming the one change."""
from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import RELEASE_MICRO_BATCH_TOKENS
from rstar2_cli.launch import engine_sizing as es
from rstar2_cli.launch import gpu_card
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.topology import plan_from_args
from rstar2_cli.rl.run.stages import resolve_stage_recipe

runner = CliRunner()


def rl(*args: str):
    return runner.invoke(app, ["rl", *args], terminal_width=250, env={"COLUMNS": "250"})


def printed_micro_batch(output: str) -> int:
    """train.micro_batch_tokens as the dry run's resolved recipe prints it."""
    return int(re.search(r"\n  micro_batch_tokens: (\S+)\s*\n", output).group(1))


@pytest.mark.parametrize("gpus", [8, 64])
@pytest.mark.parametrize("memory", ["79.1", "h100", "h200", "mi300x"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_fits_as_pasted(stage, memory, gpus):
    out = rl("--stage", str(stage), "--gpus", str(gpus), "--dry-run", "--gpu-memory", memory)
    assert out.exit_code == 0, out.output
    assert "fits: at most" in out.output and "does not fit" not in out.output
    # the release's per-GPU token budget fits every one of these cards
    assert printed_micro_batch(out.output) == 20480
    assert "train.micro_batch_tokens auto: 20480" in out.output


def sized_stage2(gpu_gib: float, *overrides: str, gpus: int = 8):
    cfg = resolve_stage_recipe(None, 2, list(overrides), on_gpu=True)
    plan = plan_from_args(gpus, max(1, gpus // 8), tp_size=2, master_addr="n1")
    cfg = es.size_micro_batch(es.size_engines(cfg, plan, gpu_gib), plan, gpu_gib)
    return cfg, plan


def test_auto_is_the_largest_multiple_of_1024_that_fits_at_most_the_releases_budget():
    cfg, plan = sized_stage2(66.0)
    tokens = cfg.train.micro_batch_tokens
    assert tokens == 14336
    spec = es.memory_spec_for(cfg, plan, 66.0, "custom")
    assert mp.build_memory_plan(spec).fits
    assert not mp.build_memory_plan(dataclasses.replace(spec, micro_batch_tokens=tokens + 1024)).fits
    assert sized_stage2(191.6)[0].train.micro_batch_tokens == RELEASE_MICRO_BATCH_TOKENS == 20480
    assert sized_stage2(191.6, gpus=64)[0].train.micro_batch_tokens == 20480
    # a number in the recipe is used as given; and nothing fits a card below the longest trajectory's update
    assert sized_stage2(66.0, "train.micro_batch_tokens=4096")[0].train.micro_batch_tokens == 4096
    none_fits, plan = sized_stage2(40.0)
    assert none_fits.train.micro_batch_tokens == 1024
    assert not mp.build_memory_plan(es.memory_spec_for(none_fits, plan, 40.0, "custom")).fits


def test_a_plan_that_does_not_fit_prints_its_table_then_exits_2_with_one_line():
    # 60 GiB: the engines fit beside the trainer's state, the update does not at any micro-batch size
    out = rl("--stage", "2", "--gpus", "8", "--dry-run", "--gpu-memory", "60")
    assert out.exit_code == 2
    assert "memory per GPU (GiB): 60 GiB GPU (custom)" in out.stdout and "headroom" in out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: memory: does not fit: the update phase")
    assert out.stderr.rstrip().endswith("more GPUs (trainer ranks shard the fp32 state) or a shorter "
                                        "rollout.max_response_tokens")
    assert "train.micro_batch_tokens auto: no size fits the update on this GPU (planned at 1024)" in out.stdout
    out = rl("--stage", "2", "--gpus", "8", "--dry-run", "--gpu-memory", "h100",
             "--set", "train.micro_batch_tokens=65536")
    assert out.exit_code == 2 and out.stderr.count("\n") == 1
    assert "does not fit: the update phase needs 113.6 GiB of 79.1 GiB per GPU" in out.stderr
    assert out.stderr.rstrip().endswith("set train.micro_batch_tokens=28672 (or more GPUs)")


def test_a_launch_that_does_not_fit_refuses_before_anything_starts(tmp_path, monkeypatch):
    from rstar2_cli.commands import checks
    from rstar2_cli.rl.run import launch_entry

    started = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checks, "rl_recipe", lambda cfg: None)            # the recipe's paths are not here
    monkeypatch.setattr(launch_entry, "launch", lambda plan, cfg, **kw: started.append(cfg) or 0)
    out = rl("--stage", "2", "--gpus", "8", "--gpu-memory", "60")
    assert out.exit_code == 2 and not started
    assert out.stderr.startswith("error: memory: does not fit") and out.stderr.count("\n") == 1
    assert "warning" not in out.output and not (tmp_path / "runs/stage2/resolved_recipe.yaml").exists()
    # a plan that fits starts, and every trainer reads the sized number, never "auto"
    out = rl("--stage", "2", "--gpus", "8", "--gpu-memory", "h100")
    assert out.exit_code == 0, out.output
    assert started[0].train.micro_batch_tokens == 20480
    written = yaml.safe_load((tmp_path / "runs/stage2/resolved_recipe.yaml").read_text())
    assert written["train"]["micro_batch_tokens"] == 20480


def test_without_a_gpu_the_plan_says_which_card_it_assumed(monkeypatch):
    monkeypatch.setattr(gpu_card, "local_gpu_memory", lambda: None)
    out = rl("--stage", "2", "--gpus", "8", "--dry-run")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert ("memory: no GPU is visible here and no --gpu-memory was given: planned for an MI300X (191.6 GiB); "
            "plan for yours with --gpu-memory h100|h200|mi300x|GiB") in text
    assert "planned for an" not in " ".join(rl("--stage", "2", "--gpus", "8", "--dry-run", "--gpu-memory",
                                               "h100").output.split())


def test_a_visible_gpu_sizes_the_micro_batch_from_its_real_memory(monkeypatch):
    monkeypatch.setattr(gpu_card, "local_gpu_memory", lambda: (66.04, "Some GPU 66GB"))
    out = rl("--stage", "2", "--gpus", "8", "--dry-run")
    assert out.exit_code == 0, out.output
    assert "memory per GPU (GiB): 66 GiB GPU (Some GPU 66GB)" in out.output
    assert printed_micro_batch(out.output) == 14336


def test_on_cpu_auto_is_a_fixed_number():
    from rstar2_cli.config import CPU_MICRO_BATCH_TOKENS

    out = rl("--stage", "2", "--dry-run")
    assert out.exit_code == 0, out.output
    assert printed_micro_batch(out.output) == CPU_MICRO_BATCH_TOKENS and "memory per GPU" not in out.output
