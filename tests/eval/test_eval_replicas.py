"""`rstar2 eval`, `eval all` and `prepare hard` start one vLLM replica per group of TP GPUs over every
GPU they see, TP the smallest whose replica fits one GPU (launch/eval_engines.py); the engine
arguments of an 8-GPU node are built here for a 14B and a 70B-sized model and checked against the
installed vLLM, and the report says how many replicas and which TP ran."""
from __future__ import annotations

import json

import pytest
from api_contracts import assert_call_binds, assert_fake_methods_match

from rstar2_cli.eval.settings import EvalSettings
from rstar2_cli.launch.eval_engines import plan_eval_engines, replica_gib
from rstar2_cli.launch.model_shape import QWEN3_14B, Qwen3Shape
from rstar2_cli.rollout.engine_args import default_max_model_len, planned_utilization
from rstar2_cli.rollout.engines import VLLMEngine
from rstar2_cli.rollout.generation import GenRequest, GenResult

H100_GIB, H200_GIB = 79.1, 139.8          # what torch reports for an "80 GB" H100 and a 141 GB H200
# Qwen2.5-72B's config.json: a 70B-sized model (72.7B parameters, 135 GiB in bf16)
QWEN25_72B = Qwen3Shape(hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, intermediate=29568,
                        vocab=152064, tie_embeddings=False)
EVAL_LEN = default_max_model_len(30000)   # eval's default context: 30K response tokens + the prompt's


def test_a_14b_model_on_an_8_gpu_h100_node_is_eight_tp1_replicas():
    plan = plan_eval_engines(QWEN3_14B, gpus=8, gpu_gib=H100_GIB, max_model_len=EVAL_LEN)
    assert plan.tensor_parallel_size == 1
    assert plan.gpu_groups == tuple((i,) for i in range(8))
    assert replica_gib(QWEN3_14B, 1, EVAL_LEN) <= planned_utilization(H100_GIB, 0.0) * H100_GIB
    assert "8 replicas" in plan.why and "TP 1" in plan.why


@pytest.mark.parametrize("gib,tp", [(H100_GIB, 4), (H200_GIB, 2)])
def test_a_70b_sized_model_takes_the_smallest_tp_that_fits(gib, tp):
    plan = plan_eval_engines(QWEN25_72B, gpus=8, gpu_gib=gib, max_model_len=EVAL_LEN)
    assert plan.tensor_parallel_size == tp
    assert plan.gpu_groups == tuple(tuple(range(i, i + tp)) for i in range(0, 8, tp))
    engine_gib = planned_utilization(gib, 0.0) * gib
    assert replica_gib(QWEN25_72B, tp, EVAL_LEN) <= engine_gib < replica_gib(QWEN25_72B, tp // 2, EVAL_LEN)


def test_tp_can_be_set_and_bad_values_are_one_line():
    plan = plan_eval_engines(QWEN3_14B, gpus=8, gpu_gib=H100_GIB, max_model_len=EVAL_LEN, tp=2)
    assert plan.gpu_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    twenty_heads = Qwen3Shape(**{**vars(QWEN3_14B), "heads": 20, "head_dim": 256})
    for tp, gpus, shape, said in ((3, 8, QWEN3_14B, "--tp 3 does not divide the 8 GPUs"),
                                  (16, 8, QWEN3_14B, "--tp 16: more than the 8 GPUs"),
                                  (8, 8, twenty_heads, "--tp 8 does not divide the model's 20 attention heads")):
        with pytest.raises(ValueError, match="^" + said) as e:
            plan_eval_engines(shape, gpus=gpus, gpu_gib=H100_GIB, max_model_len=EVAL_LEN, tp=tp)
        assert "\n" not in str(e.value)


def test_a_model_no_gpu_group_holds_is_refused_naming_the_sizes():
    with pytest.raises(ValueError, match=r"does not fit 2 GPUs of 79.1 GiB: a replica of TP 2 needs") as e:
        plan_eval_engines(QWEN25_72B, gpus=2, gpu_gib=H100_GIB, max_model_len=EVAL_LEN)
    assert "\n" not in str(e.value)


def test_without_a_gpu_one_replica_runs_on_the_default_device():
    plan = plan_eval_engines(QWEN3_14B, gpus=0, gpu_gib=None, max_model_len=EVAL_LEN)
    assert plan.tensor_parallel_size == 1 and plan.gpu_groups == ()
    assert plan.settings() == {"tensor_parallel_size": 1, "gpu_groups": None}


class BuiltEngine(VLLMEngine):
    """A replica recorded instead of started (tests/rollout/test_request_seeds.py)."""

    def __init__(self, engine_args, **kw):
        self.engine_args, self.kw = engine_args, kw
        self.seed_requests, self.max_model_len = kw["seed_requests"], engine_args.max_model_len


@pytest.mark.parametrize("shape,gib,tp", [(QWEN3_14B, H100_GIB, 1), (QWEN25_72B, H100_GIB, 4),
                                          (QWEN25_72B, H200_GIB, 2)])
def test_the_engine_arguments_of_an_8_gpu_node(monkeypatch, shape, gib, tp):
    import torch
    from vllm.engine.arg_utils import AsyncEngineArgs

    from rstar2_cli.eval.runner import make_engines
    from rstar2_cli.rollout import engine_args, engines

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engine_args, "local_gpu_memory", lambda: (gib, "GPU"))
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(engines, "VLLMEngine", BuiltEngine)
    plan = plan_eval_engines(shape, gpus=8, gpu_gib=gib, max_model_len=EVAL_LEN)
    s = EvalSettings(benchmark="aime24", model="/ckpt/policy", seed=5, **plan.settings())
    built = make_engines(s)

    assert len(built) == 8 // tp
    assert [e.kw["gpu_ids"] for e in built] == [tuple(range(i, i + tp)) for i in range(0, 8, tp)]
    for i, e in enumerate(built):
        args = e.engine_args
        assert type(args) is AsyncEngineArgs          # the real class took every keyword
        assert_call_binds(VLLMEngine.__init__, args, **e.kw)
        assert args.tensor_parallel_size == tp and args.model == "/ckpt/policy"
        assert args.seed == 5 + i                     # one engine seed per replica: unseeded requests differ
        assert args.dtype == "bfloat16" and args.max_model_len == EVAL_LEN
        assert args.enable_sleep_mode is False        # alone on its GPUs
        assert args.gpu_memory_utilization == planned_utilization(gib, 0.0)
        assert args.enforce_eager is False            # CUDA graphs
        assert e.kw["seed_requests"] is False         # vLLM's batched sampler
        assert e._sampling_params(GenRequest([1] * 8, max_tokens=16, seed=9)).seed is None


class AnswerBySeed:
    """A replica whose answer depends on the request's seed only (a seeded sample on fixed weights)."""

    def __init__(self, tokenizer, tp_size: int = 1, gpu_ids=None):
        self.tokenizer, self.tp_size, self.gpu_ids = tokenizer, tp_size, gpu_ids
        self.kv_capacity_tokens = 10_000
        self.requests = 0

    async def generate(self, req: GenRequest) -> GenResult:
        import asyncio

        self.requests += 1
        await asyncio.sleep(0)
        ids = self.tokenizer.encode(f"So \\boxed{{{req.seed % 3}}}.", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return GenResult(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop",
                         stop_token_id=self.tokenizer.eos_token_id)

    def kv_free_fraction(self) -> float:
        return 1.0


def test_the_fake_has_the_engine_api():
    assert_fake_methods_match(AnswerBySeed, VLLMEngine, ["generate", "kv_free_fraction"])


def test_the_report_says_how_many_replicas_and_which_tp(tiny_model, tmp_path):
    from rich.console import Console
    from transformers import AutoTokenizer

    from rstar2_cli.eval.paper_table import MD_FILE, run_table
    from rstar2_cli.eval.runner import RESULTS_FILE, run_eval

    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"{i}+1?", "answer": str((i + 1) % 3)}) + "\n"
                            for i in range(4)))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    pair = [AnswerBySeed(tok, 2, (0, 1)), AnswerBySeed(tok, 2, (2, 3))]
    console = Console(record=True, width=120)

    def run_one(bench, model, out):
        s = EvalSettings(benchmark="custom", data=str(data), model=str(tiny_model), out_dir=str(out), samples=2,
                         max_turns=1, progress=False)
        return run_eval(s, engine=pair, tools=object(), console=console)

    run_table(run_one, str(tiny_model), tmp_path / "table", ["custom"], with_left_out=False)
    saved = json.loads((tmp_path / "table" / "A" / "custom" / RESULTS_FILE).read_text())
    assert saved["engines"] == {"replicas": 2, "tensor_parallel_size": 2, "gpu_ids": [[0, 1], [2, 3]]}
    assert all(e.requests for e in pair)
    assert "engines: 2 replicas x TP 2 (GPUs 0,1 | 2,3)" in console.export_text()
    assert "engines: 2 replicas x TP 2 (GPUs 0,1 | 2,3)" in (tmp_path / "table" / MD_FILE).read_text()


def test_settings_refuse_groups_that_do_not_match_the_tp():
    with pytest.raises(ValueError, match=r"gpu_groups: \[0\] has 1 GPU id, not tensor_parallel_size=2"):
        EvalSettings(benchmark="aime24", model="m", tensor_parallel_size=2, gpu_groups=[[0], [1, 2]])
    with pytest.raises(ValueError, match=r"gpu_groups: GPU 1 appears twice"):
        EvalSettings(benchmark="aime24", model="m", gpu_groups=[[0], [1], [1]])


@pytest.fixture
def eight_gpus(monkeypatch):
    """This process "sees" 8 H100s (launch/eval_engines.local_gpus), and run_eval records the
    settings it is given instead of starting engines."""
    from rstar2_cli.eval import runner
    from rstar2_cli.launch import eval_engines

    seen: list[EvalSettings] = []

    def recorded(s, engine=None, **_):
        seen.append(s)
        return {"engines": runner.engines_summary(s, engine), "per_problem": [],
                "metrics": {"problems": 0, "samples_per_problem": s.samples, f"avg@{s.samples}": 0.0,
                            f"avg@{s.samples}_std": 0.0, "response_tokens": {"mean": 0.0}, "tool_call_rate": 0.0}}

    monkeypatch.setattr(eval_engines, "local_gpus", lambda: (8, H100_GIB))
    monkeypatch.setattr(runner, "run_eval", recorded)
    monkeypatch.setattr(runner.EngineReuse, "get", lambda self, s: None)
    return seen


def _cli(*args):
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("extra,groups", [([], [[i] for i in range(8)]),
                                          (["--tp", "2"], [[0, 1], [2, 3], [4, 5], [6, 7]])])
def test_eval_and_eval_all_place_a_replica_per_group_of_visible_gpus(eight_gpus, tiny_model, data_dir, tmp_path,
                                                                     extra, groups):
    res = _cli("eval", "aime24", tiny_model, "--data-dir", data_dir, "--out", tmp_path / "one", *extra)
    assert res.exit_code == 0, res.output
    res = _cli("eval", "all", tiny_model, "--data-dir", data_dir, "--out", tmp_path / "all", *extra)
    assert res.exit_code == 0, res.output
    assert len(eight_gpus) > 2 and all(s.gpu_groups == groups for s in eight_gpus)
    assert all(s.tensor_parallel_size == len(groups[0]) for s in eight_gpus)


def test_prepare_hard_places_a_replica_per_group_of_visible_gpus(eight_gpus, tiny_model, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"id": "a", "problem": "2+2?", "answer": "4"}) + "\n")
    res = _cli("prepare", "hard", "--policy", tiny_model, "--recipe", "stage2", "--data", data, "--out",
               tmp_path / "hard.jsonl")
    assert res.exit_code == 0, res.output
    assert eight_gpus[0].gpu_groups == [[i] for i in range(8)]
    assert "engines: 8 replicas x TP 1" in res.output
    res = _cli("prepare", "hard", "--policy", tiny_model, "--recipe", "stage2", "--data", data, "--out",
               tmp_path / "hard.jsonl", "--tp", "3")
    assert res.exit_code == 2
    assert "error: --policy" in res.output and "--tp 3 does not divide the 8 GPUs" in res.output


def test_eval_tp_with_a_served_model_is_refused(tiny_model):
    res = _cli("eval", "aime24", "served", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1",
               "--tokenizer", tiny_model, "--tp", "2")
    assert res.exit_code == 2 and "--tp 2: only with --engine vllm" in res.output


def test_seed_requests_from_the_command_line(eight_gpus, tiny_model, data_dir, tmp_path):
    res = _cli("eval", "aime24", tiny_model, "--data-dir", data_dir, "--out", tmp_path, "--seed-requests", "true")
    assert res.exit_code == 0, res.output
    assert eight_gpus[0].seed_requests is True


def test_a_bad_seed_requests_value_is_one_line(tiny_model, data_dir):
    res = _cli("eval", "aime24", tiny_model, "--data-dir", data_dir, "--seed-requests", "maybe")
    assert res.exit_code == 2
    assert "error: eval: seed_requests: Input should be 'auto', True or False (got 'maybe')" in res.output
